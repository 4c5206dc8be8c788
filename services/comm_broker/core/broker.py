"""The broker core facade: sessions, composed of routing, mailboxes and the state board.

Pure Python (no grpc, no protobuf). All methods run on one thread (the server's event loop); the async
methods only add waiting (long poll, send-when-full) on top of the synchronous ones, so every state change
is atomic. Every change to durable state goes to the :class:`~.store.Store` before the method returns.

The work is split by job: :class:`~.routing.Router` validates and enqueues Send batches,
:class:`~.mailboxes.Mailboxes` handles membership, delivery, acks, redelivery, dead letters and waiting,
:class:`~.board.StateBoard` the versioned state board. :class:`Broker` owns the session registry
(creation, lookup, idle expiry, restore, stats) and resolves session names before delegating.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from marti.errors import InvalidArgumentError, ResourceExhaustedError, SessionLostError

from .board import StateBoard
from .limits import BrokerLimits, check_name
from .mailbox import Entry, Mailbox
from .mailboxes import Mailboxes
from .routing import MailboxFullError, Router
from .session import Session
from .store import Store
from .types import AgentState, Counters, DeadLetter, Delivery, Envelope, SendResult, StatsSnapshot


class Broker:
    """Routes envelopes between the agents of each session.

    Args:
        limits: Limits and timings.
        store: Write-ahead store (in memory by default); loaded on construction.
        auto_create_sessions: If true, Send/Receive/Subscribe/PutState create unknown sessions; if false,
            only CreateSession does and everything else raises NOT_FOUND for an unknown session.
        clock: Wall-clock seconds since the epoch (injectable for tests).

    Attributes:
        mailboxes: The :class:`~.mailboxes.Mailboxes` component.
        router: The :class:`~.routing.Router` component.
        board: The :class:`~.board.StateBoard` component.
    """

    def __init__(
        self,
        limits: BrokerLimits | None = None,
        store: Store | None = None,
        auto_create_sessions: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.limits = limits or BrokerLimits()
        self.store = store or Store()
        self.auto_create_sessions = auto_create_sessions
        self.clock = clock
        self.sessions: dict[str, Session] = {}
        self.retired = Counters()
        self.mailboxes = Mailboxes(self.limits, self.store, clock)
        self.router = Router(self.limits, self.store, clock, self.mailboxes)
        self.board = StateBoard(self.limits, self.store, clock)
        self._restore()

    # ------------------------------------------------------------------ sessions
    def _new_session(self, name: str, fixed_roster: bool, dictionary: bytes) -> Session:
        if len(self.sessions) >= self.limits.max_sessions:
            self.expire_idle()
        if len(self.sessions) >= self.limits.max_sessions:
            raise ResourceExhaustedError(
                f"cannot create session {name!r}: max_sessions={self.limits.max_sessions} reached"
            )
        now = self.clock()
        session = Session(name, now, now, fixed_roster, dictionary)
        self.store.create_session(name, now, fixed_roster, dictionary)
        self.sessions[name] = session
        return session

    def session(self, name: str, create: bool = False) -> Session:
        """Returns a live session, creating it if allowed.

        Args:
            name: Session name.
            create: Create it if missing (only when ``auto_create_sessions`` is on).

        Raises:
            InvalidArgumentError: Bad name.
            SessionLostError: Unknown session that may not be created here (a :class:`NotFoundError`).
            ResourceExhaustedError: ``max_sessions`` reached.
        """
        check_name(self.limits, "session", name)
        session = self.sessions.get(name)
        if session is None:
            if not (create and self.auto_create_sessions):
                raise SessionLostError(
                    f"session {name!r} not found (closed, reaped when idle, or lost in a broker restart); "
                    "create it again",
                    session_id=name,
                )
            session = self._new_session(name, False, b"")
        session.last_active = self.clock()
        return session

    def create_session(
        self, name: str, agents: Sequence[str] = (), fixed_roster: bool = False, dictionary: bytes = b""
    ) -> tuple[Session, bool]:
        """Creates a session explicitly, or returns the existing one (idempotent).

        Args:
            name: Session name.
            agents: Agents to create mailboxes for now (required when ``fixed_roster``).
            fixed_roster: Only these agents may take part; others get NOT_FOUND.
            dictionary: Optional zstd dictionary bytes to ship with the session.

        Returns:
            ``(session, created)``; ``created`` is False if it already existed (its settings are kept, and
            ``agents`` join it: this is how an SDK client joins its session when it connects, so that a
            broadcast reaches it before it first polls).

        Raises:
            InvalidArgumentError: Bad names, or a fixed roster without agents.
            NotFoundError: The session exists with a fixed roster that leaves out one of ``agents``.
            ResourceExhaustedError: ``max_sessions`` or ``max_agents_per_session`` reached.
        """
        check_name(self.limits, "session", name)
        existing = self.sessions.get(name)
        if existing is not None:
            existing.last_active = self.clock()
            for agent in agents:
                self.mailboxes.get(existing, agent, create=True)
            return existing, False
        if fixed_roster and not agents:
            raise InvalidArgumentError(f"session {name!r}: fixed_roster needs at least one agent")
        if len(agents) > self.limits.max_agents_per_session:
            raise ResourceExhaustedError(
                f"session {name!r} lists {len(agents)} agents, over max_agents_per_session="
                f"{self.limits.max_agents_per_session}"
            )
        for agent in agents:
            check_name(self.limits, "agent id", agent)
        session = self._new_session(name, fixed_roster, dictionary)
        session.fixed_roster = False  # admit the roster itself, then close it
        for agent in agents:
            self.mailboxes.get(session, agent, create=True)
        session.fixed_roster = fixed_roster
        return session, True

    def join(self, session_name: str, agent: str, topics: Iterable[str] = ()) -> Mailbox:
        """Makes ``agent`` a member of the session (creating both if allowed) and subscribes it to topics.

        Raises:
            NotFoundError: Unknown session (auto-create off) or agent outside a fixed roster.
            ResourceExhaustedError: Session, agent or ``max_topics_per_agent`` limit reached.
        """
        return self.mailboxes.join(self.session(session_name, create=True), agent, topics)

    # ------------------------------------------------------------------ send
    def send(
        self, session_name: str, sender: str, envelopes: Sequence[Envelope], broadcast: bool = False
    ) -> SendResult:
        """Accepts a batch atomically: every envelope is enqueued for all its receivers, or none is.

        Args:
            session_name: The session.
            sender: The calling agent (joins the session if new).
            envelopes: The batch; each ``envelope.sender`` must equal ``sender``.
            broadcast: Treat every envelope as a broadcast (the Broadcast rpc).

        Returns:
            The :class:`SendResult` (``enqueued``: mailbox entries made; 0 for a topic with no subscriber).

        Raises:
            InvalidArgumentError: Bad ids, no receivers, sender mismatch, negative ttl or sequence.
            NotFoundError: Unknown session (auto-create off), or a receiver outside a fixed roster.
            ResourceExhaustedError: Batch, payload, receivers or a mailbox limit (named in the message).
        """
        t0 = time.perf_counter()
        check_name(self.limits, "sender", sender)
        session = self.session(session_name, create=True)
        return self.router.send(session, sender, envelopes, broadcast, t0)

    async def send_wait(
        self,
        session_name: str,
        sender: str,
        envelopes: Sequence[Envelope],
        broadcast: bool = False,
        wait_s: float = 0.0,
    ) -> SendResult:
        """Like :meth:`send`, but if a mailbox is full waits up to ``wait_s`` seconds for space.

        Args:
            wait_s: Longest wait (capped at ``max_wait_s``); 0 fails at once.

        Raises:
            ResourceExhaustedError: Still full when the wait ends (names the limit).
            The other errors of :meth:`send`.
        """
        deadline = time.monotonic() + min(max(wait_s, 0.0), self.limits.max_wait_s)
        while True:
            try:
                return self.send(session_name, sender, envelopes, broadcast)
            except MailboxFullError as exc:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                await self.mailboxes.wait((session_name, exc.agent), remaining)

    # ------------------------------------------------------------------ receive and ack
    def receive(
        self,
        session_name: str,
        agent: str,
        max_messages: int,
        topics: Iterable[str] = (),
        max_unacked: int | None = None,
        max_bytes: int | None = None,
    ) -> list[Delivery]:
        """Delivers up to ``max_messages`` messages at once (no waiting); they stay unacked until :meth:`ack`.

        Args:
            session_name: The session (created if allowed).
            agent: The receiving agent (joins if new).
            max_messages: 1..``max_batch_messages``.
            topics: Topics to subscribe the agent to first.
            max_unacked: Per-call cap on unacked deliveries (at most ``max_unacked_per_agent``).
            max_bytes: Most bytes of the delivered frame (``Envelope.delivery_bytes`` summed; at most and by
                default ``max_frame_bytes``); the first message is delivered even if it alone is larger.

        Returns:
            Deliveries; per sender in increasing sequence order.

        Raises:
            InvalidArgumentError: ``max_messages`` out of range or bad ids.
            NotFoundError: Unknown session (auto-create off) or agent outside a fixed roster.
        """
        self.mailboxes.check_max_messages(max_messages)
        session = self.session(session_name, create=True)
        return self.mailboxes.receive(session, agent, max_messages, topics, max_unacked, max_bytes)

    async def receive_wait(
        self,
        session_name: str,
        agent: str,
        max_messages: int,
        timeout_s: float,
        topics: Iterable[str] = (),
        max_unacked: int | None = None,
        max_bytes: int | None = None,
    ) -> list[Delivery]:
        """Long poll: returns as soon as at least one message is deliverable, or ``[]`` after ``timeout_s``.

        Args:
            timeout_s: Longest wait in seconds (capped at ``max_wait_s``; 0 returns at once).
            Others: as in :meth:`receive`.

        Raises:
            The errors of :meth:`receive`.
        """
        deadline = time.monotonic() + min(max(timeout_s, 0.0), self.limits.max_wait_s)
        topics = tuple(topics)
        while True:
            out = self.receive(session_name, agent, max_messages, topics, max_unacked, max_bytes)
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                return out
            box = self.sessions[session_name].mailboxes[agent]
            nd = box.next_deadline()
            if nd is not None:
                remaining = min(remaining, max(nd - self.clock(), 0.001))
            await self.mailboxes.wait((session_name, agent), remaining)

    def ack(self, session_name: str, agent: str, message_ids: Sequence[str]) -> int:
        """Acks deliveries; unknown or already acked ids are ignored, so a retried Ack is harmless.

        Returns:
            How many deliveries were acked by this call.

        Raises:
            NotFoundError: Unknown session or agent.
            ResourceExhaustedError: More ids than ``max_batch_messages``.
        """
        self.mailboxes.check_ack_size(message_ids)
        return self.mailboxes.ack(self.session(session_name), agent, message_ids)

    def release(self, session_name: str, agent: str, message_ids: Sequence[str]) -> int:
        """Puts deliveries a Subscribe stream took but could not send (its client went first) back as pending,
        their attempt not counted, so the next delivery is the same attempt (:meth:`Mailbox.release`).

        Returns:
            How many were put back (unknown or acked ids are ignored).

        Raises:
            NotFoundError: Unknown session or agent.
        """
        return self.mailboxes.release(self.session(session_name), agent, message_ids)

    # ------------------------------------------------------------------ state board
    def put_state(
        self,
        session_name: str,
        agent: str,
        value: bytes,
        content_type: str = "application/json",
        expected_version: int | None = None,
    ) -> AgentState:
        """Sets the agent's entry on the board (last value wins), with optional compare-and-set.

        Args:
            expected_version: If given, the put succeeds only if the current version equals it
                (0 means "no entry yet").

        Returns:
            The new entry (version = previous + 1).

        Raises:
            AbortedError: Compare-and-set failed (names both versions).
            ResourceExhaustedError: ``value`` over ``max_state_bytes``.
        """
        self.board.check_value(agent, value)
        self.join(session_name, agent)
        return self.board.put(self.sessions[session_name], agent, value, content_type, expected_version)

    def get_states(self, session_name: str, agent: str = "", exclude_self: bool = True) -> list[AgentState]:
        """Returns the current board, sorted by agent id.

        Args:
            agent: The asking agent ("" for an observer); excluded from the result if ``exclude_self``.

        Raises:
            NotFoundError: Unknown session, or, in a fixed-roster session, an asking agent (observers ""
                included) outside the roster: the board is private to the roster.
        """
        return self.board.get(self.session(session_name), agent, exclude_self)

    # ------------------------------------------------------------------ dead letters, stats, expiry
    def read_dead_letters(
        self,
        session_name: str,
        max_messages: int,
        receiver: str = "",
        remove: bool = False,
        max_bytes: int | None = None,
    ) -> list[DeadLetter]:
        """Returns the oldest dead letters (optionally of one receiver), optionally removing them (only when
        ``receiver`` is empty).

        Args:
            max_messages: 1..``max_batch_messages``.
            max_bytes: Most bytes of the returned letters (at most and by default ``max_frame_bytes``); at
                least one letter is returned, however large (see :meth:`Mailboxes.read_dead_letters`).

        Raises:
            NotFoundError: Unknown session.
            InvalidArgumentError: ``max_messages`` out of range.
        """
        self.mailboxes.check_max_messages(max_messages)
        session = self.session(session_name)
        return self.mailboxes.read_dead_letters(session, max_messages, receiver, remove, max_bytes)

    def tick_session(self, session: Session, now: float) -> None:
        """Requeues or dead-letters overdue in-flight deliveries of every mailbox of the session."""
        self.mailboxes.tick_session(session, now)

    def expire_idle(self) -> list[str]:
        """Deletes sessions idle for ``session_idle_s`` (no calls, no open stream).

        Returns:
            Names of the expired sessions.
        """
        now = self.clock()
        gone = [
            s.name
            for s in self.sessions.values()
            if s.active_streams == 0 and now - s.last_active >= self.limits.session_idle_s
        ]
        for name in gone:
            session = self.sessions.pop(name)
            for box in session.mailboxes.values():
                box.drain()
            self.retired.add(session.counters)
            self.store.delete_session(name)
        return gone

    def tick(self) -> None:
        """Periodic maintenance: expire idle sessions, redeliver overdue messages, prune dedup ids."""
        self.expire_idle()
        now = self.clock()
        for session in self.sessions.values():
            self.tick_session(session, now)
            cut = session.prune_dedup(now, self.limits.dedup_window_s, self.limits.max_dedup_entries)
            if cut is not None:
                self.store.prune_dedup(session.name, cut + 1e-6)

    def stats(self, session_name: str = "") -> StatsSnapshot:
        """Counters and gauges of one session, or of the whole broker (``""``; includes expired sessions).

        Raises:
            NotFoundError: Unknown session.
        """
        sessions = [self.session(session_name)] if session_name else list(self.sessions.values())
        counters = Counters()
        if not session_name:
            counters.add(self.retired)
        agents = pending = in_flight = nbytes = dead = 0
        for s in sessions:
            counters.add(s.counters)
            agents += len(s.mailboxes)
            dead += len(s.dead)
            for box in s.mailboxes.values():
                pending += box.pending
                in_flight += box.in_flight
                nbytes += box.bytes
        return StatsSnapshot(counters, len(sessions), agents, pending, in_flight, nbytes, dead)

    def count_frame_bytes(
        self, session_name: str, in_raw: int = 0, in_wire: int = 0, out_raw: int = 0, out_wire: int = 0
    ) -> None:
        """Adds frame sizes (bytes, uncompressed and on the wire) to the session's compression counters.

        Raises:
            NotFoundError: Unknown session.
        """
        c = self.session(session_name).counters
        c.bytes_in_raw += in_raw
        c.bytes_in_wire += in_wire
        c.bytes_out_raw += out_raw
        c.bytes_out_wire += out_wire

    # ------------------------------------------------------------------ restore
    def _restore(self) -> None:
        now = self.clock()
        for stored in self.store.load():
            session = Session(stored.name, stored.created_at, now, stored.fixed_roster, stored.dictionary)
            self.sessions[stored.name] = session
            for agent, topics in stored.agents.items():
                box = session.mailboxes[agent] = self.mailboxes.new_box(session, agent)
                box.topics = set(topics)
                for t in topics:
                    session.topics.setdefault(t, set()).add(agent)
            for m in stored.messages:
                box = session.mailboxes.get(m.receiver)
                if box is None:
                    box = session.mailboxes[m.receiver] = self.mailboxes.new_box(session, m.receiver)
                box.add(Entry(m.envelope, m.position, m.attempts, m.expires_at))
            session.states = {s.agent_id: s for s in stored.states}
            session.dedup.update(stored.dedup)
            session.last_seq = dict(stored.last_seq)
            session.dead = deque(stored.dead[-self.limits.max_dead_letters :])


__all__ = ["Broker", "MailboxFullError"]
