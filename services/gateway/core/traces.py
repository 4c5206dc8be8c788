"""Trace capture: the calls of each external episode become trajectories once the client reports its rewards.

Every served call of an episode is recorded with the exact prompt and generated token ids and the behaviour
log-probabilities the engine produced (nothing is re-tokenised). Consecutive calls of one agent whose token
prefix extends the previous call's prompt and response, sampled by the same policy version, become one
multi-turn turn: the tokens between the two responses (tool output, the other agents' messages, the chat
template's markup) are in its response with mask 0 and log-probability 0, so only generated tokens are trained.
Any other call starts a new turn.

Episodes end with :meth:`EpisodeTracker.finish` (rewards per agent and optionally per call) or are abandoned
(no call running and no call or report for ``episode_timeout_s``) or reported failed: those are dropped **with
their whole group** and counted, never trained as reward 0. A group that dies drops its finished members held
here at once and its members open at that moment when they report; episodes that start later with the same
group id form a new group. When the client says how many episodes its group has (``group_size``), finished
episodes wait until the group is complete, so a group is released whole or not at all (a group still incomplete
``episode_timeout_s`` after its last member finished expires and is dropped); without it each finished episode
is released at once.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from marti.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)
from marti.rewards.base import check_reward
from marti.types.inference import Generation
from marti.types.trajectory import Trajectory, Turn

#: Reported and abandoned episode ids remembered (oldest forgotten first).
REMEMBERED_IDS = 100_000


def _size_text(group_size: int) -> str:
    """``group_size 4``, or ``no group_size`` for 0 (a report that gave none)."""
    return f"group_size {group_size}" if group_size else "no group_size"


class _BoundedSet:
    """A set that forgets its least recently added members beyond ``cap``."""

    def __init__(self, cap: int = REMEMBERED_IDS) -> None:
        self._items: OrderedDict[str, None] = OrderedDict()
        self.cap = cap

    def add(self, key: str) -> None:
        """Remember ``key`` as the newest member (one already remembered becomes the newest again)."""
        self._items[key] = None
        self._items.move_to_end(key)
        while len(self._items) > self.cap:
            self._items.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._items


@dataclass
class _AgentTrace:
    turns: list[Turn] = field(default_factory=list)
    calls: int = 0
    pending: int = 0  # choices of this agent's running calls (reserved against max_calls_per_episode)
    call_ids: list[list[str]] = field(default_factory=list)  # per turn, the calls merged into it


@dataclass
class _Episode:
    group_id: str
    last_seen: float
    agents: dict[str, _AgentTrace] = field(default_factory=dict)
    running: int = 0  # calls between begin_call and end_call
    doomed: bool = False  # its group died while it was open: dropped when it reports
    # (group_size, episode id) of the first member of its group reported while it was open: it must give the same
    sibling_size: tuple[int, str] | None = None
    on_close: list[Callable[[], object]] = field(default_factory=list)  # run when it leaves the open set

    @property
    def calls(self) -> int:
        return sum(trace.calls for trace in self.agents.values())


@dataclass
class _HeldGroup:
    size: int  # the group_size the group was opened with
    members: list[dict[str, Trajectory]] = field(default_factory=list)
    last_finished: float = 0.0


@dataclass
class Released:
    """Episodes a report or sweep made final.

    Attributes:
        episodes: Each released episode as agent id -> trajectory (every trainable agent has one; an agent that
            made no call has one without turns), in completion order.
        dropped: Episodes dropped (abandoned, failed, members of a group that lost one, or of a group that
            expired incomplete).
    """

    episodes: list[dict[str, Trajectory]] = field(default_factory=list)
    dropped: int = 0


class EpisodeTracker:
    """Open episodes' calls, group bookkeeping and the counters of what was dropped.

    An episode is open from its first :meth:`begin_call` (or :meth:`record`) until its report or its abandonment.
    Counters: ``calls`` (recorded), ``finished`` (reported, not failed), ``abandoned``, ``failed``, ``dropped``
    (episodes never released), ``expired_groups`` (held groups dropped incomplete). Released episodes are counted
    by whoever stores them (:class:`~services.gateway.core.gateway.Gateway`).

    Args:
        trainable: Agents whose trajectories are released (each released episode has one per agent).
        episode_timeout_s: Seconds of silence after which an open episode with no call running is abandoned, and
            after which a held group that is still incomplete expires.
        max_open_episodes: Most open episodes (one with only a call running counts); a call that opens one more
            raises :class:`ResourceExhaustedError`.
        max_calls_per_episode: Most calls recorded per episode and agent, each of a request's ``n`` choices
            counting as one (:class:`InvalidArgumentError` beyond).
        max_group_size: Largest ``group_size`` a report may give (:class:`InvalidArgumentError` beyond).
        clock: Monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        trainable: list[str],
        *,
        episode_timeout_s: float,
        max_open_episodes: int,
        max_calls_per_episode: int,
        max_group_size: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.trainable = list(trainable)
        self.episode_timeout_s = episode_timeout_s
        self.max_open_episodes = max_open_episodes
        self.max_calls_per_episode = max_calls_per_episode
        self.max_group_size = max_group_size
        self._clock = clock
        self._open: dict[str, _Episode] = {}
        self._held: dict[str, _HeldGroup] = {}  # group -> finished members waiting for the rest
        self._closed = _BoundedSet()  # episode ids already reported (a second report is refused)
        self._abandoned = _BoundedSet()  # episode ids abandoned (a later call or report is refused)
        self._served_groups = _BoundedSet()  # group ids calls carried (a report may only name one of them)
        self.counters = {
            "calls": 0,
            "finished": 0,
            "abandoned": 0,
            "failed": 0,
            "dropped": 0,
            "expired_groups": 0,
        }

    @property
    def open_episodes(self) -> int:
        """Episodes with recorded or running calls and no report yet."""
        return len(self._open)

    @property
    def held(self) -> int:
        """Finished episodes waiting for the rest of their group."""
        return sum(len(g.members) for g in self._held.values())

    # ------------------------------------------------------------------------------------------ calls
    def _check_not_closed(self, episode_id: str) -> None:
        if episode_id in self._abandoned:
            raise FailedPreconditionError(
                f"episode {episode_id!r} was abandoned (no call or report for {self.episode_timeout_s:g} s, "
                f"external.episode_timeout_s) and dropped with its group; use a new episode id"
            )
        if episode_id in self._closed:
            raise FailedPreconditionError(
                f"episode {episode_id!r} was already reported; use a new episode id"
            )

    def _check(self, episode_id: str, agent: str, n: int, *, reserved: bool) -> None:
        self._check_not_closed(episode_id)
        ep = self._open.get(episode_id)
        if ep is None:
            if len(self._open) >= self.max_open_episodes:
                raise ResourceExhaustedError(
                    f"{len(self._open)} episodes are open (gateway.max_open_episodes = "
                    f"{self.max_open_episodes}); report rewards for some before starting episode {episode_id!r}"
                )
            used = 0
        else:
            trace = ep.agents.get(agent)
            # a record() of a call begun with begin_call was reserved: only calls already recorded count
            used = 0 if trace is None else trace.calls + (0 if reserved else trace.pending)
        if used + n > self.max_calls_per_episode:
            raise InvalidArgumentError(
                f"agent {agent!r} has {used} calls in episode {episode_id!r} (recorded or running) and this "
                f"request adds {n}; the limit (gateway.max_calls_per_episode) is {self.max_calls_per_episode}"
            )

    def _check_group(self, episode_id: str, group_id: str, what: str) -> None:
        """FailedPreconditionError when ``group_id`` is set and differs from the group the open episode's calls
        carried (an episode belongs to one group: a second one would silently move it); its ``param`` is
        ``group_id``."""
        ep = self._open.get(episode_id)
        if group_id and ep is not None and ep.group_id and group_id != ep.group_id:
            err = FailedPreconditionError(
                f"{what} names group {group_id!r} but the calls of episode {episode_id!r} were made under group "
                f"{ep.group_id!r}; an episode belongs to one group: send the same group id (or none)"
            )
            err.param = "group_id"  # type: ignore[attr-defined]  # the argument at fault (an adapter's field)
            raise err

    def _served(self, ep: _Episode, group_id: str) -> None:
        """Note that a call of ``ep`` carried ``group_id`` (when set): it becomes the episode's group, and a group
        a report may name."""
        if group_id:
            self._served_groups.add(group_id)
            ep.group_id = ep.group_id or group_id

    def _check_known_group(self, episode_id: str, ep: _Episode, group_id: str) -> None:
        """NotFoundError (``param`` ``group_id``) when a report names a group its episode's calls did not carry and
        no call of any episode carried (the last :data:`REMEMBERED_IDS` groups are remembered): a typo would
        otherwise make a group of its own that never completes, or a group of one that trains nothing."""
        if not group_id or ep.group_id or group_id in self._served_groups:
            return
        err = NotFoundError(
            f"group_id {group_id!r} names no group this gateway served: no call carried it (not the calls of "
            f"episode {episode_id!r}, which carried no group, nor those of any other episode); a typo? Send the "
            "group with the calls (header X-Marti-Group, the base URL /episodes/{episode_id}/groups/{group_id}/v1, "
            "or group_id= in the SDK's generate), or leave group_id out for an episode without a group"
        )
        err.param = "group_id"  # type: ignore[attr-defined]
        raise err

    def check_can_record(self, episode_id: str, agent: str, n: int = 1) -> None:
        """Raise if ``n`` more calls of ``agent`` in the episode would break a limit (changes nothing).

        Raises:
            FailedPreconditionError: The episode was already reported, or abandoned.
            ResourceExhaustedError: It would open more than ``max_open_episodes`` episodes.
            InvalidArgumentError: The agent's recorded and running calls in it plus ``n`` exceed
                ``max_calls_per_episode``.
        """
        self._check(episode_id, agent, n, reserved=False)

    def begin_call(self, episode_id: str, agent: str, n: int, group_id: str = "") -> None:
        """Start a call of ``n`` choices: checks the limits, opens the episode and reserves the ``n`` calls.

        Until the matching :meth:`end_call` the episode is not abandoned and its report is refused. Each choice
        is then recorded with :meth:`record`.

        Args:
            episode_id: The client's episode id.
            agent: The agent serving the call.
            n: Choices the call generates (each is one call against ``max_calls_per_episode``).
            group_id: The client's group id, when it sent one with the call.

        Raises:
            As :meth:`check_can_record` (nothing changes then); FailedPreconditionError also when ``group_id``
            differs from the group of the episode's earlier calls.
        """
        self._check(episode_id, agent, n, reserved=False)
        self._check_group(episode_id, group_id, "this call")
        now = self._clock()
        ep = self._open.setdefault(episode_id, _Episode(group_id=group_id, last_seen=now))
        ep.last_seen = now
        self._served(ep, group_id)
        ep.running += 1
        ep.agents.setdefault(agent, _AgentTrace()).pending += n

    def on_close(self, episode_id: str, callback: Callable[[], object]) -> bool:
        """Run ``callback`` once the open episode ``episode_id`` is reported, abandoned or closed unused; returns
        whether it will (False, and nothing happens, for an episode that is not open)."""
        ep = self._open.get(episode_id)
        if ep is not None:
            ep.on_close.append(callback)
        return ep is not None

    def _drop(self, episode_id: str) -> _Episode | None:
        """Remove an episode from the open set and run its close callbacks; None when it was not open."""
        ep = self._open.pop(episode_id, None)
        if ep is not None:
            for callback in ep.on_close:
                callback()
        return ep

    def end_call(self, episode_id: str, agent: str, n: int) -> None:
        """End a call begun with :meth:`begin_call` (served or not): frees its reservation and refreshes the
        episode's last activity. An episode left without recorded or running calls is closed again as if it
        never started (a report for it is then refused as unknown)."""
        ep = self._open.get(episode_id)
        if ep is None:
            return
        ep.running = max(0, ep.running - 1)
        trace = ep.agents.get(agent)
        if trace is not None:
            trace.pending = max(0, trace.pending - n)
        ep.last_seen = self._clock()
        if ep.running == 0 and ep.calls == 0:
            self._drop(episode_id)

    def record(self, episode_id: str, agent: str, call_id: str, gen: Generation, group_id: str = "") -> None:
        """Record one served call (one choice).

        Within :meth:`begin_call` / :meth:`end_call` the call was reserved; otherwise the limits of
        :meth:`check_can_record` are checked here.

        Args:
            episode_id: The client's episode id.
            agent: The agent that served it.
            call_id: The id returned to the client (per-call rewards name it).
            gen: What the engine produced: exact prompt and response ids, log-probs, version.
            group_id: The client's group id, when it sent one with the call.

        Raises:
            As :meth:`check_can_record`; FailedPreconditionError also when ``group_id`` differs from the group of
            the episode's earlier calls.
        """
        self._check(episode_id, agent, 1, reserved=True)
        self._check_group(episode_id, group_id, "this call")
        now = self._clock()
        ep = self._open.setdefault(episode_id, _Episode(group_id=group_id, last_seen=now))
        ep.last_seen = now
        self._served(ep, group_id)
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
                last.response_text += gen.text  # the generated texts only: the gap is not decoded here
                last.info["finish_reason"] = gen.finish_reason  # the merged turn ends where its last call did
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

    def turn_versions(self, episode_id: str) -> dict[str, list[int]]:
        """Per agent of an open episode, the policy version of each of its recorded turns (``{}`` when the
        episode is not open)."""
        ep = self._open.get(episode_id)
        if ep is None:
            return {}
        return {a: [t.policy_version or 0 for t in tr.turns] for a, tr in ep.agents.items() if tr.turns}

    # ------------------------------------------------------------------------------------------ reports
    def finish(
        self,
        episode_id: str,
        rewards: dict[str, float],
        *,
        call_rewards: dict[str, float] | None = None,
        group_id: str = "",
        group_size: int = 0,
        failed: bool = False,
        admit: Callable[[int], None] | None = None,
    ) -> Released:
        """End an episode with its rewards (or as failed) and release what became final.

        Args:
            episode_id: The episode.
            rewards: Per agent, its return for the episode (agents without an entry get the sum of their call
                rewards; every trained agent that made calls needs one or the other).
            call_rewards: Per call id, a reward for that call (its turn's reward; merged calls add up).
            group_id: The episode's group (the problem id); it must match one sent with the calls; when they sent
                none, a group the calls of another episode carried; empty = the group sent with the calls, or,
                without one, the episode is a group of its own.
            group_size: Episodes of the group; > 0 holds finished members until the group is complete. Every
                member of a held group must give the size the group was opened with.
            failed: The client reports the episode as failed: it is dropped with its group.
            admit: Called, once the report is valid and before anything changes, with how many episodes it will
                release (0 for a failed report, an episode whose group died, or a member that leaves its group
                incomplete; the whole group for the member that completes it; else 1); an exception it raises
                refuses the report, which then changes nothing.

        Returns:
            The released episodes and the number dropped by this report.

        Raises:
            A refused report changes nothing (an open episode stays open):
            FailedPreconditionError: The episode was already reported, or abandoned, or calls of it are still
                running, or ``group_id`` differs from the group its calls were made under (both are named).
            InvalidArgumentError: An agent in ``rewards`` that is not trained, or that made no recorded call in
                the episode (unless ``failed``; the agents that did are named), a trained agent that made calls
                but gets no reward (neither in ``rewards`` nor through ``call_rewards``; unless ``failed``;
                named), a call id the episode did not
                make, a reward that is not a finite number or is beyond +-1e20
                (:func:`marti.rewards.base.check_reward`), a negative ``group_size`` or one above
                ``max_group_size``, a ``group_size`` > 1 for an episode without a group id (neither in the
                report nor with its calls: it is a group of one, so it could never be complete), or a
                ``group_size`` different from the one its held group was opened with, or from the one a member
                of its group (sent with its calls) was reported with while this episode was open (a member
                released at once without ``group_size`` would leave a later ``group_size`` incomplete forever).
            NotFoundError: No call was recorded under ``episode_id``; or ``group_id`` is not the group its calls
                carried (they carried none) and no call of any episode carried it (a typo would make a group
                that never completes; ``param`` ``group_id``).
        """
        ep, group = self._check_report(episode_id, rewards, call_rewards, group_id, group_size, failed)
        if admit is not None:
            admit(self._releases(ep, group, group_size, failed))
        # every check passed: from here on the report is accepted
        self._drop(episode_id)
        self._closed.add(episode_id)
        if failed:
            self.counters["failed"] += 1
            if ep.doomed:  # its group already died; the group now under that id is another one
                self.counters["dropped"] += 1
                return Released(dropped=1)
            return self._kill_group(group, 1)
        self.counters["finished"] += 1
        if ep.doomed:
            self.counters["dropped"] += 1
            return Released(dropped=1)
        trajs = self._trajectories(episode_id, ep, group, rewards, call_rewards or {}, group_size)
        self._note_size(group, group_size, episode_id)
        if group_size > 0:
            held = self._held.setdefault(group, _HeldGroup(size=group_size))
            held.members.append(trajs)
            held.last_finished = self._clock()
            if len(held.members) < group_size:
                return Released()
            del self._held[group]
            return Released(episodes=held.members)
        return Released(episodes=[trajs])

    def _note_size(self, group: str, group_size: int, episode_id: str) -> None:
        """Mark the members of ``group`` open now (not those that open later, a new group) with the
        ``group_size`` its member ``episode_id`` was reported with, unless an earlier member marked them."""
        for eid, other in self._open.items():
            if other.sibling_size is None and (other.group_id or f"episode:{eid}") == group:
                other.sibling_size = (group_size, episode_id)

    def _releases(self, ep: _Episode, group: str, group_size: int, failed: bool) -> int:
        """How many episodes a valid report of ``ep`` releases (see ``admit`` of :meth:`finish`)."""
        if failed or ep.doomed:
            return 0
        if group_size > 0:
            held = self._held.get(group)
            members = (len(held.members) if held is not None else 0) + 1
            return members if members >= group_size else 0
        return 1

    def _check_every_caller_rewarded(
        self, episode_id: str, ep: _Episode, rewards: dict[str, float], call_rewards: dict[str, float]
    ) -> None:
        """Raises InvalidArgumentError naming the trained agents that made calls in the episode but get no reward
        from the report (no entry in ``rewards``, none of their calls in ``call_rewards``): a forgotten agent
        would silently train as reward 0."""
        missing = sorted(
            a
            for a, trace in ep.agents.items()
            if trace.calls
            and a in self.trainable
            and a not in rewards
            and not any(c in call_rewards for ids in trace.call_ids for c in ids)
        )
        if missing:
            raise InvalidArgumentError(
                f"the report of episode {episode_id!r} gives no reward to {missing}, which made calls in it "
                "(neither in rewards nor for their calls in call_rewards): it would train as reward 0; report "
                f"{{{missing[0]!r}: 0.0}} if 0 is meant, or failed=true to drop the episode"
            )

    def _check_report(
        self,
        episode_id: str,
        rewards: dict[str, float],
        call_rewards: dict[str, float] | None,
        group_id: str,
        group_size: int,
        failed: bool,
    ) -> tuple[_Episode, str]:
        """Every check of :meth:`finish` (which raises as documented there); returns the open episode and its
        group's id."""
        self._check_not_closed(episode_id)
        unknown = sorted(set(rewards) - set(self.trainable))
        if unknown:
            raise InvalidArgumentError(
                f"rewards name agent {unknown[0]!r}, which is not a trained agent of this job "
                f"(trained: {self.trainable})"
            )
        if not isinstance(group_size, int) or group_size < 0:
            raise InvalidArgumentError(f"group_size must be an int >= 0, got {group_size!r}")
        if group_size > self.max_group_size:
            raise InvalidArgumentError(
                f"group_size is {group_size}; the limit (gateway.max_group_size) is {self.max_group_size}"
            )
        for where, values in (("rewards", rewards), ("call_rewards", call_rewards or {})):
            for key, value in values.items():
                if not isinstance(value, int | float) or not math.isfinite(value):
                    raise InvalidArgumentError(f"{where}[{key!r}] must be a finite number, got {value!r}")
                check_reward(float(value), f"{where}[{key!r}]")  # beyond +-1e20: advantages would overflow
        ep = self._open.get(episode_id)
        if ep is not None and ep.running:
            raise FailedPreconditionError(
                f"{ep.running} calls of episode {episode_id!r} are still running; report after they return"
            )
        if ep is None or ep.calls == 0:
            raise NotFoundError(
                f"episode_id {episode_id!r} has no recorded calls (a typo, or the id was never used in a call)"
            )
        self._check_group(episode_id, group_id, "the report")
        self._check_known_group(episode_id, ep, group_id)
        called = sorted(a for a, trace in ep.agents.items() if trace.calls)
        idle = sorted(set(rewards) - set(called))
        if idle and not failed:
            raise InvalidArgumentError(
                f"rewards name agent {idle[0]!r}, which made no recorded call in episode {episode_id!r} (agents "
                f"that did: {called}); its item would have no turns and train nothing: leave it out of rewards "
                "(a call whose client went away before its answer is not recorded)"
            )
        known = {c for trace in ep.agents.values() for ids in trace.call_ids for c in ids}
        bad = sorted(set(call_rewards or {}) - known)
        if bad:
            raise InvalidArgumentError(
                f"call_rewards name call {bad[0]!r}, which episode {episode_id!r} did not make"
            )
        if group_size > 1 and not failed and not (group_id or ep.group_id):
            raise InvalidArgumentError(
                f"group_size is {group_size} but episode {episode_id!r} has no group_id (neither in the report "
                "nor with its calls): an episode without a group is a group of its own and could never reach "
                f"{group_size} members; send the group_id (e.g. the problem id) with group_size, or group_size 0"
            )
        group = group_id or ep.group_id or f"episode:{episode_id}"
        if not failed and not ep.doomed:
            self._check_group_size(episode_id, ep, group, group_size)
        if not failed:  # after the group checks: a report without group_size is named for it, not a reward
            self._check_every_caller_rewarded(episode_id, ep, rewards, call_rewards or {})
        return ep, group

    def _check_group_size(self, episode_id: str, ep: _Episode, group: str, group_size: int) -> None:
        """InvalidArgumentError naming ``group`` and both sizes when ``group_size`` differs from the size the
        group's held members were opened with, or from the size a member was reported with while ``ep`` was
        open."""
        held = self._held.get(group)
        if held is not None and group_size != held.size:
            raise InvalidArgumentError(
                f"group {group!r} was opened with {_size_text(held.size)} and {len(held.members)} of its "
                f"episodes wait for the rest; this report of episode {episode_id!r} gives {_size_text(group_size)}"
            )
        if held is None and ep.sibling_size is not None and group_size != ep.sibling_size[0]:
            size, other = ep.sibling_size
            raise InvalidArgumentError(
                f"group {group!r}: episode {other!r} of it was reported with {_size_text(size)} while episode "
                f"{episode_id!r} was open, and this report of {episode_id!r} gives {_size_text(group_size)}; every "
                "member of a group must give the same group_size"
            )

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
        newest = max((t.policy_version or 0 for tr in ep.agents.values() for t in tr.turns), default=0)
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
            # an agent that made no call holds no sampled token: it gets the episode's newest version, so its
            # empty item is never dropped as stale (the agents' tables stay aligned)
            traj.policy_version = min(versions) if versions else newest
            if group_size > 0:
                traj.group_size = group_size  # the store's whole-groups take reads it
            traj.validate()
            out[agent] = traj
        return out

    def _kill_group(self, group: str, dropped: int) -> Released:
        """Drop a group: its held members now, its members open now when they report (they are doomed).

        Episodes that open later with the same group id form a new group. ``dropped`` episodes already removed
        by the caller are added to the count.
        """
        held = self._held.pop(group, None)
        dropped += len(held.members) if held is not None else 0
        for eid, ep in self._open.items():
            if (ep.group_id or f"episode:{eid}") == group:
                ep.doomed = True
        self.counters["dropped"] += dropped
        return Released(dropped=dropped)

    def sweep(self) -> Released:
        """Abandon every open episode with no call running that was silent for ``episode_timeout_s`` (with its
        group), and expire every held group whose last member finished ``episode_timeout_s`` ago; returns what
        was dropped."""
        now = self._clock()
        out = Released()
        silent = [
            e
            for e, ep in self._open.items()
            if not ep.running and now - ep.last_seen >= self.episode_timeout_s
        ]
        for eid in silent:
            ep = self._drop(eid)
            if ep is None:
                continue
            self._abandoned.add(eid)
            self.counters["abandoned"] += 1
            if ep.doomed:
                self.counters["dropped"] += 1
                out.dropped += 1
            else:
                out.dropped += self._kill_group(ep.group_id or f"episode:{eid}", 1).dropped
        for group in [g for g, h in self._held.items() if now - h.last_finished >= self.episode_timeout_s]:
            if group in self._held:
                self.counters["expired_groups"] += 1
                out.dropped += self._kill_group(group, 0).dropped
        return out
