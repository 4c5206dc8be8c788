"""Sessions: one fresh environment per session, a session cap, idle reaping and idempotent requests.

Pure Python (no grpc). The servicer calls :class:`SessionManager` from one event loop; the manager is not
thread-safe by itself, and in-process users create one manager per thread.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from marti.env_guard import GuardedParallelEnv
from marti.env_registry import Registry
from marti.errors import (
    InternalError,
    InvalidArgumentError,
    MartiError,
    ResourceExhaustedError,
    SessionLostError,
)


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
    """

    results: tuple[AgentOutcome, ...]
    agents: tuple[str, ...]
    acting_agents: tuple[str, ...]


@dataclass
class Session:
    """A live session.

    Args:
        session_id: Opaque id.
        env_id: Resolved ``name-vN``.
        env: The guarded env instance (owned by this session alone).
        owner: Who created it (a stream id) or ``None``; :meth:`SessionManager.close_owned` closes by owner.
        last_used_s: Monotonic time of the last request, seconds.
    """

    session_id: str
    env_id: str
    env: GuardedParallelEnv
    owner: str | None
    last_used_s: float
    results: OrderedDict[str, Outcome] = field(default_factory=OrderedDict)


def _outcome(env: GuardedParallelEnv, obs: dict, infos: dict, rew=None, term=None, trunc=None) -> Outcome:
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
    return Outcome(results, tuple(env.agents), tuple(env.acting_agents))


class SessionManager:
    """Creates, steps, resets, closes and reaps sessions.

    Args:
        registry: Where env ids are resolved.
        max_sessions: Cap on concurrent sessions; creating one more is ``ResourceExhaustedError`` naming it.
        idle_timeout_s: Sessions unused this long are closed by :meth:`reap_idle`, seconds.
        idempotency_window: How many recent request ids each session (and the create path) remembers.
        clock: Monotonic clock in seconds (injectable for tests).

    Raises:
        InvalidArgumentError: A limit below 1 (or a non-positive timeout).
    """

    def __init__(
        self,
        registry: Registry,
        max_sessions: int = 1024,
        idle_timeout_s: float = 600.0,
        idempotency_window: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_sessions < 1:
            raise InvalidArgumentError(f"max_sessions must be >= 1, got {max_sessions}")
        if idle_timeout_s <= 0:
            raise InvalidArgumentError(f"idle_timeout_s must be > 0, got {idle_timeout_s}")
        if idempotency_window < 1:
            raise InvalidArgumentError(f"idempotency_window must be >= 1, got {idempotency_window}")
        self.registry = registry
        self.max_sessions = max_sessions
        self.idle_timeout_s = idle_timeout_s
        self.idempotency_window = idempotency_window
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._created: OrderedDict[str, str] = OrderedDict()  # create request id -> session id

    def __len__(self) -> int:
        return len(self._sessions)

    def session_ids(self) -> list[str]:
        """Ids of the live sessions."""
        return list(self._sessions)

    def create(
        self,
        env_id: str,
        config: Mapping[str, Any] | None = None,
        seed: int | None = None,
        owner: str | None = None,
        request_id: str = "",
    ) -> Session:
        """Create a session holding a fresh env instance.

        Args:
            env_id: Env id (see :meth:`Registry.resolve`).
            config: Env config.
            seed: Seed of the first reset without a seed.
            owner: Owner tag (e.g. a stream id) for :meth:`close_owned`.
            request_id: When non-empty and seen before (and the session still lives), that session is returned.

        Returns:
            The new (or, on a retry, the earlier) :class:`Session`.

        Raises:
            ResourceExhaustedError: ``max_sessions`` reached (named).
            NotFoundError: Unknown env id.
            InvalidArgumentError: Bad config or seed.
        """
        if request_id and request_id in self._created and self._created[request_id] in self._sessions:
            return self._touch(self._created[request_id])
        if len(self._sessions) >= self.max_sessions:
            raise ResourceExhaustedError(
                f"session cap reached: max_sessions={self.max_sessions}; close sessions or raise the cap"
            )
        env = self.registry.make(env_id, config, seed)
        sid = secrets.token_hex(12)
        session = Session(sid, self.registry.resolve(env_id).env_id, env, owner, self.clock())
        self._sessions[sid] = session
        if request_id:
            self._created[request_id] = sid
            while len(self._created) > self.idempotency_window * 16:
                self._created.popitem(last=False)
        return session

    def _touch(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionLostError(
                f"unknown session {session_id!r}: closed, reaped after {self.idle_timeout_s:g}s idle, lost in "
                "an env server restart, or never created; create a new session (a marti.make(address=...) "
                "env: call reset())",
                session_id=session_id,
            )
        session.last_used_s = self.clock()
        return session

    def get(self, session_id: str) -> Session:
        """Return a live session and mark it used.

        Raises:
            SessionLostError: Unknown, closed or reaped session (named; a ``NotFoundError``).
        """
        return self._touch(session_id)

    def _remember(self, session: Session, request_id: str, outcome: Outcome) -> Outcome:
        if request_id:
            session.results[request_id] = outcome
            while len(session.results) > self.idempotency_window:
                session.results.popitem(last=False)
        return outcome

    def reset(
        self, session_id: str, seed: int | None = None, options: dict | None = None, request_id: str = ""
    ) -> Outcome:
        """Reset a session's env.

        Args:
            session_id: The session.
            seed: Reseeds the env (``None`` continues its stream).
            options: PettingZoo reset options.
            request_id: Retrying with the same id returns the first outcome without resetting again.

        Returns:
            Observations and infos of every live agent.

        Raises:
            SessionLostError: Unknown session (a ``NotFoundError``).
            InvalidArgumentError: Bad seed.
        """
        session = self._touch(session_id)
        if request_id and request_id in session.results:
            return session.results[request_id]
        obs, infos = self._call(session, lambda: session.env.reset(seed=seed, options=options or None))
        return self._remember(session, request_id, _outcome(session.env, obs, infos))

    def step(self, session_id: str, actions: Mapping[str, Any], request_id: str = "") -> Outcome:
        """Step a session's env.

        Args:
            session_id: The session.
            actions: Agent -> action.
            request_id: Retrying with the same id returns the first outcome without stepping again.

        Returns:
            PettingZoo step results for the agents live before the step.

        Raises:
            SessionLostError: Unknown session (a ``NotFoundError``).
            FailedPreconditionError: Step before reset or after the episode ended.
            InvalidArgumentError: Unknown or done agent, missing action, oversized or malformed action.
        """
        session = self._touch(session_id)
        if request_id and request_id in session.results:
            return session.results[request_id]
        obs, rew, term, trunc, infos = self._call(
            session, lambda: session.env.step(dict(actions) if isinstance(actions, Mapping) else actions)
        )
        return self._remember(session, request_id, _outcome(session.env, obs, infos, rew, term, trunc))

    @staticmethod
    def _call(session: Session, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except MartiError:
            raise
        except Exception as e:  # an env bug: report it, keep the server and the other sessions alive
            raise InternalError(f"env {session.env_id} raised {type(e).__name__}: {e}") from e

    def close(self, session_id: str) -> bool:
        """Close a session (idempotent).

        Returns:
            True when the session existed.
        """
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        try:
            session.env.close()
        except Exception:  # noqa: BLE001 - closing must not fail the caller
            pass
        return True

    def close_owned(self, owner: str) -> int:
        """Close every session of ``owner``; returns how many were closed."""
        ids = [sid for sid, s in self._sessions.items() if s.owner == owner]
        for sid in ids:
            self.close(sid)
        return len(ids)

    def reap_idle(self, now_s: float | None = None) -> list[str]:
        """Close sessions idle for at least ``idle_timeout_s``.

        Args:
            now_s: Current monotonic time (default: the clock).

        Returns:
            Ids of the closed sessions.
        """
        now_s = self.clock() if now_s is None else now_s
        idle = [sid for sid, s in self._sessions.items() if now_s - s.last_used_s >= self.idle_timeout_s]
        for sid in idle:
            self.close(sid)
        return idle

    def close_all(self) -> int:
        """Close every session (server shutdown); returns how many."""
        ids = list(self._sessions)
        for sid in ids:
            self.close(sid)
        return len(ids)
