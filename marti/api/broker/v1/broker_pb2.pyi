from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Envelope(_message.Message):
    __slots__ = ("message_id", "sender", "receivers", "topic", "broadcast", "sequence", "sent_at_unix_us", "content_type", "payload", "ttl_ms", "delivery_attempt")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RECEIVERS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BROADCAST_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_UNIX_US_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    sender: str
    receivers: _containers.RepeatedScalarFieldContainer[str]
    topic: str
    broadcast: bool
    sequence: int
    sent_at_unix_us: int
    content_type: str
    payload: bytes
    ttl_ms: int
    delivery_attempt: int
    def __init__(self, message_id: _Optional[str] = ..., sender: _Optional[str] = ..., receivers: _Optional[_Iterable[str]] = ..., topic: _Optional[str] = ..., broadcast: _Optional[bool] = ..., sequence: _Optional[int] = ..., sent_at_unix_us: _Optional[int] = ..., content_type: _Optional[str] = ..., payload: _Optional[bytes] = ..., ttl_ms: _Optional[int] = ..., delivery_attempt: _Optional[int] = ...) -> None: ...

class EnvelopeBatch(_message.Message):
    __slots__ = ("envelopes",)
    ENVELOPES_FIELD_NUMBER: _ClassVar[int]
    envelopes: _containers.RepeatedCompositeFieldContainer[Envelope]
    def __init__(self, envelopes: _Optional[_Iterable[_Union[Envelope, _Mapping]]] = ...) -> None: ...

class AgentState(_message.Message):
    __slots__ = ("agent_id", "content_type", "value", "version", "updated_at_unix_us")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_US_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    content_type: str
    value: bytes
    version: int
    updated_at_unix_us: int
    def __init__(self, agent_id: _Optional[str] = ..., content_type: _Optional[str] = ..., value: _Optional[bytes] = ..., version: _Optional[int] = ..., updated_at_unix_us: _Optional[int] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("envelope", "receiver", "attempts", "reason", "dead_at_unix_us")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DEAD_AT_UNIX_US_FIELD_NUMBER: _ClassVar[int]
    envelope: Envelope
    receiver: str
    attempts: int
    reason: str
    dead_at_unix_us: int
    def __init__(self, envelope: _Optional[_Union[Envelope, _Mapping]] = ..., receiver: _Optional[str] = ..., attempts: _Optional[int] = ..., reason: _Optional[str] = ..., dead_at_unix_us: _Optional[int] = ...) -> None: ...

class BrokerStats(_message.Message):
    __slots__ = ("sent", "enqueued", "delivered", "redelivered", "acked", "expired", "dead_lettered", "duplicates", "rejected", "bytes_in_raw", "bytes_in_wire", "bytes_out_raw", "bytes_out_wire", "compression_ratio", "avg_send_latency_s", "avg_delivery_latency_s", "sessions", "agents", "pending", "in_flight", "mailbox_bytes", "dead_letters")
    SENT_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_RAW_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_WIRE_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_RAW_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_WIRE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_RATIO_FIELD_NUMBER: _ClassVar[int]
    AVG_SEND_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    AVG_DELIVERY_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    MAILBOX_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    sent: int
    enqueued: int
    delivered: int
    redelivered: int
    acked: int
    expired: int
    dead_lettered: int
    duplicates: int
    rejected: int
    bytes_in_raw: int
    bytes_in_wire: int
    bytes_out_raw: int
    bytes_out_wire: int
    compression_ratio: float
    avg_send_latency_s: float
    avg_delivery_latency_s: float
    sessions: int
    agents: int
    pending: int
    in_flight: int
    mailbox_bytes: int
    dead_letters: int
    def __init__(self, sent: _Optional[int] = ..., enqueued: _Optional[int] = ..., delivered: _Optional[int] = ..., redelivered: _Optional[int] = ..., acked: _Optional[int] = ..., expired: _Optional[int] = ..., dead_lettered: _Optional[int] = ..., duplicates: _Optional[int] = ..., rejected: _Optional[int] = ..., bytes_in_raw: _Optional[int] = ..., bytes_in_wire: _Optional[int] = ..., bytes_out_raw: _Optional[int] = ..., bytes_out_wire: _Optional[int] = ..., compression_ratio: _Optional[float] = ..., avg_send_latency_s: _Optional[float] = ..., avg_delivery_latency_s: _Optional[float] = ..., sessions: _Optional[int] = ..., agents: _Optional[int] = ..., pending: _Optional[int] = ..., in_flight: _Optional[int] = ..., mailbox_bytes: _Optional[int] = ..., dead_letters: _Optional[int] = ...) -> None: ...
