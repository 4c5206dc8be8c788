from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "messages", "text", "token_ids", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "n", "episode_id", "group_id", "idempotency_key")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    model: str
    messages: ChatMessages
    text: str
    token_ids: TokenIds
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    seed: int
    n: int
    episode_id: str
    group_id: str
    idempotency_key: str
    def __init__(self, model: _Optional[str] = ..., messages: _Optional[_Union[ChatMessages, _Mapping]] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., seed: _Optional[int] = ..., n: _Optional[int] = ..., episode_id: _Optional[str] = ..., group_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class Choice(_message.Message):
    __slots__ = ("index", "call_id", "text", "token_ids", "logprobs", "finish_reason", "policy_version")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    index: int
    call_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    finish_reason: FinishReason
    policy_version: int
    def __init__(self, index: _Optional[int] = ..., call_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("choices", "prompt_token_ids", "agent")
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedCompositeFieldContainer[Choice]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    agent: str
    def __init__(self, choices: _Optional[_Iterable[_Union[Choice, _Mapping]]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., agent: _Optional[str] = ...) -> None: ...

class GenerateStreamRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: GenerateRequest
    def __init__(self, request: _Optional[_Union[GenerateRequest, _Mapping]] = ...) -> None: ...

class StreamHeader(_message.Message):
    __slots__ = ("prompt_token_ids", "agent", "n")
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    agent: str
    n: int
    def __init__(self, prompt_token_ids: _Optional[_Iterable[int]] = ..., agent: _Optional[str] = ..., n: _Optional[int] = ...) -> None: ...

class TokenDelta(_message.Message):
    __slots__ = ("index", "token_id", "logprob", "text")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    index: int
    token_id: int
    logprob: float
    text: str
    def __init__(self, index: _Optional[int] = ..., token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., text: _Optional[str] = ...) -> None: ...

class ChoiceEnd(_message.Message):
    __slots__ = ("index", "call_id", "finish_reason", "policy_version")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    index: int
    call_id: str
    finish_reason: FinishReason
    policy_version: int
    def __init__(self, index: _Optional[int] = ..., call_id: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("header", "delta", "end")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    header: StreamHeader
    delta: TokenDelta
    end: ChoiceEnd
    def __init__(self, header: _Optional[_Union[StreamHeader, _Mapping]] = ..., delta: _Optional[_Union[TokenDelta, _Mapping]] = ..., end: _Optional[_Union[ChoiceEnd, _Mapping]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("id", "agent", "policy_version", "pinned", "max_model_len")
    ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    id: str
    agent: str
    policy_version: int
    pinned: bool
    max_model_len: int
    def __init__(self, id: _Optional[str] = ..., agent: _Optional[str] = ..., policy_version: _Optional[int] = ..., pinned: _Optional[bool] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class ReportRewardRequest(_message.Message):
    __slots__ = ("episode_id", "rewards", "call_rewards", "group_id", "group_size", "failed")
    class RewardsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class CallRewardsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    CALL_REWARDS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    rewards: _containers.ScalarMap[str, float]
    call_rewards: _containers.ScalarMap[str, float]
    group_id: str
    group_size: int
    failed: bool
    def __init__(self, episode_id: _Optional[str] = ..., rewards: _Optional[_Mapping[str, float]] = ..., call_rewards: _Optional[_Mapping[str, float]] = ..., group_id: _Optional[str] = ..., group_size: _Optional[int] = ..., failed: _Optional[bool] = ...) -> None: ...

class ReportRewardResponse(_message.Message):
    __slots__ = ("released", "dropped", "queued", "stale")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    released: int
    dropped: int
    queued: int
    stale: _containers.RepeatedCompositeFieldContainer[StaleCalls]
    def __init__(self, released: _Optional[int] = ..., dropped: _Optional[int] = ..., queued: _Optional[int] = ..., stale: _Optional[_Iterable[_Union[StaleCalls, _Mapping]]] = ...) -> None: ...

class StaleCalls(_message.Message):
    __slots__ = ("episode_id", "agent", "policy_version", "current_version", "max_staleness", "stale_calls")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_STALENESS_FIELD_NUMBER: _ClassVar[int]
    STALE_CALLS_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    agent: str
    policy_version: int
    current_version: int
    max_staleness: int
    stale_calls: int
    def __init__(self, episode_id: _Optional[str] = ..., agent: _Optional[str] = ..., policy_version: _Optional[int] = ..., current_version: _Optional[int] = ..., max_staleness: _Optional[int] = ..., stale_calls: _Optional[int] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("counters",)
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    counters: _containers.ScalarMap[str, float]
    def __init__(self, counters: _Optional[_Mapping[str, float]] = ...) -> None: ...
