"""Domain types of the comm_broker core (no grpc, no protobuf).

Times are wall-clock seconds since the Unix epoch (float) inside the core; the protocol carries
microseconds (``*_unix_us``). Sizes are bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class Envelope(NamedTuple):
    """One message from one sender, as the broker stores and delivers it (immutable).

    A ``NamedTuple`` rather than a frozen dataclass: it is built once per message on the hot path, and a
    named tuple is built several times faster (a frozen dataclass sets every field through
    ``object.__setattr__``).

    Attributes:
        message_id: Sender-chosen id, unique within the session; the dedup key (a retried Send with the
            same id is delivered once while the id is inside the dedup window).
        sender: Agent id of the sender (any non-empty unicode string up to ``max_agent_id_chars``).
        receivers: Target agent ids (empty when ``topic`` or ``broadcast`` is used).
        topic: Topic name; every agent subscribed to it (except the sender) receives a copy.
        broadcast: If true, every known agent of the session except the sender receives a copy.
        sequence: Per-sender sequence number (>= 1); per receiver, messages of one sender are delivered in
            increasing sequence order. 0 means "let the broker assign the next one".
        sent_at: Wall-clock send time in seconds since the epoch (set by the sender; used for latency).
        content_type: MIME-like type of ``payload``, e.g. ``application/json``; the broker never parses it.
        payload: Opaque bytes (may be empty).
        ttl_s: Time to live in seconds after ``sent_at``; 0 means the session default (or no expiry).
        wire: The envelope exactly as it travels on the wire (opaque bytes for the core), or ``b""``.
            The protocol adapter fills it when it parses a frame, so delivery can copy these bytes into
            the outgoing frame instead of building and serializing the message again; the core never
            reads it, and it must describe the same message as the fields above (the core drops it
            whenever it changes a field, e.g. assigns a sequence number).
    """

    message_id: str
    sender: str
    payload: bytes = b""
    content_type: str = "application/octet-stream"
    receivers: tuple[str, ...] = ()
    topic: str = ""
    broadcast: bool = False
    sequence: int = 0
    sent_at: float = 0.0
    ttl_s: float = 0.0
    wire: bytes = b""

    @property
    def size_bytes(self) -> int:
        """Footprint in a mailbox, bytes: payload plus ids and content type (characters) plus 32, or the
        wire size plus 32 if that is larger (so unknown fields carried in ``wire`` are counted too)."""
        size = len(self.payload) + len(self.message_id) + len(self.sender) + len(self.content_type) + 32
        return max(size, len(self.wire) + 32)

    @property
    def delivery_bytes(self) -> int:
        """Upper bound of the bytes this envelope takes in a delivered ``EnvelopeBatch`` (its field tag and
        length, its serialized fields and the trailing ``delivery_attempt`` record): ``len(wire) + 17`` when
        it carries its wire bytes, else the payload plus 4 bytes per character of every string (UTF-8), 6
        bytes of tag and length per string and 64 for the scalar fields."""
        if self.wire:
            return len(self.wire) + 17
        strings = (self.message_id, self.sender, self.topic, self.content_type, *self.receivers)
        return len(self.payload) + sum(4 * len(t) + 6 for t in strings) + 6 + 64


class ByteBudget:
    """The byte bound of one delivered frame (Receive, Subscribe) or one ReadDeadLettersResponse: items are
    admitted while their bytes fit what is left, and the first one always, so that an item larger than the
    bound still goes out, alone (a bound that never let it out would fail every call the same way).

    Args:
        max_bytes: The bound, bytes (an upper bound of each item's serialized size is counted against it);
            None: no bound.
    """

    __slots__ = ("_first", "_left")

    def __init__(self, max_bytes: int | None) -> None:
        self._left = -1 if max_bytes is None else max_bytes
        self._first = True

    def admit(self, nbytes: int) -> bool:
        """Takes ``nbytes`` (bytes, >= 0) of the next item from the budget; False (nothing taken) when the
        item is not the first and does not fit what is left: the frame is full and the item waits."""
        if self._left < 0:
            return True
        if nbytes > self._left and not self._first:
            return False
        self._left = max(self._left - nbytes, 0)
        self._first = False
        return True


class Delivery(NamedTuple):
    """One delivery of an envelope to a receiver (immutable; a ``NamedTuple`` for speed, like Envelope).

    Attributes:
        envelope: The message (with its final sequence number).
        receiver: The agent id it is delivered to.
        attempt: 1 on the first delivery, 2 on the first redelivery after an ack timeout, and so on.
    """

    envelope: Envelope
    receiver: str
    attempt: int


@dataclass(frozen=True, slots=True)
class AgentState:
    """The last value an agent posted on its session's state board.

    Attributes:
        agent_id: The owner of the entry.
        value: Opaque bytes (JSON by default in the SDK).
        content_type: Type of ``value``.
        version: 1 after the first put, incremented by one on every put (compare-and-set key).
        updated_at: Wall-clock time of the last put, seconds since the epoch.
    """

    agent_id: str
    value: bytes
    content_type: str
    version: int
    updated_at: float


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message that left a mailbox without being acked.

    Attributes:
        envelope: The message.
        receiver: The agent it was addressed to.
        attempts: How many times it was delivered.
        reason: ``"max_delivery_attempts"`` (never acked) or ``"mailbox_expired"``.
        dead_at: Wall-clock time it was dead-lettered, seconds since the epoch.
    """

    envelope: Envelope
    receiver: str
    attempts: int
    reason: str
    dead_at: float

    @property
    def delivery_bytes(self) -> int:
        """Upper bound of the bytes this dead letter takes in a ``ReadDeadLettersResponse``: its envelope's
        :attr:`Envelope.delivery_bytes` (the envelope with its field tag and length), 4 bytes per character
        plus 6 of tag and length for ``receiver`` and ``reason``, 6 for ``attempts``, 11 for the time and 6
        for the dead letter's own field tag and length."""
        strings = 4 * (len(self.receiver) + len(self.reason)) + 12
        return self.envelope.delivery_bytes + strings + 6 + 11 + 6


@dataclass(frozen=True, slots=True)
class SendResult:
    """Outcome of one Send or Broadcast call.

    Attributes:
        accepted: Envelopes accepted (not duplicates).
        duplicates: Envelopes dropped because their message_id was inside the dedup window.
        enqueued: Mailbox entries created (one per receiver of each accepted envelope).
        sequences: The final sequence number of each input envelope, in input order (duplicates: 0).
    """

    accepted: int
    duplicates: int
    enqueued: int
    sequences: tuple[int, ...] = ()


@dataclass(slots=True)
class Counters:
    """Monotonic counters kept per session and for the whole broker.

    Attributes:
        sent: Envelopes accepted by Send/Broadcast.
        enqueued: Mailbox entries created (fan-out counted once per receiver).
        delivered: Deliveries handed out (first deliveries plus redeliveries).
        redelivered: Deliveries after an ack timeout.
        acked: Deliveries acked.
        expired: Messages dropped because their TTL passed before delivery.
        dead_lettered: Messages moved to the dead-letter queue.
        duplicates: Envelopes dropped by dedup.
        rejected: Sends refused (limits, bad input).
        bytes_in_raw / bytes_in_wire: Uncompressed / compressed bytes of frames received from senders.
        bytes_out_raw / bytes_out_wire: Uncompressed / compressed bytes of frames sent to receivers.
        send_latency_s_sum / send_count: Sum and count of server-side Send handling times (seconds).
        delivery_latency_s_sum / delivery_count: Sum and count of (delivery time - sent_at) (seconds).
    """

    sent: int = 0
    enqueued: int = 0
    delivered: int = 0
    redelivered: int = 0
    acked: int = 0
    expired: int = 0
    dead_lettered: int = 0
    duplicates: int = 0
    rejected: int = 0
    bytes_in_raw: int = 0
    bytes_in_wire: int = 0
    bytes_out_raw: int = 0
    bytes_out_wire: int = 0
    send_latency_s_sum: float = 0.0
    send_count: int = 0
    delivery_latency_s_sum: float = 0.0
    delivery_count: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    def add(self, other: Counters) -> None:
        """Adds every counter of ``other`` into this one (used to aggregate sessions)."""
        for name in self.__slots__:
            if name == "extra":
                continue
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def compression_ratio(self) -> float:
        """Raw bytes / wire bytes over all frames in and out; 1.0 before any traffic."""
        wire = self.bytes_in_wire + self.bytes_out_wire
        raw = self.bytes_in_raw + self.bytes_out_raw
        return raw / wire if wire else 1.0


@dataclass(frozen=True, slots=True)
class StatsSnapshot:
    """Counters plus gauges, for one session or for the whole broker.

    Attributes:
        counters: A copy of the counters.
        sessions: Live sessions (1 for a session snapshot).
        agents: Known agents (mailboxes).
        pending: Messages waiting in mailboxes (not yet delivered or back after an ack timeout).
        in_flight: Delivered, not yet acked.
        mailbox_bytes: Bytes held in mailboxes.
        dead_letters: Entries in dead-letter queues.
    """

    counters: Counters
    sessions: int
    agents: int
    pending: int
    in_flight: int
    mailbox_bytes: int
    dead_letters: int
