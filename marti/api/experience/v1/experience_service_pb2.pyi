from google.rpc import status_pb2 as _status_pb2
from marti.api.experience.v1 import experience_pb2 as _experience_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InsertRequest(_message.Message):
    __slots__ = ("items", "timeout_ms")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_experience_pb2.InsertItem]
    timeout_ms: int
    def __init__(self, items: _Optional[_Iterable[_Union[_experience_pb2.InsertItem, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class InsertResponse(_message.Message):
    __slots__ = ("confirmations",)
    CONFIRMATIONS_FIELD_NUMBER: _ClassVar[int]
    confirmations: _containers.RepeatedCompositeFieldContainer[_experience_pb2.InsertConfirmation]
    def __init__(self, confirmations: _Optional[_Iterable[_Union[_experience_pb2.InsertConfirmation, _Mapping]]] = ...) -> None: ...

class SampleRequest(_message.Message):
    __slots__ = ("table", "num_samples", "timeout_ms", "filter", "format", "max_batch_items", "current_policy_version", "whole_batch", "confirm", "ack", "whole_groups")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_ITEMS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    WHOLE_BATCH_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    WHOLE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    table: str
    num_samples: int
    timeout_ms: int
    filter: _experience_pb2.SampleFilter
    format: _experience_pb2.PayloadFormat
    max_batch_items: int
    current_policy_version: int
    whole_batch: bool
    confirm: bool
    ack: bool
    whole_groups: bool
    def __init__(self, table: _Optional[str] = ..., num_samples: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., filter: _Optional[_Union[_experience_pb2.SampleFilter, _Mapping]] = ..., format: _Optional[_Union[_experience_pb2.PayloadFormat, str]] = ..., max_batch_items: _Optional[int] = ..., current_policy_version: _Optional[int] = ..., whole_batch: _Optional[bool] = ..., confirm: _Optional[bool] = ..., ack: _Optional[bool] = ..., whole_groups: _Optional[bool] = ...) -> None: ...

class SampleResponse(_message.Message):
    __slots__ = ("items", "status", "stale_keys", "stale_episode_ids", "needs_ack", "dropped_keys", "dropped_episode_ids")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STALE_KEYS_FIELD_NUMBER: _ClassVar[int]
    STALE_EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    NEEDS_ACK_FIELD_NUMBER: _ClassVar[int]
    DROPPED_KEYS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_experience_pb2.SampledItem]
    status: _status_pb2.Status
    stale_keys: _containers.RepeatedScalarFieldContainer[int]
    stale_episode_ids: _containers.RepeatedScalarFieldContainer[str]
    needs_ack: bool
    dropped_keys: _containers.RepeatedScalarFieldContainer[int]
    dropped_episode_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, items: _Optional[_Iterable[_Union[_experience_pb2.SampledItem, _Mapping]]] = ..., status: _Optional[_Union[_status_pb2.Status, _Mapping]] = ..., stale_keys: _Optional[_Iterable[int]] = ..., stale_episode_ids: _Optional[_Iterable[str]] = ..., needs_ack: _Optional[bool] = ..., dropped_keys: _Optional[_Iterable[int]] = ..., dropped_episode_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PriorityUpdate(_message.Message):
    __slots__ = ("key", "priority")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    key: int
    priority: float
    def __init__(self, key: _Optional[int] = ..., priority: _Optional[float] = ...) -> None: ...

class UpdatePrioritiesRequest(_message.Message):
    __slots__ = ("table", "updates")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    table: str
    updates: _containers.RepeatedCompositeFieldContainer[PriorityUpdate]
    def __init__(self, table: _Optional[str] = ..., updates: _Optional[_Iterable[_Union[PriorityUpdate, _Mapping]]] = ...) -> None: ...

class UpdatePrioritiesResponse(_message.Message):
    __slots__ = ("updated", "missing")
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    updated: int
    missing: int
    def __init__(self, updated: _Optional[int] = ..., missing: _Optional[int] = ...) -> None: ...

class GetTableInfoRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    def __init__(self, table: _Optional[str] = ...) -> None: ...

class GetTableInfoResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: _experience_pb2.TableInfo
    def __init__(self, info: _Optional[_Union[_experience_pb2.TableInfo, _Mapping]] = ...) -> None: ...

class CreateTableRequest(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: _experience_pb2.TableConfig
    def __init__(self, config: _Optional[_Union[_experience_pb2.TableConfig, _Mapping]] = ...) -> None: ...

class CreateTableResponse(_message.Message):
    __slots__ = ("info",)
    INFO_FIELD_NUMBER: _ClassVar[int]
    info: _experience_pb2.TableInfo
    def __init__(self, info: _Optional[_Union[_experience_pb2.TableInfo, _Mapping]] = ...) -> None: ...

class ListTablesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTablesResponse(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedCompositeFieldContainer[_experience_pb2.TableInfo]
    def __init__(self, tables: _Optional[_Iterable[_Union[_experience_pb2.TableInfo, _Mapping]]] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckpointResponse(_message.Message):
    __slots__ = ("path", "duration_s", "num_bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    duration_s: float
    num_bytes: int
    def __init__(self, path: _Optional[str] = ..., duration_s: _Optional[float] = ..., num_bytes: _Optional[int] = ...) -> None: ...

class GetAllExperiencesRequest(_message.Message):
    __slots__ = ("episode_id", "session", "agent_id", "policy_version", "tables", "format")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    session: str
    agent_id: str
    policy_version: int
    tables: _containers.RepeatedScalarFieldContainer[str]
    format: _experience_pb2.PayloadFormat
    def __init__(self, episode_id: _Optional[str] = ..., session: _Optional[str] = ..., agent_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., tables: _Optional[_Iterable[str]] = ..., format: _Optional[_Union[_experience_pb2.PayloadFormat, str]] = ...) -> None: ...

class GetAllExperiencesResponse(_message.Message):
    __slots__ = ("items", "status")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[_experience_pb2.StoredItem]
    status: _status_pb2.Status
    def __init__(self, items: _Optional[_Iterable[_Union[_experience_pb2.StoredItem, _Mapping]]] = ..., status: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("table", "episode_ids")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    table: str
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, table: _Optional[str] = ..., episode_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("table",)
    TABLE_FIELD_NUMBER: _ClassVar[int]
    table: str
    def __init__(self, table: _Optional[str] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: int
    def __init__(self, deleted: _Optional[int] = ...) -> None: ...
