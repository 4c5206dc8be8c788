from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Encoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCODING_UNSPECIFIED: _ClassVar[Encoding]
    ENCODING_PROTO_ZSTD: _ClassVar[Encoding]

class PayloadFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAYLOAD_FORMAT_UNSPECIFIED: _ClassVar[PayloadFormat]
    PAYLOAD_FORMAT_ENCODED: _ClassVar[PayloadFormat]
    PAYLOAD_FORMAT_TYPED: _ClassVar[PayloadFormat]
ENCODING_UNSPECIFIED: Encoding
ENCODING_PROTO_ZSTD: Encoding
PAYLOAD_FORMAT_UNSPECIFIED: PayloadFormat
PAYLOAD_FORMAT_ENCODED: PayloadFormat
PAYLOAD_FORMAT_TYPED: PayloadFormat

class Turn(_message.Message):
    __slots__ = ("step", "prompt_token_ids", "response_token_ids", "response_logprobs", "reward", "terminated", "truncated", "info_json", "prompt_text", "response_text", "prompt_token_ids_i32le", "response_token_ids_i32le", "response_logprobs_f32le", "policy_version", "response_mask")
    STEP_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TEXT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_I32LE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TOKEN_IDS_I32LE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_LOGPROBS_F32LE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_MASK_FIELD_NUMBER: _ClassVar[int]
    step: int
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_token_ids: _containers.RepeatedScalarFieldContainer[int]
    response_logprobs: _containers.RepeatedScalarFieldContainer[float]
    reward: float
    terminated: bool
    truncated: bool
    info_json: str
    prompt_text: str
    response_text: str
    prompt_token_ids_i32le: bytes
    response_token_ids_i32le: bytes
    response_logprobs_f32le: bytes
    policy_version: int
    response_mask: bytes
    def __init__(self, step: _Optional[int] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., response_token_ids: _Optional[_Iterable[int]] = ..., response_logprobs: _Optional[_Iterable[float]] = ..., reward: _Optional[float] = ..., terminated: _Optional[bool] = ..., truncated: _Optional[bool] = ..., info_json: _Optional[str] = ..., prompt_text: _Optional[str] = ..., response_text: _Optional[str] = ..., prompt_token_ids_i32le: _Optional[bytes] = ..., response_token_ids_i32le: _Optional[bytes] = ..., response_logprobs_f32le: _Optional[bytes] = ..., policy_version: _Optional[int] = ..., response_mask: _Optional[bytes] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("episode_id", "session", "agent_id", "role", "policy_version", "turns", "metadata_json", "created_at_s", "group_id", "episode_return", "group_size")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_S_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    EPISODE_RETURN_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    session: str
    agent_id: str
    role: str
    policy_version: int
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    metadata_json: str
    created_at_s: float
    group_id: str
    episode_return: float
    group_size: int
    def __init__(self, episode_id: _Optional[str] = ..., session: _Optional[str] = ..., agent_id: _Optional[str] = ..., role: _Optional[str] = ..., policy_version: _Optional[int] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., metadata_json: _Optional[str] = ..., created_at_s: _Optional[float] = ..., group_id: _Optional[str] = ..., episode_return: _Optional[float] = ..., group_size: _Optional[int] = ...) -> None: ...

class EncodedTrajectory(_message.Message):
    __slots__ = ("chunks", "encoding")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedScalarFieldContainer[bytes]
    encoding: Encoding
    def __init__(self, chunks: _Optional[_Iterable[bytes]] = ..., encoding: _Optional[_Union[Encoding, str]] = ...) -> None: ...

class RateLimiterConfig(_message.Message):
    __slots__ = ("kind", "min_size_to_sample", "samples_per_insert", "error_buffer", "size", "min_diff", "max_diff")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MIN_SIZE_TO_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_INSERT_FIELD_NUMBER: _ClassVar[int]
    ERROR_BUFFER_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_DIFF_FIELD_NUMBER: _ClassVar[int]
    MAX_DIFF_FIELD_NUMBER: _ClassVar[int]
    kind: str
    min_size_to_sample: int
    samples_per_insert: float
    error_buffer: float
    size: int
    min_diff: float
    max_diff: float
    def __init__(self, kind: _Optional[str] = ..., min_size_to_sample: _Optional[int] = ..., samples_per_insert: _Optional[float] = ..., error_buffer: _Optional[float] = ..., size: _Optional[int] = ..., min_diff: _Optional[float] = ..., max_diff: _Optional[float] = ...) -> None: ...

class Signature(_message.Message):
    __slots__ = ("agent_ids", "roles", "min_policy_version", "require_rewards", "require_logprobs", "max_turns", "max_prompt_tokens", "max_response_tokens")
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    MIN_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_REWARDS_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_RESPONSE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    roles: _containers.RepeatedScalarFieldContainer[str]
    min_policy_version: int
    require_rewards: bool
    require_logprobs: bool
    max_turns: int
    max_prompt_tokens: int
    max_response_tokens: int
    def __init__(self, agent_ids: _Optional[_Iterable[str]] = ..., roles: _Optional[_Iterable[str]] = ..., min_policy_version: _Optional[int] = ..., require_rewards: _Optional[bool] = ..., require_logprobs: _Optional[bool] = ..., max_turns: _Optional[int] = ..., max_prompt_tokens: _Optional[int] = ..., max_response_tokens: _Optional[int] = ...) -> None: ...

class TableConfig(_message.Message):
    __slots__ = ("name", "preset", "sampler", "remover", "priority_exponent", "importance_beta", "max_size", "max_bytes", "max_times_sampled", "full_policy", "rate_limiter", "signature", "max_policy_lag")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    SAMPLER_FIELD_NUMBER: _ClassVar[int]
    REMOVER_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_EXPONENT_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_BETA_FIELD_NUMBER: _ClassVar[int]
    MAX_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TIMES_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    FULL_POLICY_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITER_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    MAX_POLICY_LAG_FIELD_NUMBER: _ClassVar[int]
    name: str
    preset: str
    sampler: str
    remover: str
    priority_exponent: float
    importance_beta: float
    max_size: int
    max_bytes: int
    max_times_sampled: int
    full_policy: str
    rate_limiter: RateLimiterConfig
    signature: Signature
    max_policy_lag: int
    def __init__(self, name: _Optional[str] = ..., preset: _Optional[str] = ..., sampler: _Optional[str] = ..., remover: _Optional[str] = ..., priority_exponent: _Optional[float] = ..., importance_beta: _Optional[float] = ..., max_size: _Optional[int] = ..., max_bytes: _Optional[int] = ..., max_times_sampled: _Optional[int] = ..., full_policy: _Optional[str] = ..., rate_limiter: _Optional[_Union[RateLimiterConfig, _Mapping]] = ..., signature: _Optional[_Union[Signature, _Mapping]] = ..., max_policy_lag: _Optional[int] = ...) -> None: ...

class TableInfo(_message.Message):
    __slots__ = ("name", "size", "num_bytes", "inserts", "samples", "deletes", "evictions", "priority_updates", "priority_updates_missing", "waiting_inserts", "waiting_samples", "rate_limiter_diff", "config", "stale_removed")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    INSERTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DELETES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_UPDATES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_UPDATES_MISSING_FIELD_NUMBER: _ClassVar[int]
    WAITING_INSERTS_FIELD_NUMBER: _ClassVar[int]
    WAITING_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMITER_DIFF_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    STALE_REMOVED_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    num_bytes: int
    inserts: int
    samples: int
    deletes: int
    evictions: int
    priority_updates: int
    priority_updates_missing: int
    waiting_inserts: int
    waiting_samples: int
    rate_limiter_diff: float
    config: TableConfig
    stale_removed: int
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., num_bytes: _Optional[int] = ..., inserts: _Optional[int] = ..., samples: _Optional[int] = ..., deletes: _Optional[int] = ..., evictions: _Optional[int] = ..., priority_updates: _Optional[int] = ..., priority_updates_missing: _Optional[int] = ..., waiting_inserts: _Optional[int] = ..., waiting_samples: _Optional[int] = ..., rate_limiter_diff: _Optional[float] = ..., config: _Optional[_Union[TableConfig, _Mapping]] = ..., stale_removed: _Optional[int] = ...) -> None: ...

class SampleFilter(_message.Message):
    __slots__ = ("agent_ids", "roles", "min_policy_version", "max_age_s")
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    MIN_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_S_FIELD_NUMBER: _ClassVar[int]
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    roles: _containers.RepeatedScalarFieldContainer[str]
    min_policy_version: int
    max_age_s: float
    def __init__(self, agent_ids: _Optional[_Iterable[str]] = ..., roles: _Optional[_Iterable[str]] = ..., min_policy_version: _Optional[int] = ..., max_age_s: _Optional[float] = ...) -> None: ...

class InsertItem(_message.Message):
    __slots__ = ("table", "priority", "trajectory", "encoded", "client_seq", "idempotent")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    CLIENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENT_FIELD_NUMBER: _ClassVar[int]
    table: str
    priority: float
    trajectory: Trajectory
    encoded: EncodedTrajectory
    client_seq: int
    idempotent: bool
    def __init__(self, table: _Optional[str] = ..., priority: _Optional[float] = ..., trajectory: _Optional[_Union[Trajectory, _Mapping]] = ..., encoded: _Optional[_Union[EncodedTrajectory, _Mapping]] = ..., client_seq: _Optional[int] = ..., idempotent: _Optional[bool] = ...) -> None: ...

class InsertConfirmation(_message.Message):
    __slots__ = ("client_seq", "key", "status", "duplicate")
    CLIENT_SEQ_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    client_seq: int
    key: int
    status: _status_pb2.Status
    duplicate: bool
    def __init__(self, client_seq: _Optional[int] = ..., key: _Optional[int] = ..., status: _Optional[_Union[_status_pb2.Status, _Mapping]] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class SampledItem(_message.Message):
    __slots__ = ("key", "table", "priority", "probability", "importance_weight", "times_sampled", "table_size", "trajectory", "encoded")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    IMPORTANCE_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    TIMES_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    TABLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    key: int
    table: str
    priority: float
    probability: float
    importance_weight: float
    times_sampled: int
    table_size: int
    trajectory: Trajectory
    encoded: EncodedTrajectory
    def __init__(self, key: _Optional[int] = ..., table: _Optional[str] = ..., priority: _Optional[float] = ..., probability: _Optional[float] = ..., importance_weight: _Optional[float] = ..., times_sampled: _Optional[int] = ..., table_size: _Optional[int] = ..., trajectory: _Optional[_Union[Trajectory, _Mapping]] = ..., encoded: _Optional[_Union[EncodedTrajectory, _Mapping]] = ...) -> None: ...

class StoredItem(_message.Message):
    __slots__ = ("key", "table", "priority", "trajectory", "encoded", "times_sampled")
    KEY_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORY_FIELD_NUMBER: _ClassVar[int]
    ENCODED_FIELD_NUMBER: _ClassVar[int]
    TIMES_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    key: int
    table: str
    priority: float
    trajectory: Trajectory
    encoded: EncodedTrajectory
    times_sampled: int
    def __init__(self, key: _Optional[int] = ..., table: _Optional[str] = ..., priority: _Optional[float] = ..., trajectory: _Optional[_Union[Trajectory, _Mapping]] = ..., encoded: _Optional[_Union[EncodedTrajectory, _Mapping]] = ..., times_sampled: _Optional[int] = ...) -> None: ...
