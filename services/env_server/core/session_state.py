"""A session's records: its state (:class:`Session`), the outcomes of its resets and steps (:class:`Outcome`,
:class:`AgentOutcome`) and one step of a batch (:class:`BatchItem`). Pure Python, used by
:mod:`services.env_server.core.sessions` and the env server's adapters."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from marti.env.guard import GuardedParallelEnv


class BatchItem(NamedTuple):
    """One step of a batch (see :meth:`SessionManager.step_batch_async`).

    Attributes:
        session_id: The session.
        actions: Agent -> action.
        request_id: As for :meth:`SessionManager.step`.
        delta_base: As for :meth:`SessionManager.step_async`.
    """

    session_id: str
    actions: Mapping[str, Any]
    request_id: str = ""
    delta_base: int = 0


class AgentOutcome(NamedTuple):
    """One agent's share of a reset or step (a named tuple: cheap to build on the hot path).

    Attributes:
        agent: Agent id.
        observation: The observation (text for text envs).
        reward: Reward of the step (0.0 on reset).
        terminated: Episode ended by the env's rules.
        truncated: Episode cut short.
        info: The agent's info dict.
    """

    agent: str
    observation: Any
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = {}  # noqa: RUF012 - never mutated; every outcome passes its own dict


@dataclass(frozen=True)
class Outcome:
    """Result of a reset or step.

    Args:
        results: One entry per agent (live before a step), in ``possible_agents`` order.
        agents: Live agents afterwards.
        acting_agents: Agents whose action the next step reads.
        result_id: Its number within its session (resets and steps both count, from 1); a client names the
            latest one it holds to get the next step as a delta against it.
    """

    results: tuple[AgentOutcome, ...]
    agents: tuple[str, ...]
    acting_agents: tuple[str, ...]
    result_id: int = 0


@dataclass
class Session:
    """A live session.

    Args:
        session_id: Opaque id.
        env_id: Resolved ``name-vN``.
        env: The guarded env instance (owned by this session alone).
        owner: Who created it (a stream id) or ``None``; :meth:`SessionManager.close_owned` closes by owner.
        last_used_s: Monotonic time of the last request (and of the end of the last env call), seconds.
        results: The last request ids (the idempotency window), each with its outcome while it is one of the
            newest ``idempotency_results``, then with its ``result_id`` only.
        lock: Held by the one call running on this session's env; waiters are served in arrival order.
        pending: Calls holding or waiting for ``lock``; a session with pending calls is never reaped as idle.
        closed: Set when the env has been closed; calls that were queued behind the close then fail as lost.
        last: The newest outcome of a reset or step (the base of delta results), or ``None`` before the first.
    """

    session_id: str
    env_id: str
    env: GuardedParallelEnv
    owner: str | None
    last_used_s: float
    results: OrderedDict[str, Outcome | int] = field(default_factory=OrderedDict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    pending: int = 0
    closed: bool = False
    last: Outcome | None = None


def next_outcome(
    session: Session, obs: dict, infos: dict, rew=None, term=None, trunc=None
) -> tuple[Outcome, Outcome | None]:
    """Build the session's next outcome (numbered after its last) and make it the session's last; returns it
    with the outcome it follows."""
    env = session.env
    order = [a for a in env.possible_agents if a in obs] + [a for a in obs if a not in env.possible_agents]
    results = tuple(
        AgentOutcome(
            a,
            obs[a],
            float(rew.get(a, 0.0)) if rew else 0.0,
            bool(term.get(a, False)) if term else False,
            bool(trunc.get(a, False)) if trunc else False,
            dict(infos.get(a, {})),
        )
        for a in order
    )
    prev = session.last
    out = Outcome(results, tuple(env.agents), tuple(env.acting_agents), prev.result_id + 1 if prev else 1)
    session.last = out
    return out, prev
