"""Domain types of the broker SDK: delivered messages, board entries, stats, publish results, errors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from marti.errors import FailedPreconditionError, InternalError, MartiError


class Message(NamedTuple):
    """A delivered message (immutable; a ``NamedTuple`` because one is built per received message and a
    named tuple is several times cheaper to build than a frozen dataclass).

    Attributes:
        message_id: The sender's id (pass it to ``ack`` when auto-ack is off).
        sender: Sender agent id.
        content: The decoded payload: a JSON value for ``application/json``, else the raw ``bytes``.
        content_type: Media type of the payload.
        payload: The raw payload bytes.
        sequence: Per-sender sequence number (increasing per sender, per receiver).
        sent_at: Sender's wall-clock send time, seconds since the epoch.
        receivers: Addressed agents (empty for topic and broadcast messages).
        topic: Topic it was published on ("" if none).
        broadcast: Whether it was a broadcast.
        attempt: Delivery attempt (1 = first delivery).
    """

    message_id: str
    sender: str
    content: Any
    content_type: str
    payload: bytes
    sequence: int
    sent_at: float
    receivers: tuple[str, ...] = ()
    topic: str = ""
    broadcast: bool = False
    attempt: int = 1


class PublishResult(NamedTuple):
    """What :meth:`MartiCommClient.publish` or :meth:`MartiCommClient.broadcast` learned from the broker.

    Topic messages and broadcasts are not stored for later members (as with Redis pub/sub or NATS core): a
    message reaches the agents subscribed to the topic (or, for a broadcast, every other agent that has joined
    the session) when the broker accepts it, and nobody else, ever.

    Attributes:
        message_id: The message id.
        receivers: Agents the message was enqueued for (0: nobody was subscribed or joined; it is gone).
        duplicate: The broker had already accepted this message id (a transport-level retry of a Send that
            had reached it): the first copy went to the agents of that moment, whose number is not known
            here, and ``receivers`` is 0.
    """

    message_id: str
    receivers: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message the broker gave up delivering, as ``read_dead_letters`` returns it.

    One whose payload does not decode (declared ``application/json`` and not parsing) is returned too, with
    ``message`` None, its raw ``payload`` and the ``decode_error``: a dead-letter queue is where such messages
    end up.

    Attributes:
        message: The message as ``get_messages`` would have handed it out (``attempt``: its last delivery
            attempt), or None when its payload does not decode.
        message_id: The sender's id of the message.
        sender: Sender agent id.
        content_type: Media type of the payload.
        payload: The raw payload bytes.
        receiver: The agent it was addressed to (a broadcast or topic message dies once per receiver).
        attempts: How many times the broker delivered it without an ack.
        reason: Why it died: ``"max_delivery_attempts"`` (delivered that many times, never acked), the
            only reason the broker gives.
        dead_at: When it was dead-lettered, seconds since the epoch (the broker's clock).
        decode_error: Why the payload does not decode (the text of the ``InvalidArgumentError`` that
            ``get_messages`` raised for it), or None.
    """

    message: Message | None
    message_id: str
    sender: str
    content_type: str
    payload: bytes
    receiver: str
    attempts: int
    reason: str
    dead_at: float
    decode_error: str | None = None


@dataclass(frozen=True, slots=True)
class AgentStateEntry:
    """One entry of the state board.

    Attributes:
        agent_id: Owner.
        value: Decoded value (JSON value, or bytes for other content types).
        content_type: Media type.
        version: Compare-and-set version (1 after the first put).
        updated_at: Time of the last put, seconds since the epoch.
    """

    agent_id: str
    value: Any
    content_type: str
    version: int
    updated_at: float


@dataclass(frozen=True, slots=True)
class CommunicationStats:
    """What this client measured.

    Attributes:
        total_sent: Messages the broker acknowledged (duplicates included).
        total_received: Messages handed to the caller (redeliveries dropped by the client not counted).
        compression_ratio: Uncompressed / wire bytes over every frame this client sent and received
            (1.0 before any traffic).
        avg_send_latency: Mean seconds from ``send_message``/``broadcast`` to the broker's acknowledgement
            of the batch carrying the message (batching delay included).
        avg_receive_latency: Mean seconds from a message's ``sent_at`` to its arrival at this client.
        bytes_sent_raw / bytes_sent_wire: Uncompressed / wire bytes of frames sent.
        bytes_received_raw / bytes_received_wire: Uncompressed / wire bytes of frames received.
        refused_batches / refused_messages: Batches (and the messages in them) the broker refused
            (limits, bad input, permissions); each was reported as a :class:`BatchRefusedError`.
    """

    total_sent: int
    total_received: int
    compression_ratio: float
    avg_send_latency: float
    avg_receive_latency: float
    bytes_sent_raw: int = 0
    bytes_sent_wire: int = 0
    bytes_received_raw: int = 0
    bytes_received_wire: int = 0
    refused_batches: int = 0
    refused_messages: int = 0


class BatchRefusedError(MartiError):
    """The broker refused a batch of messages (it was not delivered to anyone and is not retried).

    Never raised as this class alone: :func:`batch_refused` builds an instance of a class that derives
    from both ``BatchRefusedError`` and the class of the broker's error, so
    ``except ResourceExhaustedError`` (or ``InvalidArgumentError``, ``NotFoundError``...) still catches it.

    Attributes:
        message_ids: Ids of every message of the refused batch, in send order.
        cause: The broker's error (its class is the status code of the refusal; its ``metadata`` is this
            error's too, so the cause class's properties, e.g. ``max_frame_bytes``, read the same).
        background: True if the flush timer sent the batch, so it is raised by the client's next call.
    """

    def __init__(
        self, message: str, message_ids: Sequence[str], cause: MartiError, background: bool = False
    ) -> None:
        super().__init__(message)
        self.metadata = dict(cause.metadata)  # the cause's limits and ids, e.g. max_frame_bytes
        self.message_ids = tuple(message_ids)
        self.cause = cause
        self.background = background

    def __reduce__(self):
        return (batch_refused, (self.cause, self.message_ids, self.background))


_REFUSED_CLASSES: dict[type, type] = {}


def batch_refused(
    cause: BaseException, message_ids: Sequence[str], background: bool = False
) -> BatchRefusedError:
    """Builds the error that reports a refused batch.

    Args:
        cause: What sending the batch raised; a non-marti exception is wrapped as :class:`InternalError`.
        message_ids: Ids of the batch's messages.
        background: Whether the flush timer sent it.

    Returns:
        An instance of ``BatchRefusedError`` and of ``type(cause)`` (e.g. ``ResourceExhaustedError``).
    """
    if not isinstance(cause, MartiError):
        cause = InternalError(f"sending a batch failed: {type(cause).__name__}: {cause}")
    base = type(cause)
    if isinstance(cause, BatchRefusedError):
        base = type(cause.cause)
        cause = cause.cause
    cls = _REFUSED_CLASSES.get(base)
    if cls is None:
        cls = _REFUSED_CLASSES[base] = type(
            f"BatchRefused{base.__name__}", (BatchRefusedError, base), {"__module__": __name__}
        )
    ids = tuple(message_ids)
    shown = ", ".join(ids[:5]) + (f", ... ({len(ids)} in all)" if len(ids) > 5 else "")
    how = "flushed by the timer " if background else ""
    text = f"the broker refused a batch of {len(ids)} message(s) {how}(ids {shown}): {cause.message}"
    err = cls.__new__(cls)
    BatchRefusedError.__init__(err, text, ids, cause, background)
    return err


class NoSubscribersError(FailedPreconditionError):
    """``publish(..., require_subscribers=True)`` found nobody subscribed to the topic (FAILED_PRECONDITION).

    The message reached no one and is not stored for later subscribers.

    Args:
        message: Names the topic and the message id.
        topic: The topic.
        message_id: The id of the message that reached no one.
    """

    def __init__(self, message: str, topic: str, message_id: str) -> None:
        super().__init__(message)
        self.topic = topic
        self.message_id = message_id

    def __reduce__(self):
        return (type(self), (self.message, self.topic, self.message_id))
