"""Mailboxes of the broker core: membership and topics, delivery, acks, redelivery, dead letters, waiting.

Pure Python, single-threaded like the rest of the core. The :class:`Mailboxes` component owns everything
that happens inside an agent's mailbox once a message is in it; :mod:`.routing` puts messages in, and the
:class:`~.broker.Broker` facade resolves session names before calling here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence

from marti.errors import BatchTooLargeError, InvalidArgumentError, NotFoundError, ResourceExhaustedError

from .limits import BrokerLimits, check_name
from .mailbox import Entry, Mailbox
from .session import Session
from .store import Store
from .types import ByteBudget, DeadLetter, Delivery


class Mailboxes:
    """Creates mailboxes, subscribes agents to topics, delivers, acks and dead-letters messages.

    Args:
        limits: Limits and timings.
        store: Write-ahead store; every durable change is written before the method returns.
        clock: Wall-clock seconds since the epoch.
    """

    def __init__(self, limits: BrokerLimits, store: Store, clock: Callable[[], float]) -> None:
        self.limits = limits
        self.store = store
        self.clock = clock
        self._waiters: dict[tuple[str, str], list[asyncio.Future]] = {}

    # ------------------------------------------------------------------ membership
    def new_box(self, session: Session, agent: str) -> Mailbox:
        """Makes a mailbox whose changes wake the waiters of ``(session, agent)`` (not yet registered)."""
        key = (session.name, agent)
        return Mailbox(agent, on_change=lambda: self.wake(key))

    def get(self, session: Session, agent: str, create: bool) -> Mailbox:
        """Returns the agent's mailbox, creating it if allowed.

        Args:
            session: The session.
            agent: The agent id.
            create: Create the mailbox (and persist the membership) if missing.

        Raises:
            InvalidArgumentError: Bad agent id.
            NotFoundError: Missing and ``create`` is false, or the agent is outside a fixed roster.
            ResourceExhaustedError: ``max_agents_per_session`` reached.
        """
        box = session.mailboxes.get(agent)
        if box is not None:
            return box
        check_name(self.limits, "agent id", agent)
        if not create or (session.fixed_roster and session.mailboxes):
            raise NotFoundError(f"agent {agent!r} not found in session {session.name!r}")
        if len(session.mailboxes) >= self.limits.max_agents_per_session:
            raise ResourceExhaustedError(
                f"cannot add agent {agent!r} to session {session.name!r}: max_agents_per_session="
                f"{self.limits.max_agents_per_session} reached"
            )
        box = self.new_box(session, agent)
        session.mailboxes[agent] = box
        self.store.put_agent(session.name, agent, box.topics)
        return box

    def join(self, session: Session, agent: str, topics: Iterable[str] = ()) -> Mailbox:
        """Makes ``agent`` a member of ``session`` and subscribes it to ``topics``.

        Raises:
            NotFoundError: Agent outside a fixed roster.
            ResourceExhaustedError: Agent or ``max_topics_per_agent`` limit reached.
            InvalidArgumentError: Bad agent id or topic.
        """
        box = self.get(session, agent, create=True)
        new = [t for t in topics if t not in box.topics]
        if new:
            for topic in new:
                check_name(self.limits, "topic", topic)
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

    # ------------------------------------------------------------------ delivery
    def check_max_messages(self, max_messages: int, name: str = "max_messages") -> None:
        """Checks a per-call message count (Receive, ReadDeadLetters; Subscribe's ``max_batch_messages``).

        Raises:
            InvalidArgumentError: ``max_messages`` outside ``[1, max_batch_messages]``, named ``name``.
        """
        if not 1 <= max_messages <= self.limits.max_batch_messages:
            raise InvalidArgumentError(
                f"{name}={max_messages} is outside [1, max_batch_messages={self.limits.max_batch_messages}]"
            )

    def frame_cap(self, max_bytes: int | None) -> int:
        """Byte bound of one delivered frame or dead-letter response: ``max_bytes`` (the caller's; None or 0:
        none given), at most ``max_frame_bytes``."""
        return min(max_bytes or self.limits.max_frame_bytes, self.limits.max_frame_bytes)

    def receive(
        self,
        session: Session,
        agent: str,
        max_messages: int,
        topics: Iterable[str] = (),
        max_unacked: int | None = None,
        max_bytes: int | None = None,
    ) -> list[Delivery]:
        """Delivers up to ``max_messages`` messages of the agent at once (no waiting); they stay unacked.

        Args:
            session: The session.
            agent: The receiving agent (joins if new).
            max_messages: Most deliveries (checked by the caller with :meth:`check_max_messages`).
            topics: Topics to subscribe the agent to first.
            max_unacked: Per-call cap on unacked deliveries (at most ``max_unacked_per_agent``).
            max_bytes: Most bytes of the delivered frame (at most ``max_frame_bytes``, its default); at least
                one message is delivered, however large.

        Returns:
            Deliveries; per sender in increasing sequence order.

        Raises:
            The errors of :meth:`join`.
        """
        box = self.join(session, agent, topics)
        now = self.clock()
        self.expire_in_flight(session, box, now)
        cap = min(max_unacked or self.limits.max_unacked_per_agent, self.limits.max_unacked_per_agent)
        expired: list[Entry] = []
        frame_cap = self.frame_cap(max_bytes)
        out = box.take(max_messages, now, self.limits.ack_timeout_s, cap, expired.append, frame_cap)
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

    def check_ack_size(self, message_ids: Sequence[str]) -> None:
        """Checks the number of ids of one Ack.

        Raises:
            BatchTooLargeError: More ids than ``max_batch_messages`` (a ResourceExhaustedError whose ErrorInfo
                names the limit: the SDK acks such a list in parts under it).
        """
        if len(message_ids) > self.limits.max_batch_messages:
            raise BatchTooLargeError(
                f"ack of {len(message_ids)} ids is over max_batch_messages={self.limits.max_batch_messages}",
                max_batch_messages=self.limits.max_batch_messages,
            )

    def ack(self, session: Session, agent: str, message_ids: Sequence[str]) -> int:
        """Acks deliveries; unknown or already acked ids are ignored, so a retried Ack is harmless.

        Returns:
            How many deliveries were acked by this call.

        Raises:
            NotFoundError: Unknown agent.
        """
        box = self.get(session, agent, create=False)
        ids = list(message_ids)
        in_flight = [m for m in ids if m in box._in_flight]
        if in_flight:
            self.store.delete_messages(session.name, agent, in_flight)
        done = box.ack(in_flight)
        session.counters.acked += len(done)
        return len(done)

    def release(self, session: Session, agent: str, message_ids: Sequence[str]) -> int:
        """Puts deliveries that never reached ``agent`` back as pending, their attempt not counted
        (:meth:`Mailbox.release`); returns how many. Unknown or acked ids are ignored.

        Raises:
            NotFoundError: Unknown agent.
        """
        return len(self.get(session, agent, create=False).release(message_ids))

    # ------------------------------------------------------------------ redelivery and dead letters
    def expire_in_flight(self, session: Session, box: Mailbox, now: float) -> None:
        """Requeues the box's overdue in-flight deliveries, or dead-letters those out of attempts."""
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

    def tick_session(self, session: Session, now: float) -> None:
        """Requeues or dead-letters overdue in-flight deliveries of every mailbox of the session."""
        for box in session.mailboxes.values():
            self.expire_in_flight(session, box, now)

    def read_dead_letters(
        self,
        session: Session,
        max_messages: int,
        receiver: str = "",
        remove: bool = False,
        max_bytes: int | None = None,
    ) -> list[DeadLetter]:
        """Returns the oldest dead letters (optionally of one receiver), optionally removing them (only when
        ``receiver`` is empty: the removed ones are the oldest of the session).

        ``max_messages`` is checked by the caller with :meth:`check_max_messages`. ``max_bytes`` bounds the
        returned letters' bytes (:attr:`DeadLetter.delivery_bytes` summed; at most and by default
        ``max_frame_bytes``) as a delivered frame is bounded (:class:`ByteBudget`): fewer than
        ``max_messages`` rather than more bytes, but at least one letter, however large, when one is there.
        """
        self.tick_session(session, self.clock())
        budget = ByteBudget(self.frame_cap(max_bytes))
        out: list[DeadLetter] = []
        for d in session.dead:
            if receiver and d.receiver != receiver:
                continue
            if len(out) == max_messages or not budget.admit(d.delivery_bytes):
                break
            out.append(d)
        if remove and out and not receiver:
            for _ in out:
                session.dead.popleft()
            self.store.delete_dead(session.name, len(out))
        return out

    # ------------------------------------------------------------------ waiting
    def wake(self, key: tuple[str, str]) -> None:
        """Wakes every coroutine waiting on mailbox ``(session, agent)``."""
        for fut in self._waiters.pop(key, ()):
            if not fut.done():
                fut.set_result(None)

    async def wait(self, key: tuple[str, str], timeout_s: float) -> None:
        """Waits until mailbox ``(session, agent)`` changes or ``timeout_s`` seconds pass (no error)."""
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
