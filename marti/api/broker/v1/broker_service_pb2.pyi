from marti.api.broker.v1 import broker_pb2 as _broker_pb2
from marti.api.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateSessionRequest(_message.Message):
    __slots__ = ("session", "agents", "fixed_roster", "zstd_dictionary")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    FIXED_ROSTER_FIELD_NUMBER: _ClassVar[int]
    ZSTD_DICTIONARY_FIELD_NUMBER: _ClassVar[int]
    session: str
    agents: _containers.RepeatedScalarFieldContainer[str]
    fixed_roster: bool
    zstd_dictionary: bytes
    def __init__(self, session: _Optional[str] = ..., agents: _Optional[_Iterable[str]] = ..., fixed_roster: _Optional[bool] = ..., zstd_dictionary: _Optional[bytes] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session", "created", "zstd_dictionary", "dictionary_id", "agents")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ZSTD_DICTIONARY_FIELD_NUMBER: _ClassVar[int]
    DICTIONARY_ID_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    session: str
    created: bool
    zstd_dictionary: bytes
    dictionary_id: int
    agents: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session: _Optional[str] = ..., created: _Optional[bool] = ..., zstd_dictionary: _Optional[bytes] = ..., dictionary_id: _Optional[int] = ..., agents: _Optional[_Iterable[str]] = ...) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("session", "sender", "frame", "wait_if_full_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    WAIT_IF_FULL_MS_FIELD_NUMBER: _ClassVar[int]
    session: str
    sender: str
    frame: _common_pb2.CompressedFrame
    wait_if_full_ms: int
    def __init__(self, session: _Optional[str] = ..., sender: _Optional[str] = ..., frame: _Optional[_Union[_common_pb2.CompressedFrame, _Mapping]] = ..., wait_if_full_ms: _Optional[int] = ...) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("accepted", "duplicates", "enqueued", "sequences")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    enqueued: int
    sequences: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ..., enqueued: _Optional[int] = ..., sequences: _Optional[_Iterable[int]] = ...) -> None: ...

class BroadcastRequest(_message.Message):
    __slots__ = ("session", "sender", "frame", "wait_if_full_ms")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    FRAME_FIELD_NUMBER: _ClassVar[int]
    WAIT_IF_FULL_MS_FIELD_NUMBER: _ClassVar[int]
    session: str
    sender: str
    frame: _common_pb2.CompressedFrame
    wait_if_full_ms: int
    def __init__(self, session: _Optional[str] = ..., sender: _Optional[str] = ..., frame: _Optional[_Union[_common_pb2.CompressedFrame, _Mapping]] = ..., wait_if_full_ms: _Optional[int] = ...) -> None: ...

class BroadcastResponse(_message.Message):
    __slots__ = ("accepted", "duplicates", "enqueued", "sequences")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    ENQUEUED_FIELD_NUMBER: _ClassVar[int]
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    enqueued: int
    sequences: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ..., enqueued: _Optional[int] = ..., sequences: _Optional[_Iterable[int]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("session", "agent_id", "topics", "max_batch_messages", "max_unacked", "accept_codec", "max_frame_bytes")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_UNACKED_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_CODEC_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    session: str
    agent_id: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    max_batch_messages: int
    max_unacked: int
    accept_codec: _common_pb2.Codec
    max_frame_bytes: int
    def __init__(self, session: _Optional[str] = ..., agent_id: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., max_batch_messages: _Optional[int] = ..., max_unacked: _Optional[int] = ..., accept_codec: _Optional[_Union[_common_pb2.Codec, str]] = ..., max_frame_bytes: _Optional[int] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("frame", "count")
    FRAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    frame: _common_pb2.CompressedFrame
    count: int
    def __init__(self, frame: _Optional[_Union[_common_pb2.CompressedFrame, _Mapping]] = ..., count: _Optional[int] = ...) -> None: ...

class ReceiveRequest(_message.Message):
    __slots__ = ("session", "agent_id", "topics", "max_messages", "timeout_ms", "ack_message_ids", "accept_codec", "max_frame_bytes")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ACK_MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_CODEC_FIELD_NUMBER: _ClassVar[int]
    MAX_FRAME_BYTES_FIELD_NUMBER: _ClassVar[int]
    session: str
    agent_id: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    max_messages: int
    timeout_ms: int
    ack_message_ids: _containers.RepeatedScalarFieldContainer[str]
    accept_codec: _common_pb2.Codec
    max_frame_bytes: int
    def __init__(self, session: _Optional[str] = ..., agent_id: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ..., max_messages: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., ack_message_ids: _Optional[_Iterable[str]] = ..., accept_codec: _Optional[_Union[_common_pb2.Codec, str]] = ..., max_frame_bytes: _Optional[int] = ...) -> None: ...

class ReceiveResponse(_message.Message):
    __slots__ = ("frame", "count", "acked")
    FRAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    frame: _common_pb2.CompressedFrame
    count: int
    acked: int
    def __init__(self, frame: _Optional[_Union[_common_pb2.CompressedFrame, _Mapping]] = ..., count: _Optional[int] = ..., acked: _Optional[int] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("session", "agent_id", "message_ids")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    session: str
    agent_id: str
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session: _Optional[str] = ..., agent_id: _Optional[str] = ..., message_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class PutStateRequest(_message.Message):
    __slots__ = ("session", "agent_id", "content_type", "value", "expected_version")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_VERSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    agent_id: str
    content_type: str
    value: bytes
    expected_version: int
    def __init__(self, session: _Optional[str] = ..., agent_id: _Optional[str] = ..., content_type: _Optional[str] = ..., value: _Optional[bytes] = ..., expected_version: _Optional[int] = ...) -> None: ...

class PutStateResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: _broker_pb2.AgentState
    def __init__(self, state: _Optional[_Union[_broker_pb2.AgentState, _Mapping]] = ...) -> None: ...

class GetStatesRequest(_message.Message):
    __slots__ = ("session", "agent_id", "exclude_self")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_SELF_FIELD_NUMBER: _ClassVar[int]
    session: str
    agent_id: str
    exclude_self: bool
    def __init__(self, session: _Optional[str] = ..., agent_id: _Optional[str] = ..., exclude_self: _Optional[bool] = ...) -> None: ...

class GetStatesResponse(_message.Message):
    __slots__ = ("states",)
    STATES_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedCompositeFieldContainer[_broker_pb2.AgentState]
    def __init__(self, states: _Optional[_Iterable[_Union[_broker_pb2.AgentState, _Mapping]]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("session",)
    SESSION_FIELD_NUMBER: _ClassVar[int]
    session: str
    def __init__(self, session: _Optional[str] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("stats",)
    STATS_FIELD_NUMBER: _ClassVar[int]
    stats: _broker_pb2.BrokerStats
    def __init__(self, stats: _Optional[_Union[_broker_pb2.BrokerStats, _Mapping]] = ...) -> None: ...

class ReadDeadLettersRequest(_message.Message):
    __slots__ = ("session", "receiver", "max_messages", "remove", "max_response_bytes")
    SESSION_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    MAX_RESPONSE_BYTES_FIELD_NUMBER: _ClassVar[int]
    session: str
    receiver: str
    max_messages: int
    remove: bool
    max_response_bytes: int
    def __init__(self, session: _Optional[str] = ..., receiver: _Optional[str] = ..., max_messages: _Optional[int] = ..., remove: _Optional[bool] = ..., max_response_bytes: _Optional[int] = ...) -> None: ...

class ReadDeadLettersResponse(_message.Message):
    __slots__ = ("dead_letters",)
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    dead_letters: _containers.RepeatedCompositeFieldContainer[_broker_pb2.DeadLetter]
    def __init__(self, dead_letters: _Optional[_Iterable[_Union[_broker_pb2.DeadLetter, _Mapping]]] = ...) -> None: ...
