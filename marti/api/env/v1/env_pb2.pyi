from google.protobuf import struct_pb2 as _struct_pb2
from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class ValueList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class ValueMap(_message.Message):
    __slots__ = ("fields",)
    class FieldsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    fields: _containers.MessageMap[str, Value]
    def __init__(self, fields: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("null_value", "bool_value", "int_value", "float_value", "text", "tensor", "list", "map")
    NULL_VALUE_FIELD_NUMBER: _ClassVar[int]
    BOOL_VALUE_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    FLOAT_VALUE_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    MAP_FIELD_NUMBER: _ClassVar[int]
    null_value: _struct_pb2.NullValue
    bool_value: bool
    int_value: int
    float_value: float
    text: str
    tensor: Tensor
    list: ValueList
    map: ValueMap
    def __init__(self, null_value: _Optional[_Union[_struct_pb2.NullValue, str]] = ..., bool_value: _Optional[bool] = ..., int_value: _Optional[int] = ..., float_value: _Optional[float] = ..., text: _Optional[str] = ..., tensor: _Optional[_Union[Tensor, _Mapping]] = ..., list: _Optional[_Union[ValueList, _Mapping]] = ..., map: _Optional[_Union[ValueMap, _Mapping]] = ...) -> None: ...

class TextSpace(_message.Message):
    __slots__ = ("min_length", "max_length", "charset")
    MIN_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHARSET_FIELD_NUMBER: _ClassVar[int]
    min_length: int
    max_length: int
    charset: str
    def __init__(self, min_length: _Optional[int] = ..., max_length: _Optional[int] = ..., charset: _Optional[str] = ...) -> None: ...

class DiscreteSpace(_message.Message):
    __slots__ = ("n", "start")
    N_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    n: int
    start: int
    def __init__(self, n: _Optional[int] = ..., start: _Optional[int] = ...) -> None: ...

class BoxSpace(_message.Message):
    __slots__ = ("low", "high")
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    low: Tensor
    high: Tensor
    def __init__(self, low: _Optional[_Union[Tensor, _Mapping]] = ..., high: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class MultiBinarySpace(_message.Message):
    __slots__ = ("shape",)
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, shape: _Optional[_Iterable[int]] = ...) -> None: ...

class MultiDiscreteSpace(_message.Message):
    __slots__ = ("nvec", "start")
    NVEC_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    nvec: Tensor
    start: Tensor
    def __init__(self, nvec: _Optional[_Union[Tensor, _Mapping]] = ..., start: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class NamedSpace(_message.Message):
    __slots__ = ("key", "space")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SPACE_FIELD_NUMBER: _ClassVar[int]
    key: str
    space: Space
    def __init__(self, key: _Optional[str] = ..., space: _Optional[_Union[Space, _Mapping]] = ...) -> None: ...

class DictSpace(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[NamedSpace]
    def __init__(self, entries: _Optional[_Iterable[_Union[NamedSpace, _Mapping]]] = ...) -> None: ...

class TupleSpace(_message.Message):
    __slots__ = ("spaces",)
    SPACES_FIELD_NUMBER: _ClassVar[int]
    spaces: _containers.RepeatedCompositeFieldContainer[Space]
    def __init__(self, spaces: _Optional[_Iterable[_Union[Space, _Mapping]]] = ...) -> None: ...

class Space(_message.Message):
    __slots__ = ("text", "discrete", "box", "multi_binary", "multi_discrete", "dict", "tuple", "description")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    DISCRETE_FIELD_NUMBER: _ClassVar[int]
    BOX_FIELD_NUMBER: _ClassVar[int]
    MULTI_BINARY_FIELD_NUMBER: _ClassVar[int]
    MULTI_DISCRETE_FIELD_NUMBER: _ClassVar[int]
    DICT_FIELD_NUMBER: _ClassVar[int]
    TUPLE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    text: TextSpace
    discrete: DiscreteSpace
    box: BoxSpace
    multi_binary: MultiBinarySpace
    multi_discrete: MultiDiscreteSpace
    dict: DictSpace
    tuple: TupleSpace
    description: str
    def __init__(self, text: _Optional[_Union[TextSpace, _Mapping]] = ..., discrete: _Optional[_Union[DiscreteSpace, _Mapping]] = ..., box: _Optional[_Union[BoxSpace, _Mapping]] = ..., multi_binary: _Optional[_Union[MultiBinarySpace, _Mapping]] = ..., multi_discrete: _Optional[_Union[MultiDiscreteSpace, _Mapping]] = ..., dict: _Optional[_Union[DictSpace, _Mapping]] = ..., tuple: _Optional[_Union[TupleSpace, _Mapping]] = ..., description: _Optional[str] = ...) -> None: ...

class AgentSpec(_message.Message):
    __slots__ = ("agent", "role", "observation_space", "action_space")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    agent: str
    role: str
    observation_space: Space
    action_space: Space
    def __init__(self, agent: _Optional[str] = ..., role: _Optional[str] = ..., observation_space: _Optional[_Union[Space, _Mapping]] = ..., action_space: _Optional[_Union[Space, _Mapping]] = ...) -> None: ...

class ConfigField(_message.Message):
    __slots__ = ("name", "type", "default_value", "description", "choices", "minimum", "maximum")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    MINIMUM_FIELD_NUMBER: _ClassVar[int]
    MAXIMUM_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    default_value: Value
    description: str
    choices: _containers.RepeatedCompositeFieldContainer[Value]
    minimum: float
    maximum: float
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., default_value: _Optional[_Union[Value, _Mapping]] = ..., description: _Optional[str] = ..., choices: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., minimum: _Optional[float] = ..., maximum: _Optional[float] = ...) -> None: ...

class EnvDescription(_message.Message):
    __slots__ = ("env_id", "name", "version", "description", "config_schema", "agents", "metrics")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CONFIG_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    name: str
    version: int
    description: str
    config_schema: _containers.RepeatedCompositeFieldContainer[ConfigField]
    agents: _containers.RepeatedCompositeFieldContainer[AgentSpec]
    metrics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, env_id: _Optional[str] = ..., name: _Optional[str] = ..., version: _Optional[int] = ..., description: _Optional[str] = ..., config_schema: _Optional[_Iterable[_Union[ConfigField, _Mapping]]] = ..., agents: _Optional[_Iterable[_Union[AgentSpec, _Mapping]]] = ..., metrics: _Optional[_Iterable[str]] = ...) -> None: ...

class AgentResult(_message.Message):
    __slots__ = ("agent", "observation", "reward", "terminated", "truncated", "info", "observation_edit", "info_delta")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_EDIT_FIELD_NUMBER: _ClassVar[int]
    INFO_DELTA_FIELD_NUMBER: _ClassVar[int]
    agent: str
    observation: Value
    reward: float
    terminated: bool
    truncated: bool
    info: ValueMap
    observation_edit: TextEdit
    info_delta: bool
    def __init__(self, agent: _Optional[str] = ..., observation: _Optional[_Union[Value, _Mapping]] = ..., reward: _Optional[float] = ..., terminated: _Optional[bool] = ..., truncated: _Optional[bool] = ..., info: _Optional[_Union[ValueMap, _Mapping]] = ..., observation_edit: _Optional[_Union[TextEdit, _Mapping]] = ..., info_delta: _Optional[bool] = ...) -> None: ...

class TextEdit(_message.Message):
    __slots__ = ("prefix", "suffix", "text")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    SUFFIX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    prefix: int
    suffix: int
    text: str
    def __init__(self, prefix: _Optional[int] = ..., suffix: _Optional[int] = ..., text: _Optional[str] = ...) -> None: ...

class AgentAction(_message.Message):
    __slots__ = ("agent", "action")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    agent: str
    action: Value
    def __init__(self, agent: _Optional[str] = ..., action: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class ListEnvsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListEnvsResponse(_message.Message):
    __slots__ = ("envs", "live_sessions", "max_sessions")
    ENVS_FIELD_NUMBER: _ClassVar[int]
    LIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    envs: _containers.RepeatedCompositeFieldContainer[EnvDescription]
    live_sessions: int
    max_sessions: int
    def __init__(self, envs: _Optional[_Iterable[_Union[EnvDescription, _Mapping]]] = ..., live_sessions: _Optional[int] = ..., max_sessions: _Optional[int] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("env_id", "config", "seed", "request_id")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    config: ValueMap
    seed: int
    request_id: str
    def __init__(self, env_id: _Optional[str] = ..., config: _Optional[_Union[ValueMap, _Mapping]] = ..., seed: _Optional[int] = ..., request_id: _Optional[str] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session_id", "env_id", "agents", "idle_timeout_ms", "metrics")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    env_id: str
    agents: _containers.RepeatedCompositeFieldContainer[AgentSpec]
    idle_timeout_ms: int
    metrics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_id: _Optional[str] = ..., env_id: _Optional[str] = ..., agents: _Optional[_Iterable[_Union[AgentSpec, _Mapping]]] = ..., idle_timeout_ms: _Optional[int] = ..., metrics: _Optional[_Iterable[str]] = ...) -> None: ...

class ResetRequest(_message.Message):
    __slots__ = ("session_id", "seed", "options", "request_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seed: int
    options: ValueMap
    request_id: str
    def __init__(self, session_id: _Optional[str] = ..., seed: _Optional[int] = ..., options: _Optional[_Union[ValueMap, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ResetResponse(_message.Message):
    __slots__ = ("results", "agents", "acting_agents", "infos_json", "result_id")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    ACTING_AGENTS_FIELD_NUMBER: _ClassVar[int]
    INFOS_JSON_FIELD_NUMBER: _ClassVar[int]
    RESULT_ID_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AgentResult]
    agents: _containers.RepeatedScalarFieldContainer[str]
    acting_agents: _containers.RepeatedScalarFieldContainer[str]
    infos_json: str
    result_id: int
    def __init__(self, results: _Optional[_Iterable[_Union[AgentResult, _Mapping]]] = ..., agents: _Optional[_Iterable[str]] = ..., acting_agents: _Optional[_Iterable[str]] = ..., infos_json: _Optional[str] = ..., result_id: _Optional[int] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("session_id", "actions", "request_id", "delta_base")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DELTA_BASE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    actions: _containers.RepeatedCompositeFieldContainer[AgentAction]
    request_id: str
    delta_base: int
    def __init__(self, session_id: _Optional[str] = ..., actions: _Optional[_Iterable[_Union[AgentAction, _Mapping]]] = ..., request_id: _Optional[str] = ..., delta_base: _Optional[int] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("results", "agents", "acting_agents", "infos_json", "result_id", "delta_base")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    ACTING_AGENTS_FIELD_NUMBER: _ClassVar[int]
    INFOS_JSON_FIELD_NUMBER: _ClassVar[int]
    RESULT_ID_FIELD_NUMBER: _ClassVar[int]
    DELTA_BASE_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AgentResult]
    agents: _containers.RepeatedScalarFieldContainer[str]
    acting_agents: _containers.RepeatedScalarFieldContainer[str]
    infos_json: str
    result_id: int
    delta_base: int
    def __init__(self, results: _Optional[_Iterable[_Union[AgentResult, _Mapping]]] = ..., agents: _Optional[_Iterable[str]] = ..., acting_agents: _Optional[_Iterable[str]] = ..., infos_json: _Optional[str] = ..., result_id: _Optional[int] = ..., delta_base: _Optional[int] = ...) -> None: ...

class BatchStepRequest(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[StepRequest]
    def __init__(self, steps: _Optional[_Iterable[_Union[StepRequest, _Mapping]]] = ...) -> None: ...

class BatchStepItem(_message.Message):
    __slots__ = ("status", "step")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    status: _status_pb2.Status
    step: StepResponse
    def __init__(self, status: _Optional[_Union[_status_pb2.Status, _Mapping]] = ..., step: _Optional[_Union[StepResponse, _Mapping]] = ...) -> None: ...

class BatchStepResponse(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[BatchStepItem]
    def __init__(self, items: _Optional[_Iterable[_Union[BatchStepItem, _Mapping]]] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("closed",)
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    closed: bool
    def __init__(self, closed: _Optional[bool] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("sequence", "create", "reset", "step", "close", "batch_step")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    BATCH_STEP_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    create: CreateSessionRequest
    reset: ResetRequest
    step: StepRequest
    close: CloseSessionRequest
    batch_step: BatchStepRequest
    def __init__(self, sequence: _Optional[int] = ..., create: _Optional[_Union[CreateSessionRequest, _Mapping]] = ..., reset: _Optional[_Union[ResetRequest, _Mapping]] = ..., step: _Optional[_Union[StepRequest, _Mapping]] = ..., close: _Optional[_Union[CloseSessionRequest, _Mapping]] = ..., batch_step: _Optional[_Union[BatchStepRequest, _Mapping]] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("sequence", "status", "create", "reset", "step", "close", "batch_step")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    BATCH_STEP_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    status: _status_pb2.Status
    create: CreateSessionResponse
    reset: ResetResponse
    step: StepResponse
    close: CloseSessionResponse
    batch_step: BatchStepResponse
    def __init__(self, sequence: _Optional[int] = ..., status: _Optional[_Union[_status_pb2.Status, _Mapping]] = ..., create: _Optional[_Union[CreateSessionResponse, _Mapping]] = ..., reset: _Optional[_Union[ResetResponse, _Mapping]] = ..., step: _Optional[_Union[StepResponse, _Mapping]] = ..., close: _Optional[_Union[CloseSessionResponse, _Mapping]] = ..., batch_step: _Optional[_Union[BatchStepResponse, _Mapping]] = ...) -> None: ...
