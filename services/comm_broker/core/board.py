"""The state board of the broker core: the last value each agent posted, versioned for compare-and-set."""

from __future__ import annotations

from collections.abc import Callable

from marti.errors import AbortedError, NotFoundError, ResourceExhaustedError

from .limits import BrokerLimits
from .session import Session
from .store import Store
from .types import AgentState


class StateBoard:
    """Reads and writes the per-session board of agent states.

    Args:
        limits: Limits (``max_state_bytes``).
        store: Write-ahead store; a put is written before it returns.
        clock: Wall-clock seconds since the epoch (the entries' ``updated_at``).
    """

    def __init__(self, limits: BrokerLimits, store: Store, clock: Callable[[], float]) -> None:
        self.limits = limits
        self.store = store
        self.clock = clock

    def check_value(self, agent: str, value: bytes) -> None:
        """Checks a value's size before anything else happens.

        Raises:
            ResourceExhaustedError: ``value`` over ``max_state_bytes`` bytes.
        """
        if len(value) > self.limits.max_state_bytes:
            raise ResourceExhaustedError(
                f"state of agent {agent!r} is {len(value)} bytes, over max_state_bytes={self.limits.max_state_bytes}"
            )

    def put(
        self,
        session: Session,
        agent: str,
        value: bytes,
        content_type: str = "application/json",
        expected_version: int | None = None,
    ) -> AgentState:
        """Sets the agent's entry (last value wins), with optional compare-and-set.

        Args:
            session: The session (the agent is already a member).
            agent: The owner of the entry.
            value: The value bytes (size checked by :meth:`check_value`).
            content_type: Type of ``value``.
            expected_version: If given, the put succeeds only if the current version equals it
                (0 means "no entry yet").

        Returns:
            The new entry (version = previous + 1).

        Raises:
            AbortedError: Compare-and-set failed (names both versions).
        """
        old = session.states.get(agent)
        current = old.version if old else 0
        if expected_version is not None and expected_version != current:
            raise AbortedError(
                f"state of agent {agent!r} is at version {current}, not the expected {expected_version}"
            )
        state = AgentState(agent, bytes(value), content_type, current + 1, self.clock())
        self.store.put_state(session.name, state)
        session.states[agent] = state
        return state

    def get(self, session: Session, agent: str = "", exclude_self: bool = True) -> list[AgentState]:
        """Returns the current board, sorted by agent id.

        Args:
            session: The session.
            agent: The asking agent ("" for an observer); excluded from the result if ``exclude_self``.
            exclude_self: Leave the asking agent's own entry out.

        Raises:
            NotFoundError: In a fixed-roster session, an asking agent (observers "" included) outside the
                roster: the board is private to the roster.
        """
        if session.fixed_roster and agent not in session.mailboxes:
            raise NotFoundError(f"agent {agent!r} not found in session {session.name!r}")
        return [s for a, s in sorted(session.states.items()) if not (exclude_self and a == agent)]
