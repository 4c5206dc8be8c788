"""Typed multi-agent trajectories: the items the experience store holds.

Dimension names (used in every docstring): T_prompt prompt tokens of one turn, A response (action) tokens of
one turn, N agents.

A :class:`Trajectory` is what one agent did in one episode: a list of :class:`Turn`, each with the prompt it saw,
the tokens it generated, the log-probabilities of those tokens under the behaviour policy, the reward it got and
the episode-end flags. Several agents of one episode each share their own trajectory; :func:`merge_by_step`
interleaves them by time step for a global view of the episode.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from marti.errors import InvalidArgumentError


@dataclass(slots=True)
class Turn:
    """One agent turn.

    Attributes:
        step: Environment time step of this turn (0-based; turns of different agents with the same step happened
            in the same environment step).
        prompt_token_ids: Token ids the policy was conditioned on, shape (T_prompt,).
        response_token_ids: Token ids the policy generated, shape (A,).
        response_logprobs: Log-probability of each generated token under the behaviour policy, shape (A,),
            natural log; empty when the producer did not record them.
        reward: Scalar reward for this turn, or None when not (yet) known.
        terminated: True when the episode ended for this agent through the environment's rules.
        truncated: True when the episode was cut (time limit) rather than ended.
        info: JSON-able dict of extra data (must survive ``json.dumps``).
        prompt_text: Decoded prompt, for debugging only.
        response_text: Decoded response, for debugging only.
        policy_version: Version of the weights that generated this response (the behaviour policy; asynchronous
            rollouts switch weights between turns); None = the trajectory's ``policy_version``. Never below it.
        response_mask: Which response tokens the loss trains on, shape (A,), 1 = trained, 0 = not (text a tool
            or the env inserted); empty = every token.
    """

    step: int
    prompt_token_ids: list[int] = field(default_factory=list)
    response_token_ids: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    reward: float | None = None
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    prompt_text: str = ""
    response_text: str = ""
    policy_version: int | None = None
    response_mask: list[int] = field(default_factory=list)


def check_identity(episode_id: str, agent_id: str, policy_version: int) -> None:
    """Check the fields that identify a stored trajectory (a :class:`Trajectory` or its proto).

    Raises:
        InvalidArgumentError: naming the field: empty ``episode_id`` or ``agent_id``, negative
            ``policy_version``.
    """
    if not episode_id:
        raise InvalidArgumentError("trajectory.episode_id must be a non-empty string")
    if not agent_id:
        raise InvalidArgumentError("trajectory.agent_id must be a non-empty string")
    if policy_version < 0:
        raise InvalidArgumentError(f"trajectory.policy_version must be >= 0, got {policy_version}")


def check_token_ids(where: str, ids: Sequence[int]) -> None:
    """Raises InvalidArgumentError naming ``where`` (``trajectory.turns[0].prompt_token_ids``) and the value when
    ``ids`` holds a negative token id (a vocabulary index is >= 0)."""
    if len(ids) and min(ids) < 0:
        raise InvalidArgumentError(f"{where} holds the negative token id {min(ids)}")


@dataclass(slots=True)
class Trajectory:
    """One agent's turns in one episode.

    Attributes:
        episode_id: Identifies the episode; every agent of the episode uses the same id.
        session: Groups episodes (a run, an env session); may be empty.
        agent_id: The agent that produced the turns.
        role: The agent's role (planner, executor, ...); may be empty.
        policy_version: Version of the policy weights that generated the responses (>= 0): the oldest version of
            any turn when turns carry their own (the store's staleness bound, ``max_policy_lag``, uses it).
        turns: The agent's turns in time order.
        metadata: JSON-able dict of trajectory-level data.
        created_at: Unix time in seconds when the trajectory was created (set to now when 0).
        group_id: Group of comparable trajectories (the problem's seed, ``task:seed`` in a multi-task job): group
            estimators (GRPO, RLOO) compare the trajectories of one group; empty = a group of its own.
        episode_return: The return credited to the agent for the episode (reward units; the outcome reward of
            every turn); None = the sum of the turn rewards.
        group_size: Trajectories the group has in all, this one included (the trainer's ``rollout.group_size``, an
            external client's reported ``group_size``); 0 = unknown. A whole-groups sample of the store takes a
            group only once all its members are in, and drops it whole when one is stale.
    """

    episode_id: str
    agent_id: str
    session: str = ""
    role: str = ""
    policy_version: int = 0
    turns: list[Turn] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    group_id: str = ""
    episode_return: float | None = None
    group_size: int = 0

    def __post_init__(self) -> None:
        if not self.created_at:
            self.created_at = time.time()

    @property
    def total_reward(self) -> float:
        """Sum of the known turn rewards (turns whose reward is None count as 0)."""
        return float(sum(t.reward for t in self.turns if t.reward is not None))

    @property
    def outcome_reward(self) -> float:
        """The episode's credited return: ``episode_return``, else :attr:`total_reward`."""
        return self.total_reward if self.episode_return is None else float(self.episode_return)

    def validate(self) -> None:
        """Check the invariants every stored trajectory must hold.

        Raises:
            InvalidArgumentError: naming the field: empty ``episode_id`` or ``agent_id``, negative
                ``policy_version``, a turn whose ``response_logprobs`` is neither empty nor as long as
                ``response_token_ids``, a negative token id, a non-finite reward, return or logprob, steps that
                decrease, a turn ``policy_version`` below the trajectory's, or a ``response_mask`` that is not
                empty or A values of 0 and 1.
        """
        check_identity(self.episode_id, self.agent_id, self.policy_version)
        if self.episode_return is not None and not math.isfinite(self.episode_return):
            raise InvalidArgumentError(f"trajectory.episode_return must be finite, got {self.episode_return}")
        last_step = -1
        for i, turn in enumerate(self.turns):
            where = f"trajectory.turns[{i}]"
            if turn.step < 0 or turn.step < last_step:
                raise InvalidArgumentError(
                    f"{where}.step must be >= 0 and non-decreasing, got {turn.step} after {last_step}"
                )
            last_step = turn.step
            n_lp, n_resp = len(turn.response_logprobs), len(turn.response_token_ids)
            if n_lp not in (0, n_resp):
                raise InvalidArgumentError(
                    f"{where}.response_logprobs has {n_lp} values but response_token_ids has {n_resp}"
                )
            for name in ("prompt_token_ids", "response_token_ids"):
                check_token_ids(f"{where}.{name}", getattr(turn, name))
            if turn.reward is not None and not math.isfinite(turn.reward):
                raise InvalidArgumentError(f"{where}.reward must be finite, got {turn.reward}")
            if any(not math.isfinite(x) for x in turn.response_logprobs):
                raise InvalidArgumentError(f"{where}.response_logprobs contains a non-finite value")
            if turn.policy_version is not None and turn.policy_version < self.policy_version:
                raise InvalidArgumentError(
                    f"{where}.policy_version ({turn.policy_version}) is below trajectory.policy_version "
                    f"({self.policy_version}), which must be the oldest version of its turns"
                )
            if turn.response_mask and (
                len(turn.response_mask) != n_resp or any(m not in (0, 1) for m in turn.response_mask)
            ):
                raise InvalidArgumentError(
                    f"{where}.response_mask must be empty or {n_resp} values of 0 and 1, got "
                    f"{turn.response_mask[:8]}{'...' if len(turn.response_mask) > 8 else ''}"
                )


@dataclass(frozen=True, slots=True)
class TrajectorySummary:
    """What the store needs to know about a trajectory without decoding its payload.

    Built by :func:`summarize` (from a dataclass) or by the gRPC layer straight from a proto.

    Attributes:
        episode_id, session, agent_id, role, policy_version, created_at: As in :class:`Trajectory`.
        num_turns: Number of turns.
        group_id, group_size: As in :class:`Trajectory` (the store's whole-groups sample reads them).
        prompt_lengths: T_prompt of each turn, shape (num_turns,).
        response_lengths: A of each turn, shape (num_turns,).
        logprob_lengths: Number of logprobs of each turn, shape (num_turns,).
        rewards_present: Whether each turn has a reward, shape (num_turns,).
    """

    episode_id: str
    session: str
    agent_id: str
    role: str
    policy_version: int
    created_at: float
    num_turns: int
    prompt_lengths: tuple[int, ...] = ()
    response_lengths: tuple[int, ...] = ()
    logprob_lengths: tuple[int, ...] = ()
    rewards_present: tuple[bool, ...] = ()
    group_id: str = ""
    group_size: int = 0


def summarize(trajectory: Trajectory) -> TrajectorySummary:
    """Return the :class:`TrajectorySummary` of a trajectory.

    Args:
        trajectory: The trajectory.

    Returns:
        Its summary (metadata plus per-turn lengths).
    """
    turns = trajectory.turns
    return TrajectorySummary(
        episode_id=trajectory.episode_id,
        session=trajectory.session,
        agent_id=trajectory.agent_id,
        role=trajectory.role,
        policy_version=trajectory.policy_version,
        created_at=trajectory.created_at,
        num_turns=len(turns),
        prompt_lengths=tuple(len(t.prompt_token_ids) for t in turns),
        response_lengths=tuple(len(t.response_token_ids) for t in turns),
        logprob_lengths=tuple(len(t.response_logprobs) for t in turns),
        rewards_present=tuple(t.reward is not None for t in turns),
        group_id=trajectory.group_id,
        group_size=trajectory.group_size,
    )


@dataclass(frozen=True, slots=True)
class AgentTurn:
    """One turn of one agent in the merged view of an episode (see :func:`merge_by_step`).

    Attributes:
        episode_id: The episode.
        agent_id: The agent that took the turn.
        role: The agent's role.
        policy_version: Policy version that generated the turn.
        turn: The turn itself.
    """

    episode_id: str
    agent_id: str
    role: str
    policy_version: int
    turn: Turn


def merge_by_step(trajectories: list[Trajectory]) -> list[AgentTurn]:
    """Interleave the turns of several agents' trajectories by time step.

    Ordering: by ``(episode created_at of the first trajectory of that episode, episode_id, step)``; turns with
    the same step keep the order in which their trajectories were given (the store passes insertion order),
    and each agent's own turn order is preserved.

    Args:
        trajectories: Trajectories of one or more episodes, in insertion order.

    Returns:
        Every turn of every trajectory, as :class:`AgentTurn`, merged by step.
    """
    episode_rank: dict[str, int] = {}
    keyed: list[tuple[int, int, int, int, AgentTurn]] = []
    for t_index, traj in enumerate(trajectories):
        rank = episode_rank.setdefault(traj.episode_id, len(episode_rank))
        for j, turn in enumerate(traj.turns):
            at = AgentTurn(traj.episode_id, traj.agent_id, traj.role, traj.policy_version, turn)
            keyed.append((rank, turn.step, t_index, j, at))
    keyed.sort(key=lambda x: x[:4])
    return [k[-1] for k in keyed]
