"""Trace capture: the calls of each external episode become trajectories once the client reports its rewards.

Every served call of an episode is recorded with the exact prompt and generated token ids and the behaviour
log-probabilities the engine produced (nothing is re-tokenised). Consecutive calls of one agent whose token
prefix extends the previous call's prompt and response, sampled by the same policy version, become one
multi-turn turn: the tokens between the two responses (tool output, the other agents' messages, the chat
template's markup) are in its response with mask 0 and log-probability 0, so only generated tokens are trained.
Any other call starts a new turn.

Episodes end with :meth:`EpisodeTracker.finish` (rewards per agent and optionally per call) or are abandoned
(no call or report for ``episode_timeout_s``) or reported failed: those are dropped **with their whole group**
and counted, never trained as reward 0. When the client says how many episodes its group has
(``group_size``), finished episodes wait until the group is complete, so a group is released whole or not at
all; without it each finished episode is released at once.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from marti.errors import FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError
from marti.inference import Generation
from marti.trajectory import Trajectory, Turn

#: Reported episode ids and dead group ids remembered (oldest forgotten first).
REMEMBERED_IDS = 100_000


class _BoundedSet:
    """A set that forgets its oldest members beyond ``cap``."""

    def __init__(self, cap: int = REMEMBERED_IDS) -> None:
        self._items: OrderedDict[str, None] = OrderedDict()
        self.cap = cap

    def add(self, key: str) -> None:
        self._items[key] = None
        while len(self._items) > self.cap:
            self._items.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._items


@dataclass
class _AgentTrace:
    turns: list[Turn] = field(default_factory=list)
    calls: int = 0
    call_ids: list[list[str]] = field(default_factory=list)  # per turn, the calls merged into it


@dataclass
class _Episode:
    group_id: str
    last_seen: float
    agents: dict[str, _AgentTrace] = field(default_factory=dict)


@dataclass
class Released:
    """Episodes a report or sweep made final.

    Attributes:
        episodes: Each released episode as agent id -> trajectory (every trainable agent has one; an agent that
            made no call has one without turns), in completion order.
        dropped: Episodes dropped (abandoned, failed, or members of a group that lost one).
    """

    episodes: list[dict[str, Trajectory]] = field(default_factory=list)
    dropped: int = 0


class EpisodeTracker:
    """Open episodes' calls, group bookkeeping and the counters of what was dropped.

    Args:
        trainable: Agents whose trajectories are released (each released episode has one per agent).
        episode_timeout_s: Seconds of silence after which an open episode is abandoned.
        max_open_episodes: Most open episodes; a call that opens one more raises
            :class:`ResourceExhaustedError`.
        max_calls_per_episode: Most calls recorded per episode and agent (:class:`InvalidArgumentError` beyond).
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        trainable: list[str],
        *,
        episode_timeout_s: float,
        max_open_episodes: int,
        max_calls_per_episode: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.trainable = list(trainable)
        self.episode_timeout_s = episode_timeout_s
        self.max_open_episodes = max_open_episodes
        self.max_calls_per_episode = max_calls_per_episode
        self._clock = clock
        self._open: dict[str, _Episode] = {}
        self._held: dict[str, list[dict[str, Trajectory]]] = {}  # group -> finished members waiting
        self._group_size: dict[str, int] = {}
        self._dead_groups = _BoundedSet()  # groups that lost a member: later members are dropped too
        self._closed = _BoundedSet()  # episode ids already reported (a second report is refused)
        self.counters = {"calls": 0, "finished": 0, "released": 0, "abandoned": 0, "failed": 0, "dropped": 0}

    @property
    def open_episodes(self) -> int:
        """Episodes with calls and no report yet."""
        return len(self._open)

    def check_can_record(self, episode_id: str, agent: str) -> None:
        """Raise before a call is served if recording it would break a limit.

        Raises:
            FailedPreconditionError: The episode was already reported.
            ResourceExhaustedError: It would open more than ``max_open_episodes`` episodes.
            InvalidArgumentError: The agent already made ``max_calls_per_episode`` calls in it.
        """
        if episode_id in self._closed:
            raise FailedPreconditionError(
                f"episode {episode_id!r} was already reported; use a new episode id"
            )
        ep = self._open.get(episode_id)
        if ep is None:
            if len(self._open) >= self.max_open_episodes:
                raise ResourceExhaustedError(
                    f"{len(self._open)} episodes are open (gateway.max_open_episodes = "
                    f"{self.max_open_episodes}); report rewards for some before starting episode {episode_id!r}"
                )
            return
        trace = ep.agents.get(agent)
        if trace is not None and trace.calls >= self.max_calls_per_episode:
            raise InvalidArgumentError(
                f"agent {agent!r} made {trace.calls} calls in episode {episode_id!r}, the limit "
                f"(gateway.max_calls_per_episode) is {self.max_calls_per_episode}"
            )

    def record(self, episode_id: str, agent: str, call_id: str, gen: Generation, group_id: str = "") -> None:
        """Record one served call (after :meth:`check_can_record`; limits are checked again).

        Args:
            episode_id: The client's episode id.
            agent: The agent that served it.
            call_id: The id returned to the client (per-call rewards name it).
            gen: What the engine produced: exact prompt and response ids, log-probs, version.
            group_id: The client's group id, when it sent one with the call.
        """
        self.check_can_record(episode_id, agent)
        now = self._clock()
        ep = self._open.setdefault(episode_id, _Episode(group_id=group_id, last_seen=now))
        ep.last_seen = now
        if group_id and not ep.group_id:
            ep.group_id = group_id
        trace = ep.agents.setdefault(agent, _AgentTrace())
        trace.calls += 1
        self.counters["calls"] += 1
        prompt, resp = list(gen.prompt_token_ids), list(gen.response_token_ids)
        logps = list(gen.response_logprobs) or [0.0] * len(resp)
        last = trace.turns[-1] if trace.turns else None
        if last is not None and last.policy_version == gen.policy_version:
            seen = list(last.prompt_token_ids) + list(last.response_token_ids)
            if len(prompt) >= len(seen) and prompt[: len(seen)] == seen:
                gap = prompt[len(seen) :]
                last.response_token_ids.extend(gap + resp)
                last.response_logprobs.extend([0.0] * len(gap) + logps)
                last.response_mask.extend([0] * len(gap) + [1] * len(resp))
                last.response_text += gen.text
                trace.call_ids[-1].append(call_id)
                return
        trace.turns.append(
            Turn(
                step=len(trace.turns),
                prompt_token_ids=prompt,
                response_token_ids=resp,
                response_logprobs=logps,
                response_mask=[1] * len(resp),
                policy_version=gen.policy_version,
                response_text=gen.text,
                info={"finish_reason": gen.finish_reason},
            )
        )
        trace.call_ids.append([call_id])

    def finish(
        self,
        episode_id: str,
        rewards: dict[str, float],
        *,
        call_rewards: dict[str, float] | None = None,
        group_id: str = "",
        group_size: int = 0,
        failed: bool = False,
    ) -> Released:
        """End an episode with its rewards (or as failed) and release what became final.

        Args:
            episode_id: The episode.
            rewards: Per agent, its return for the episode (agents without an entry get the sum of their call
                rewards, or 0).
            call_rewards: Per call id, a reward for that call (its turn's reward; merged calls add up).
            group_id: The episode's group (the problem id); overrides one sent with the calls; empty = the
                episode is a group of its own.
            group_size: Episodes of the group; > 0 holds finished members until the group is complete.
            failed: The client reports the episode as failed: it is dropped with its group.

        Returns:
            The released episodes and the number dropped by this report.

        Raises:
            InvalidArgumentError: An agent in ``rewards`` that is not trained, a call id the episode did not
                make, a reward that is not a finite number, a negative ``group_size`` (a refused report changes
                nothing: the episode stays open).
            FailedPreconditionError: The episode was already reported.
        """
        if episode_id in self._closed:
            raise FailedPreconditionError(f"episode {episode_id!r} was already reported")
        unknown = sorted(set(rewards) - set(self.trainable))
        if unknown:
            raise InvalidArgumentError(
                f"rewards name agent {unknown[0]!r}, which is not a trained agent of this job "
                f"(trained: {self.trainable})"
            )
        if group_size < 0:
            raise InvalidArgumentError(f"group_size must be >= 0, got {group_size}")
        for where, values in (("rewards", rewards), ("call_rewards", call_rewards or {})):
            for key, value in values.items():
                if not isinstance(value, int | float) or not math.isfinite(value):
                    raise InvalidArgumentError(f"{where}[{key!r}] must be a finite number, got {value!r}")
        ep = self._open.get(episode_id) or _Episode(group_id="", last_seen=self._clock())
        known = {c for trace in ep.agents.values() for ids in trace.call_ids for c in ids}
        bad = sorted(set(call_rewards or {}) - known)
        if bad:  # checked before anything changes: a refused report leaves the episode open
            raise InvalidArgumentError(
                f"call reward names call {bad[0]!r}, which episode {episode_id!r} did not make"
            )
        self._open.pop(episode_id, None)
        self._closed.add(episode_id)
        group = group_id or ep.group_id or f"episode:{episode_id}"
        if failed:
            self.counters["failed"] += 1
            return self._kill_group(group, 1)
        self.counters["finished"] += 1
        trajs = self._trajectories(episode_id, ep, group, rewards, call_rewards or {}, group_size)
        if group in self._dead_groups:
            self.counters["dropped"] += 1
            return Released(dropped=1)
        if group_size > 0:
            self._group_size[group] = group_size
            held = self._held.setdefault(group, [])
            held.append(trajs)
            if len(held) < group_size:
                return Released()
            del self._held[group]
            self._group_size.pop(group, None)
            self.counters["released"] += len(held)
            return Released(episodes=held)
        self.counters["released"] += 1
        return Released(episodes=[trajs])

    def _trajectories(
        self,
        episode_id: str,
        ep: _Episode,
        group: str,
        rewards: dict[str, float],
        call_rewards: dict[str, float],
        group_size: int,
    ) -> dict[str, Trajectory]:
        out: dict[str, Trajectory] = {}
        for agent in self.trainable:
            trace = ep.agents.get(agent, _AgentTrace())
            for turn, ids in zip(trace.turns, trace.call_ids, strict=True):
                named = [call_rewards[c] for c in ids if c in call_rewards]
                turn.reward = sum(named) if named else None
            if trace.turns:
                trace.turns[-1].terminated = True
            traj = Trajectory(
                episode_id=episode_id,
                agent_id=agent,
                session="external",
                turns=trace.turns,
                group_id=group,
                metadata={"source": "gateway", "calls": trace.calls},
            )
            if agent in rewards:
                traj.episode_return = float(rewards[agent])
            elif not any(t.reward is not None for t in trace.turns):
                traj.episode_return = 0.0
            versions = [t.policy_version for t in trace.turns if t.policy_version is not None]
            traj.policy_version = min(versions) if versions else 0
            if group_size > 0:
                traj.metadata["group_size"] = group_size
            traj.validate()
            out[agent] = traj
        return out

    def _kill_group(self, group: str, dropped: int) -> Released:
        """Drop a group: its held members now, its later members when they report."""
        self._dead_groups.add(group)
        dropped += len(self._held.pop(group, []))
        self._group_size.pop(group, None)
        self.counters["dropped"] += dropped
        return Released(dropped=dropped)

    def sweep(self) -> Released:
        """Abandon every open episode silent for ``episode_timeout_s``; returns what was dropped."""
        now = self._clock()
        out = Released()
        for eid in [e for e, ep in self._open.items() if now - ep.last_seen >= self.episode_timeout_s]:
            ep = self._open.pop(eid)
            self._closed.add(eid)
            self.counters["abandoned"] += 1
            out.dropped += self._kill_group(ep.group_id or f"episode:{eid}", 1).dropped
        return out
