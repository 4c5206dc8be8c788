"""The request bodies (pydantic) and response objects of OpenAI's Chat Completions and Completions APIs
(``/v1/chat/completions``, ``/v1/completions``; vLLM's ``protocol.py``): messages, function tools and their calls,
and the ``usage`` object. The fields every chat API shares are :mod:`services.gateway.http.common.protocol`'s.

Strings must be encodable as UTF-8 (a lone surrogate escape is refused, naming the field); unknown keys are ignored
(see :mod:`services.gateway.http`). Known fields whose value the engine cannot honour are refused with 400 naming
them unless they are neutral, never ignored: the penalties and ``logit_bias`` (:class:`SampledRequest`),
``reasoning_effort``, ``web_search_options``, ``modalities`` other than text, ``audio``, and a message's
``function_call`` or ``audio``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from marti.errors import InvalidArgumentError
from marti.types.chat_content import content_text
from services.gateway.convert import CHAT_ROLES
from services.gateway.core.gateway import Served
from services.gateway.http.common.protocol import SampledRequest, _Body, _Str, _utf8, unapplied
from services.gateway.http.common.tool_shapes import wrong_shape

#: Why ``web_search_options`` is refused.
HOSTED = "the gateway runs no hosted tools (web search); leave web_search_options out and give the agent a function tool"
#: Why a message's deprecated ``function_call`` is refused (the call would vanish from the history).
MESSAGE_FUNCTION_CALL = (
    "the deprecated function_call of a message is not rendered; send the call as tool_calls=[{'id': ..., "
    "'type': 'function', 'function': {'name': ..., 'arguments': ...}}] and its result as a tool message"
)
#: Completions ``max_tokens`` when absent (OpenAI's default).
DEFAULT_COMPLETION_MAX_TOKENS = 16


class FunctionCall(_Body):
    """The function of a tool call an assistant message made: its name and its arguments as JSON text (of an
    object, checked when the message is rendered)."""

    name: Annotated[_Str, Field(min_length=1)]
    arguments: _Str


class ToolCallIn(_Body):
    """One tool call of an assistant message in the history (as the gateway returned it)."""

    id: Annotated[_Str, Field(min_length=1)]
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionSpec(_Body):
    """A function tool: its name, description and JSON-schema ``parameters``."""

    name: Annotated[_Str, Field(min_length=1, max_length=256)]
    description: _Str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(_Body):
    """One entry of ``tools``: only function tools; a tool in another API's shape (the Responses API's flat one,
    Anthropic's) is refused with this one shown."""

    type: Literal["function"]
    function: FunctionSpec

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, v: Any) -> Any:
        hint = wrong_shape(v, "chat")
        if hint:
            raise ValueError(hint)
        return v


def _content_text(v: Any) -> str:
    """``v`` (a non-null content) as one text (:func:`marti.types.chat_content.content_text`); a PydanticCustomError
    whose ``param_suffix`` names the part at fault (``[j].type``, ``[j].text``), so the 400 names
    ``messages[i].content[j].text``."""
    try:
        return content_text(v, "content")
    except InvalidArgumentError as exc:
        suffix = str(getattr(exc, "param", "content")).removeprefix("content")
        raise PydanticCustomError("content_part", exc.message, {"param_suffix": suffix}) from None


class ChatMessage(_Body):
    """One message; ``role`` is one of OpenAI's (:data:`~services.gateway.convert.CHAT_ROLES`; ``developer`` is
    rendered as ``system``); ``content`` is a string or a list of ``{"type": "text", "text": ...}`` parts (joined
    with newlines, as vLLM does), or null (or absent) in an assistant message only (one that made tool calls).
    An assistant message may carry ``tool_calls``; a ``tool`` message carries the ``tool_call_id`` it answers;
    ``name`` goes to the chat template; an assistant's ``refusal`` is rendered as its content (after the content, on
    a new line, when it has both), as a Responses ``refusal`` part is. ``function_call`` and ``audio`` are refused
    (never dropped from the history)."""

    role: _Str
    content: Any = Field(default=None, validate_default=True)
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: _Str | None = None
    name: _Str | None = None
    function_call: unapplied((), MESSAGE_FUNCTION_CALL) = None  # type: ignore[valid-type]
    refusal: _Str | None = None
    audio: unapplied(
        (), "the engine reads text only: a message's audio cannot be rendered; send its transcript as content"
    ) = None  # type: ignore[valid-type]

    @field_validator("role")
    @classmethod
    def _role(cls, v: str) -> str:
        if v not in CHAT_ROLES:
            raise ValueError(f"a chat message's role must be one of {list(CHAT_ROLES)}")
        return v

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, v: Any, info: ValidationInfo) -> str:
        if v is None:
            role = info.data.get("role")
            if role is not None and role != "assistant":  # None: the role was refused already
                raise ValueError(
                    f"content is required in a {role!r} message (only an assistant's may be null)"
                )
            return ""
        return _content_text(v)


class ChatCompletionRequest(SampledRequest):
    """Body of ``POST /v1/chat/completions`` (OpenAI's fields; see the module docstring for what is ignored)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = None
    response_format: Any = Field(default=None, validate_default=True)
    tools: list[ToolSpec] | None = None
    tool_choice: Any = Field(default=None, validate_default=True)
    parallel_tool_calls: StrictBool | None = True
    functions: Any = None
    function_call: Any = None
    reasoning_effort: unapplied((), "the policy has no reasoning settings; leave reasoning_effort out") = None  # type: ignore[valid-type]
    web_search_options: unapplied((), HOSTED) = None  # type: ignore[valid-type]
    modalities: unapplied(
        (["text"],), "the engine generates text only; leave modalities out (or ['text'])"
    ) = None  # type: ignore[valid-type]
    audio: unapplied((), "the engine generates text only (no audio output); leave audio out") = None  # type: ignore[valid-type]

    @field_validator("functions")
    @classmethod
    def _functions(cls, v: Any) -> None:
        """OpenAI's deprecated ``functions`` are refused (the model would never see them): use ``tools``."""
        if v in (None, []):
            return None
        raise ValueError(
            "the deprecated functions field is not supported (the model would not see them): send each function "
            "as a tool, tools=[{'type': 'function', 'function': {...}}]"
        )

    @field_validator("function_call")
    @classmethod
    def _function_call(cls, v: Any) -> None:
        """OpenAI's deprecated ``function_call``: only ``"none"`` / ``"auto"`` (what happens without it) pass."""
        if v in (None, "none", "auto"):
            return None
        raise ValueError(
            "the deprecated function_call field is not supported: use tool_choice ('required', or "
            "{'type': 'function', 'function': {'name': NAME}}) with tools"
        )

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice(cls, v: Any) -> str | dict[str, str]:
        """``auto`` (also when absent), ``none``, ``required``, or ``{"type": "function", "function": {"name":
        NAME}}`` as ``{"name": NAME}``."""
        if v is None:
            return "auto"
        if v in ("auto", "none", "required"):
            return v
        fn = v.get("function") if isinstance(v, dict) and v.get("type") == "function" else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
            return {"name": _utf8(fn["name"])}
        hint = wrong_shape(v, "chat", choice=True)
        if hint:
            raise ValueError(hint)
        raise ValueError(
            "tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': NAME}}"
        )

    @field_validator("response_format", mode="before")
    @classmethod
    def _response_format(cls, v: Any) -> None:
        """Only plain text (absent, null or ``{"type": "text"}``): the engine cannot constrain its output."""
        if v is None or v == {"type": "text"}:
            return None
        kind = v.get("type") if isinstance(v, dict) else None
        raise ValueError(
            f"response_format type {kind!r} is not supported: this gateway samples plain text and cannot "
            "constrain the output to JSON or a schema; leave response_format out (or {'type': 'text'}) and "
            "parse or validate the text yourself"
        )


class CompletionRequest(SampledRequest):
    """Body of ``POST /v1/completions``: ``prompt`` is a string or token ids (or a one-element list of either)."""

    prompt: Any
    max_tokens: StrictInt | None = None
    logprobs: StrictInt | None = None
    echo: StrictBool | None = False
    suffix: Any = None
    best_of: Any = None

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: Any) -> None:
        """``suffix`` (text after the completion: fill-in-the-middle) is refused unless empty."""
        if v in (None, ""):
            return None
        raise ValueError(
            "suffix is not supported: the gateway only continues the prompt (no fill-in-the-middle); leave it out"
        )

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: Any) -> None:
        """``best_of`` above 1 is refused (the gateway never picks among samples): use ``n``."""
        if v is None or (v == 1 and not isinstance(v, bool)):
            return None
        raise ValueError(
            "only best_of 1 is supported: the gateway never picks the best of several samples; ask for n "
            "choices and pick among them yourself (each one is a recorded call)"
        )

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v: Any) -> str | list[int]:
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
            v = v[0]  # a batch of one prompt
        if isinstance(v, str):
            return _utf8(v)
        if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            if min(v) < 0:
                raise ValueError(f"token ids must be >= 0, got {min(v)}")
            return v
        if isinstance(v, list) and len(v) > 1 and all(isinstance(p, (str, list)) for p in v):
            raise ValueError(f"a batch of {len(v)} prompts is not supported; send one request per prompt")
        raise ValueError("prompt must be a string or a non-empty list of token ids")


# ---------------------------------------------------------------------------------------------- response objects
def usage(served: Served) -> dict[str, int]:
    """OpenAI's ``usage`` object: prompt tokens (once), generated tokens of every choice, and their sum."""
    prompt = len(served.generations[0].prompt_token_ids)
    completion = sum(len(g.response_token_ids) for g in served.generations)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
