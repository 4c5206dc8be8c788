"""The broker core: sessions of bounded mailboxes, topics, a versioned state board and dead letters.

Pure Python (no grpc, no protobuf). All methods run on one thread (the server's event loop); the async
methods only add waiting (long poll, send-when-full) on top of the synchronous ones, so every state change
is atomic. Every change to durable state goes to the :class:`~.store.Store` before the method returns.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from marti.errors import (
    AbortedError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
)

from .limits import BrokerLimits
from .mailbox import Entry, Mailbox
from .session import Session
from .store import Store, StoredMessage
from .types import AgentState, Counters, DeadLetter, Delivery, Envelope, SendResult, StatsSnapshot


class MailboxFullError(ResourceExhaustedError):
    """A mailbox is at ``max_mailbox_messages`` or ``max_mailbox_bytes`` (gRPC RESOURCE_EXHAUSTED).

    Args:
        message: Names the agent, its fill level and the limit.
        agent: The agent whose mailbox is full.
    """

    def __init__(self, message: str, agent: str) -> None:
        super().__init__(message)
        self.agent = agent


class Broker:
    """Routes envelopes between the agents of each session.

    Args:
        limits: Limits and timings.
        store: Write-ahead store (in memory by default); loaded on construction.
        auto_create_sessions: If true, Send/Receive/Subscribe/PutState create unknown sessions; if false,
            only CreateSession does and everything else raises NOT_FOUND for an unknown session.
        clock: Wall-clock seconds since the epoch (injectable for tests).
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
        self._waiters: dict[tuple[str, str], list[asyncio.Future]] = {}
        self._restore()

    # ------------------------------------------------------------------ validation and lookup
    def _check_name(self, kind: str, value: str) -> None:
        if not value:
            raise InvalidArgumentError(f"{kind} must be a non-empty string")
        if len(value) > self.limits.max_agent_id_chars:
            raise InvalidArgumentError(
                f"{kind} {value[:32]!r}... has {len(value)} characters, over max_agent_id_chars="
                f"{self.limits.max_agent_id_chars}"
            )
        if "\x00" in value:
            raise InvalidArgumentError(f"{kind} {value!r} contains a NUL character")

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
            NotFoundError: Unknown session that may not be created here.
            ResourceExhaustedError: ``max_sessions`` reached.
        """
        self._check_name("session", name)
        session = self.sessions.get(name)
        if session is None:
            if not (create and self.auto_create_sessions):
                raise NotFoundError(f"session {name!r} not found")
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
            ``(session, created)``; ``created`` is False if it already existed (its settings are kept).

        Raises:
            InvalidArgumentError: Bad names, or a fixed roster without agents.
            ResourceExhaustedError: ``max_sessions`` or ``max_agents_per_session`` reached.
        """
        self._check_name("session", name)
        existing = self.sessions.get(name)
        if existing is not None:
            existing.last_active = self.clock()
            return existing, False
        if fixed_roster and not agents:
            raise InvalidArgumentError(f"session {name!r}: fixed_roster needs at least one agent")
        if len(agents) > self.limits.max_agents_per_session:
            raise ResourceExhaustedError(
                f"session {name!r} lists {len(agents)} agents, over max_agents_per_session="
                f"{self.limits.max_agents_per_session}"
            )
        for agent in agents:
            self._check_name("agent id", agent)
        session = self._new_session(name, fixed_roster, dictionary)
        session.fixed_roster = False  # admit the roster itself, then close it
        for agent in agents:
            self._mailbox(session, agent, create=True)
        session.fixed_roster = fixed_roster
        return session, True

    def _mailbox(self, session: Session, agent: str, create: bool) -> Mailbox:
        box = session.mailboxes.get(agent)
        if box is not None:
            return box
        self._check_name("agent id", agent)
        if not create or (session.fixed_roster and session.mailboxes):
            raise NotFoundError(f"agent {agent!r} not found in session {session.name!r}")
        if len(session.mailboxes) >= self.limits.max_agents_per_session:
            raise ResourceExhaustedError(
                f"cannot add agent {agent!r} to session {session.name!r}: max_agents_per_session="
                f"{self.limits.max_agents_per_session} reached"
            )
        key = (session.name, agent)
        box = Mailbox(agent, on_change=lambda: self._wake(key))
        session.mailboxes[agent] = box
        self.store.put_agent(session.name, agent, box.topics)
        return box

    def join(self, session_name: str, agent: str, topics: Iterable[str] = ()) -> Mailbox:
        """Makes ``agent`` a member of the session (creating both if allowed) and subscribes it to topics.

        Raises:
            NotFoundError: Unknown session (auto-create off) or agent outside a fixed roster.
            ResourceExhaustedError: Session, agent or ``max_topics_per_agent`` limit reached.
        """
        session = self.session(session_name, create=True)
        box = self._mailbox(session, agent, create=True)
        new = [t for t in topics if t not in box.topics]
        if new:
            for topic in new:
                self._check_name("topic", topic)
            if len(box.topics) + len(new) > self.limits.max_topics_per_agent:
                raise ResourceExhaustedError(
                    f"agent {agent!r} would have {len(box.topics) + len(new)} topics, over "
                    f"max_topics_per_agent={self.limits.max_topics_per_agent}"
                )
            for topic in new:
                box.topics.add(topic)
                session.topics.setdefault(topic, set()).add(agent)
            self.store.put_agent(session.name, agent, box.topics)
        return box

    # ------------------------------------------------------------------ send
    def _targets(self, session: Session, env: Envelope) -> list[str]:
        if env.broadcast:
            return [a for a in session.mailboxes if a != env.sender]
        if env.topic:
            self._check_name("topic", env.topic)
            return sorted(a for a in session.topics.get(env.topic, ()) if a != env.sender)
        if not env.receivers:
            raise InvalidArgumentError(
                f"message {env.message_id!r} has no receivers, topic or broadcast flag"
            )
        if len(env.receivers) > self.limits.max_receivers:
            raise ResourceExhaustedError(
                f"message {env.message_id!r} lists {len(env.receivers)} receivers, over max_receivers="
                f"{self.limits.max_receivers}"
            )
        return list(dict.fromkeys(env.receivers))

    def _validate(self, sender: str, envelopes: Sequence[Envelope]) -> None:
        lim = self.limits
        if len(envelopes) > lim.max_batch_messages:
            raise ResourceExhaustedError(
                f"batch of {len(envelopes)} messages is over max_batch_messages={lim.max_batch_messages}"
            )
        for env in envelopes:
            self._check_name("message_id", env.message_id)
            if env.sender != sender:
                raise InvalidArgumentError(
                    f"envelope sender {env.sender!r} differs from the caller {sender!r}"
                )
            if len(env.payload) > lim.max_payload_bytes:
                raise ResourceExhaustedError(
                    f"message {env.message_id!r} payload of {len(env.payload)} bytes is over "
                    f"max_payload_bytes={lim.max_payload_bytes}"
                )
            if env.ttl_s < 0 or env.sequence < 0:
                raise InvalidArgumentError(
                    f"message {env.message_id!r}: ttl_s={env.ttl_s} and sequence={env.sequence} must be >= 0"
                )

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
            The :class:`SendResult`.

        Raises:
            InvalidArgumentError: Bad ids, no receivers, sender mismatch, negative ttl or sequence.
            NotFoundError: Unknown session (auto-create off), or a receiver outside a fixed roster.
            ResourceExhaustedError: Batch, payload, receivers or a mailbox limit (named in the message).
        """
        t0 = time.perf_counter()
        self._check_name("sender", sender)
        session = self.session(session_name, create=True)
        try:
            result = self._send(session, sender, envelopes, broadcast)
        except (InvalidArgumentError, NotFoundError, ResourceExhaustedError):
            session.counters.rejected += 1
            raise
        session.counters.send_latency_s_sum += time.perf_counter() - t0
        session.counters.send_count += 1
        return result

    def _send(
        self, session: Session, sender: str, envelopes: Sequence[Envelope], broadcast: bool
    ) -> SendResult:
        lim = self.limits
        self._validate(sender, envelopes)
        self._mailbox(session, sender, create=True)
        now = self.clock()
        session.prune_dedup(now, lim.dedup_window_s, lim.max_dedup_entries)
        plan: list[tuple[Envelope, list[str]]] = []
        seen: set[str] = set()
        sequences: list[int] = []
        dedup = session.dedup
        last = start = session.last_seq.get(sender, 0)
        mailboxes = session.mailboxes
        for env in envelopes:
            mid = env.message_id
            if mid in dedup or mid in seen:
                sequences.append(0)
                continue
            seen.add(mid)
            seq = env.sequence or last + 1
            if seq > last:
                last = seq
            env = _replace(env, seq, now, broadcast)
            targets = self._targets(session, env)
            for t in targets:
                if t not in mailboxes:
                    self._mailbox(session, t, create=True)
            plan.append((env, targets))
            sequences.append(seq)
        per_box = self._check_capacity(session, plan)
        rows: list[StoredMessage] = []
        durable = self.store.durable
        default_ttl = lim.default_ttl_s
        enqueued = 0
        for box, items in per_box:
            in_flight = box._in_flight
            entries = []
            for env in items:
                if env.message_id in in_flight:
                    continue
                ttl = env.ttl_s or default_ttl
                entry = Entry(env, box.next_position(), 0, now + ttl if ttl > 0 else 0.0)
                if durable:
                    rows.append(StoredMessage(box.agent_id, entry.position, 0, entry.expires_at, env))
                entries.append(entry)
            items[:] = entries
            enqueued += len(entries)
        changed_seq = {sender: last} if last != start else {}
        if durable:
            self.store.record_send(
                session.name, rows, [(env.message_id, now) for env, _ in plan], changed_seq
            )
        for box, entries in per_box:
            box.add_many(entries)
        for env, _ in plan:
            dedup[env.message_id] = now
        session.last_seq.update(changed_seq)
        c = session.counters
        c.sent += len(plan)
        c.enqueued += enqueued
        c.duplicates += len(envelopes) - len(plan)
        return SendResult(len(plan), len(envelopes) - len(plan), enqueued, tuple(sequences))

    def _check_capacity(
        self, session: Session, plan: list[tuple[Envelope, list[str]]]
    ) -> list[tuple[Mailbox, list]]:
        """Checks every receiver's mailbox limits for the whole batch (atomic: before any change).

        Returns:
            ``(mailbox, envelopes for it)`` pairs in first-target order.

        Raises:
            MailboxFullError: A mailbox would exceed ``max_mailbox_messages`` or ``max_mailbox_bytes``.
        """
        lim = self.limits
        groups: dict[str, list[Envelope]] = {}
        for env, targets in plan:
            for t in targets:
                group = groups.get(t)
                if group is None:
                    groups[t] = [env]
                else:
                    group.append(env)
        out = []
        for t, items in groups.items():
            box = session.mailboxes[t]
            n = len(items)
            if box.count + n > lim.max_mailbox_messages:
                raise MailboxFullError(
                    f"mailbox of agent {t!r} holds {box.count} messages; {n} more would exceed "
                    f"max_mailbox_messages={lim.max_mailbox_messages}",
                    t,
                )
            nbytes = sum(env.size_bytes for env in items)
            if box.bytes + nbytes > lim.max_mailbox_bytes:
                raise MailboxFullError(
                    f"mailbox of agent {t!r} holds {box.bytes} bytes; {nbytes} more would exceed "
                    f"max_mailbox_bytes={lim.max_mailbox_bytes}",
                    t,
                )
            out.append((box, items))
        return out

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
                await self._wait((session_name, exc.agent), remaining)

    # ------------------------------------------------------------------ receive and ack
    def _expire_in_flight(self, session: Session, box: Mailbox, now: float) -> None:
        requeued, dead = box.expire_in_flight(now, self.limits.max_delivery_attempts)
        if requeued:
            session.counters.redelivered += len(requeued)
            self.store.record_attempts(
                session.name, box.agent_id, [(e.envelope.message_id, e.attempts) for e in requeued]
            )
        if dead:
            self._dead_letter(session, box.agent_id, dead, "max_delivery_attempts", now)

    def _dead_letter(
        self, session: Session, receiver: str, entries: list[Entry], reason: str, now: float
    ) -> None:
        letters = [DeadLetter(e.envelope, receiver, e.attempts, reason, now) for e in entries]
        self.store.record_dead(session.name, letters, self.limits.max_dead_letters)
        session.dead.extend(letters)
        while len(session.dead) > self.limits.max_dead_letters:
            session.dead.popleft()
        session.counters.dead_lettered += len(letters)

    def receive(
        self,
        session_name: str,
        agent: str,
        max_messages: int,
        topics: Iterable[str] = (),
        max_unacked: int | None = None,
    ) -> list[Delivery]:
        """Delivers up to ``max_messages`` messages at once (no waiting); they stay unacked until :meth:`ack`.

        Args:
            session_name: The session (created if allowed).
            agent: The receiving agent (joins if new).
            max_messages: 1..``max_batch_messages``.
            topics: Topics to subscribe the agent to first.
            max_unacked: Per-call cap on unacked deliveries (at most ``max_unacked_per_agent``).

        Returns:
            Deliveries; per sender in increasing sequence order.

        Raises:
            InvalidArgumentError: ``max_messages`` out of range or bad ids.
            NotFoundError: Unknown session (auto-create off) or agent outside a fixed roster.
        """
        if not 1 <= max_messages <= self.limits.max_batch_messages:
            raise InvalidArgumentError(
                f"max_messages={max_messages} is outside [1, max_batch_messages={self.limits.max_batch_messages}]"
            )
        box = self.join(session_name, agent, topics)
        session = self.sessions[session_name]
        now = self.clock()
        self._expire_in_flight(session, box, now)
        cap = min(max_unacked or self.limits.max_unacked_per_agent, self.limits.max_unacked_per_agent)
        expired: list[Entry] = []
        out = box.take(max_messages, now, self.limits.ack_timeout_s, cap, expired.append)
        if expired:
            session.counters.expired += len(expired)
            self.store.delete_messages(session.name, agent, [e.envelope.message_id for e in expired])
        c = session.counters
        c.delivered += len(out)
        for d in out:
            if d.attempt == 1 and d.envelope.sent_at:
                c.delivery_latency_s_sum += max(0.0, now - d.envelope.sent_at)
                c.delivery_count += 1
        return out

    async def receive_wait(
        self,
        session_name: str,
        agent: str,
        max_messages: int,
        timeout_s: float,
        topics: Iterable[str] = (),
        max_unacked: int | None = None,
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
            out = self.receive(session_name, agent, max_messages, topics, max_unacked)
            remaining = deadline - time.monotonic()
            if out or remaining <= 0:
                return out
            box = self.sessions[session_name].mailboxes[agent]
            nd = box.next_deadline()
            if nd is not None:
                remaining = min(remaining, max(nd - self.clock(), 0.001))
            await self._wait((session_name, agent), remaining)

    def ack(self, session_name: str, agent: str, message_ids: Sequence[str]) -> int:
        """Acks deliveries; unknown or already acked ids are ignored, so a retried Ack is harmless.

        Returns:
            How many deliveries were acked by this call.

        Raises:
            NotFoundError: Unknown session or agent.
            ResourceExhaustedError: More ids than ``max_batch_messages``.
        """
        if len(message_ids) > self.limits.max_batch_messages:
            raise ResourceExhaustedError(
                f"ack of {len(message_ids)} ids is over max_batch_messages={self.limits.max_batch_messages}"
            )
        session = self.session(session_name)
        box = self._mailbox(session, agent, create=False)
        ids = list(message_ids)
        in_flight = [m for m in ids if m in box._in_flight]
        if in_flight:
            self.store.delete_messages(session.name, agent, in_flight)
        done = box.ack(in_flight)
        session.counters.acked += len(done)
        return len(done)

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
        if len(value) > self.limits.max_state_bytes:
            raise ResourceExhaustedError(
                f"state of agent {agent!r} is {len(value)} bytes, over max_state_bytes={self.limits.max_state_bytes}"
            )
        self.join(session_name, agent)
        session = self.sessions[session_name]
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

    def get_states(self, session_name: str, agent: str = "", exclude_self: bool = True) -> list[AgentState]:
        """Returns the current board, sorted by agent id.

        Args:
            agent: The asking agent ("" for an observer); excluded from the result if ``exclude_self``.

        Raises:
            NotFoundError: Unknown session, or, in a fixed-roster session, an asking agent (observers ""
                included) outside the roster: the board is private to the roster.
        """
        session = self.session(session_name)
        if session.fixed_roster and agent not in session.mailboxes:
            raise NotFoundError(f"agent {agent!r} not found in session {session.name!r}")
        return [s for a, s in sorted(session.states.items()) if not (exclude_self and a == agent)]

    # ------------------------------------------------------------------ dead letters, stats, expiry
    def read_dead_letters(
        self, session_name: str, max_messages: int, receiver: str = "", remove: bool = False
    ) -> list[DeadLetter]:
        """Returns the oldest dead letters (optionally of one receiver), optionally removing them.

        Raises:
            NotFoundError: Unknown session.
            InvalidArgumentError: ``max_messages`` out of range.
        """
        if not 1 <= max_messages <= self.limits.max_batch_messages:
            raise InvalidArgumentError(
                f"max_messages={max_messages} is outside [1, max_batch_messages={self.limits.max_batch_messages}]"
            )
        session = self.session(session_name)
        self.tick_session(session, self.clock())
        out = [d for d in session.dead if not receiver or d.receiver == receiver][:max_messages]
        if remove and out and not receiver:
            for _ in out:
                session.dead.popleft()
            self.store.delete_dead(session.name, len(out))
        return out

    def tick_session(self, session: Session, now: float) -> None:
        """Requeues or dead-letters overdue in-flight deliveries of every mailbox of the session."""
        for box in session.mailboxes.values():
            self._expire_in_flight(session, box, now)

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

    # ------------------------------------------------------------------ waiting
    def _wake(self, key: tuple[str, str]) -> None:
        for fut in self._waiters.pop(key, ()):
            if not fut.done():
                fut.set_result(None)

    async def _wait(self, key: tuple[str, str], timeout_s: float) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, []).append(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(key)
            if waiters and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    del self._waiters[key]

    # ------------------------------------------------------------------ restore
    def _restore(self) -> None:
        now = self.clock()
        for stored in self.store.load():
            session = Session(stored.name, stored.created_at, now, stored.fixed_roster, stored.dictionary)
            self.sessions[stored.name] = session
            for agent, topics in stored.agents.items():
                key = (stored.name, agent)
                box = session.mailboxes[agent] = Mailbox(agent, on_change=lambda key=key: self._wake(key))
                box.topics = set(topics)
                for t in topics:
                    session.topics.setdefault(t, set()).add(agent)
            for m in stored.messages:
                box = session.mailboxes.get(m.receiver)
                if box is None:
                    key = (stored.name, m.receiver)
                    box = session.mailboxes[m.receiver] = Mailbox(m.receiver, lambda key=key: self._wake(key))
                box.add(Entry(m.envelope, m.position, m.attempts, m.expires_at))
            session.states = {s.agent_id: s for s in stored.states}
            session.dedup.update(stored.dedup)
            session.last_seq = dict(stored.last_seq)
            session.dead = deque(stored.dead[-self.limits.max_dead_letters :])


def _replace(env: Envelope, seq: int, now: float, broadcast: bool) -> Envelope:
    if env.sequence == seq and env.sent_at and not (broadcast and not env.broadcast):
        return env
    return Envelope(
        message_id=env.message_id,
        sender=env.sender,
        payload=env.payload,
        content_type=env.content_type,
        receivers=() if broadcast else env.receivers,
        topic="" if broadcast else env.topic,
        broadcast=env.broadcast or broadcast,
        sequence=seq,
        sent_at=env.sent_at or now,
        ttl_s=env.ttl_s,
    )  # ``wire`` is left empty: it no longer matches the fields
