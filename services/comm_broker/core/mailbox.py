"""One agent's mailbox: bounded, per-sender FIFO, at-least-once with ack timeouts.

Ordering scheme. Every enqueued entry gets a mailbox *position* (arrival order). The mailbox keeps

* a global heap of *slots* ``(position, sender)``, one per pending entry, and
* one heap per sender of ``(sequence, position, entry)``.

To deliver, it pops the lowest slot, which says *whose turn it is*, and hands out that sender's pending
entry with the **lowest sequence number**. Arrival order is kept across senders, and per sender the
pending entries always leave in sequence order even if a retried Send arrives after a later one. A
redelivered entry goes back with its original position, so it is next in line.

At-least-once: a delivered entry stays *in flight* until acked. If ``ack_timeout_s`` passes, it goes back
to pending (attempt + 1); after ``max_delivery_attempts`` it leaves as a dead letter.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .types import ByteBudget, Delivery, Envelope


@dataclass(slots=True)
class Entry:
    """A message in a mailbox.

    Attributes:
        envelope: The message.
        position: Arrival position in this mailbox (restored from the store after a restart).
        attempts: Deliveries so far.
        expires_at: Wall-clock time (s) after which it is dropped undelivered (0: never).
        deadline: While in flight, the wall-clock time (s) after which it is redelivered.
        size: Bytes it counts against ``max_mailbox_bytes`` (``envelope.size_bytes``, set by
            :meth:`Mailbox.add` once, so accounting never recomputes it).
    """

    envelope: Envelope
    position: int
    attempts: int = 0
    expires_at: float = 0.0
    deadline: float = 0.0
    size: int = 0


class Mailbox:
    """Messages addressed to one agent of one session.

    Args:
        agent_id: The owner.
        on_change: Called with no arguments whenever messages become available or space is freed
            (the async layer wakes its waiters from it).
    """

    def __init__(self, agent_id: str, on_change: Callable[[], None] | None = None) -> None:
        self.agent_id = agent_id
        self.topics: set[str] = set()
        self._on_change = on_change or (lambda: None)
        self._slots: list[tuple[int, str]] = []
        self._by_sender: dict[str, list[tuple[int, int, Entry]]] = {}
        self._in_flight: dict[str, Entry] = {}
        self._deadlines: list[tuple[float, int, str]] = []
        self._next_position = 1
        self.count = 0
        self.bytes = 0

    @property
    def pending(self) -> int:
        """Entries waiting for delivery."""
        return len(self._slots)

    @property
    def in_flight(self) -> int:
        """Entries delivered and not yet acked."""
        return len(self._in_flight)

    def next_position(self) -> int:
        """Reserves and returns the next arrival position."""
        pos = self._next_position
        self._next_position += 1
        return pos

    def _put(self, entry: Entry) -> None:
        if entry.position >= self._next_position:
            self._next_position = entry.position + 1
        env = entry.envelope
        sender = env.sender
        heapq.heappush(self._slots, (entry.position, sender))
        heap = self._by_sender.get(sender)
        if heap is None:
            heap = self._by_sender[sender] = []
        heapq.heappush(heap, (env.sequence, entry.position, entry))

    def put(self, entry: Entry) -> None:
        """Adds an entry as pending (new, restored or redelivered).

        Args:
            entry: The entry; its ``position`` decides its turn among senders.
        """
        self._put(entry)
        self._on_change()

    def add(self, entry: Entry) -> None:
        """Adds a new entry and accounts for its size (use :meth:`put` for redelivery)."""
        self.add_many((entry,))

    def add_many(self, entries: Sequence[Entry]) -> None:
        """Adds new entries, accounts for their sizes, and calls ``on_change`` once (not per entry).

        Args:
            entries: New entries (positions from :meth:`next_position` or restored from storage).
        """
        for entry in entries:
            entry.size = entry.envelope.size_bytes
            self.count += 1
            self.bytes += entry.size
            self._put(entry)
        if entries:
            self._on_change()

    def _pop_pending(self) -> Entry:
        _, sender = heapq.heappop(self._slots)
        heap = self._by_sender[sender]
        _, _, entry = heapq.heappop(heap)
        if not heap:
            del self._by_sender[sender]
        return entry

    def _drop(self, entry: Entry) -> None:
        self.count -= 1
        self.bytes -= entry.size

    def take(
        self,
        max_messages: int,
        now: float,
        ack_timeout_s: float,
        max_unacked: int,
        on_expired: Callable[[Entry], None],
        max_bytes: int | None = None,
    ) -> list[Delivery]:
        """Delivers up to ``max_messages`` pending entries and marks them in flight.

        Args:
            max_messages: Upper bound on deliveries returned.
            now: Current wall-clock time (s).
            ack_timeout_s: In-flight time before redelivery (s).
            max_unacked: Cap on in-flight entries of this mailbox; no delivery beyond it.
            on_expired: Called with each expired entry, which is dropped (not delivered).
            max_bytes: Upper bound on the deliveries' bytes in a frame (``Envelope.delivery_bytes`` summed,
                :class:`ByteBudget`); the first delivery is returned even if it alone is larger. None: no bound.

        Returns:
            Deliveries in delivery order (per sender: increasing sequence).
        """
        out: list[Delivery] = []
        slots, in_flight, deadlines = self._slots, self._in_flight, self._deadlines
        by_sender, agent = self._by_sender, self.agent_id
        deadline = now + ack_timeout_s
        heappop, heappush = heapq.heappop, heapq.heappush
        budget = ByteBudget(max_bytes)
        while slots and len(out) < max_messages and len(in_flight) < max_unacked:
            sender = slots[0][1]
            heap = by_sender[sender]
            entry = heap[0][2]
            if entry.expires_at and now >= entry.expires_at:
                self._pop_pending()
                self._drop(entry)
                on_expired(entry)
                continue
            if not budget.admit(entry.envelope.delivery_bytes):  # the frame is full: the entry waits
                break
            heappop(slots)
            heappop(heap)
            if not heap:
                del by_sender[sender]
            entry.attempts += 1
            entry.deadline = deadline
            mid = entry.envelope.message_id
            in_flight[mid] = entry
            heappush(deadlines, (deadline, entry.position, mid))
            out.append(Delivery(entry.envelope, agent, entry.attempts))
        return out

    def ack(self, message_ids: list[str]) -> list[Entry]:
        """Acks in-flight entries; unknown or already-acked ids are ignored (acks are idempotent).

        Returns:
            The entries that were acked now.
        """
        done = []
        for mid in message_ids:
            entry = self._in_flight.pop(mid, None)
            if entry is not None:
                self._drop(entry)
                done.append(entry)
        if done:
            self._on_change()
        return done

    def release(self, message_ids: Sequence[str]) -> list[Entry]:
        """Puts in-flight entries that never reached their receiver (the stream that was sending them ended
        first) back as pending, in their turn, with that attempt not counted; unknown or acked ids are ignored.

        Returns:
            The entries put back.
        """
        back = []
        for mid in message_ids:
            entry = self._in_flight.pop(mid, None)
            if entry is not None:
                entry.attempts -= 1
                entry.deadline = 0.0  # its deadline in the heap no longer matches: skipped (next_deadline)
                self._put(entry)
                back.append(entry)
        if back:
            self._on_change()
        return back

    def next_deadline(self) -> float | None:
        """Earliest in-flight deadline (s since epoch), or None when nothing is in flight."""
        while self._deadlines:
            deadline, _, mid = self._deadlines[0]
            entry = self._in_flight.get(mid)
            if entry is not None and entry.deadline == deadline:
                return deadline
            heapq.heappop(self._deadlines)
        return None

    def expire_in_flight(self, now: float, max_attempts: int) -> tuple[list[Entry], list[Entry]]:
        """Moves in-flight entries past their deadline back to pending, or out as dead letters.

        Args:
            now: Current wall-clock time (s).
            max_attempts: Entries delivered this many times are removed instead of requeued.

        Returns:
            ``(requeued, dead)`` entries.
        """
        requeued: list[Entry] = []
        dead: list[Entry] = []
        while True:
            deadline = self.next_deadline()
            if deadline is None or deadline > now:
                break
            _, _, mid = heapq.heappop(self._deadlines)
            entry = self._in_flight.pop(mid)
            if entry.attempts >= max_attempts:
                self._drop(entry)
                dead.append(entry)
            else:
                self._put(entry)
                requeued.append(entry)
        if requeued or dead:
            self._on_change()
        return requeued, dead

    def drain(self) -> list[Entry]:
        """Removes and returns every entry (pending and in flight), e.g. when the session expires."""
        entries = list(self._in_flight.values())
        while self._slots:
            entries.append(self._pop_pending())
        self._in_flight.clear()
        self._deadlines.clear()
        self.count = 0
        self.bytes = 0
        return entries
