"""OpenAI's Responses API request (``POST /v1/responses``) and its translation into a protocol-neutral
:class:`~services.gateway.http.common.chat_service.ChatCall` (Hugging Face chat-template messages, OpenAI chat
function tools, a neutral ``tool_choice``); docs/gateway.md, "Responses API".

``input`` is a string (one user message) or a list of items: messages (``role`` user, assistant, system or
developer; content a string or ``input_text`` / ``output_text`` / ``refusal`` parts), ``function_call`` items (the
calls of an assistant turn: consecutive calls, and the assistant message just before them, are one assistant turn)
and ``function_call_output`` items (a ``tool`` message answering an earlier call). ``instructions`` is the system
message, put first (never carried over from a ``previous_response_id``, as in OpenAI's API).

What the engine cannot honour is refused with 400 naming the field, never dropped: non-text content (images,
files, audio), hosted tools (web search, file search, ...), ``text.format`` other than text, ``reasoning`` with an
effort or summary, ``truncation: "auto"``, log-probabilities, ``conversation``, ``prompt``, ``background``,
``max_tool_calls``, item references and reasoning items. ``include`` values that only concern items the gateway
never produces, a function tool's ``strict`` flag (the arguments are checked to be JSON of an object, not against
the schema), ``metadata`` (echoed back) and ``user``-style hints are accepted; other unknown keys are ignored, as
on the other OpenAI routes. ``seed`` (sent with ``extra_body``: OpenAI's Responses API has none) is honoured as
on chat completions: a seeded request runs in a batch of its own, so it gives the same tokens whatever else is in
flight. ``temperature`` must be in [0, 2] and ``top_p`` in [0, 1], as OpenAI's (a 400 naming the field). Sampling
fields of the other routes (``n``, ``top_k``, ``stop``, ``presence_penalty``, ``frequency_penalty``) are refused unless
neutral, never ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StrictBool, StrictInt

from marti.errors import InvalidArgumentError
from marti.types.chat_content import content_text
from marti.types.inference import ChatMessages
from services.gateway.convert import chat_role
from services.gateway.core.json_text import loads_finite
from services.gateway.core.tools import unmatched_tool_result
from services.gateway.http.common.chat_service import ChatCall
from services.gateway.http.common.errors import request_error
from services.gateway.http.common.protocol import (
    NOT_SAMPLED,
    SampledRequest,
    _Body,
    _Seed,
    _Str,
    _Temperature,
    _TopP,
    checked_text,
    unapplied,
)
from services.gateway.http.common.tool_shapes import wrong_shape

#: Why ``top_k`` and ``stop`` (chat completions' sampling fields, sent with ``extra_body``) are refused here.
NOT_ON_RESPONSES = (
    "OpenAI's Responses API has no such field and this route does not apply it (only seed is honoured as an "
    "extension); leave it out, or call /v1/chat/completions, which applies n, top_k and stop"
)
#: Content part types whose text a message item may carry (``refusal`` parts carry theirs in ``refusal``).
TEXT_PARTS = ("input_text", "output_text", "text")
#: ``include`` values accepted: they only ask for parts of items the gateway never produces (hosted tool results,
#: images, reasoning), so there is nothing to add. ``message.output_text.logprobs`` is refused.
IGNORED_INCLUDES = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
)


#: OpenAI's limits on ``metadata``: at most 16 pairs, keys up to 64 characters, values up to 512.
_MetadataKey = Annotated[_Str, Field(max_length=64)]
_MetadataValue = Annotated[_Str, Field(max_length=512)]


class ResponsesRequest(_Body):
    """Body of ``POST /v1/responses`` (OpenAI's fields; see the module docstring for what is refused). ``input``,
    ``tools``, ``tool_choice`` and the refused fields are checked when translated (:func:`chat_call`), naming the
    field, e.g. ``input[2].content[0].type``."""

    model: _Str
    input: Any = None
    instructions: _Str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = True
    max_output_tokens: StrictInt | None = None
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    seed: _Seed | None = None
    store: StrictBool | None = True
    stream: StrictBool | None = False
    previous_response_id: _Str | None = None
    metadata: dict[_MetadataKey, _MetadataValue] | None = Field(default=None, max_length=16)
    include: list[_Str] | None = None
    reasoning: Any = None
    text: Any = None
    truncation: Any = None
    top_logprobs: StrictInt | None = None
    conversation: Any = None
    prompt: Any = None
    background: StrictBool | None = None
    max_tool_calls: StrictInt | None = None
    top_k: unapplied((0, -1), NOT_ON_RESPONSES) = None  # type: ignore[valid-type]
    stop: unapplied(((), [], ""), NOT_ON_RESPONSES) = None  # type: ignore[valid-type]
    n: unapplied((1,), NOT_ON_RESPONSES) = None  # type: ignore[valid-type]  # one output per response
    presence_penalty: unapplied((0,), NOT_SAMPLED) = None  # type: ignore[valid-type]
    frequency_penalty: unapplied((0,), NOT_SAMPLED) = None  # type: ignore[valid-type]


def chat_call(body: ResponsesRequest, previous: ChatMessages = ()) -> ChatCall:
    """The chat call of a Responses request: ``instructions`` as the system message, then ``previous`` (the
    conversation of the ``previous_response_id`` chain, already translated), then ``input``; the tools as chat
    function tools; ``tool_choice``, ``parallel_tool_calls`` and the sampling fields (``seed`` too: an extension
    OpenAI's Responses API lacks, honoured as on chat completions).

    Args:
        body: The request.
        previous: Chat-template messages of the stored conversation it continues (empty: none).

    Raises:
        InvalidArgumentError: A field the engine cannot honour, a malformed item, part, tool or ``tool_choice``, a
            ``function_call_output`` whose ``call_id`` matches no earlier call (each naming the field).
    """
    refuse_unsupported(body)
    system = [] if body.instructions is None else [{"role": "system", "content": body.instructions}]
    messages = input_messages(body.input, previous)
    sampled = SampledRequest(
        model=body.model, temperature=body.temperature, top_p=body.top_p, seed=body.seed, stream=body.stream
    )
    return ChatCall(
        body=sampled,
        messages=system + list(previous) + messages,
        tools=function_tools(body.tools or []),
        tool_choice=tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        max_tokens=body.max_output_tokens,
        max_tokens_param="max_output_tokens",
        messages_param="input",
    )


# ---------------------------------------------------------------------------------------------- refused fields
def _refuse(param: str, why: str) -> Exception:
    return request_error(f"{param}: {why}", param)


def refuse_unsupported(body: ResponsesRequest) -> None:
    """Raise InvalidArgumentError naming the first field whose value the engine cannot honour (the module
    docstring lists them); absent, null or default values pass."""
    for name in ("conversation", "prompt", "max_tool_calls"):
        if getattr(body, name) is not None:
            raise _refuse(name, f"{name} is not supported by this gateway; leave it out")
    if body.background:
        raise _refuse("background", "background responses are not supported; leave background out or false")
    if body.truncation not in (None, "disabled"):
        raise _refuse(
            "truncation",
            f"only 'disabled' is supported, got {body.truncation!r}: the gateway never drops items of a "
            "conversation (the trained sample would not be what the client sent); an input too long for the "
            "model is refused",
        )
    if isinstance(body.reasoning, dict) and any(v is not None for v in body.reasoning.values()):
        raise _refuse(
            "reasoning", "the policy has no reasoning settings (effort, summary); leave reasoning out"
        )
    if body.reasoning is not None and not isinstance(body.reasoning, dict):
        raise _refuse("reasoning", f"must be an object, got {body.reasoning!r}")
    _refuse_text(body.text)
    if body.top_logprobs:
        raise _refuse(
            "top_logprobs", "must be 0 or absent: the engine records only the sampled token's log-prob"
        )
    for i, value in enumerate(body.include or ()):
        if value not in IGNORED_INCLUDES:
            raise _refuse(
                f"include[{i}]",
                f"{value!r} is not supported: the Responses route reports no log-probabilities (use "
                f"/v1/chat/completions with logprobs); accepted values: {list(IGNORED_INCLUDES)}",
            )


def _refuse_text(text: Any) -> None:
    """``text`` may only ask for plain text (``{"format": {"type": "text"}}``) at the default ``verbosity``."""
    if text is None:
        return
    if not isinstance(text, dict):
        raise _refuse("text", f"must be an object, got {text!r}")
    fmt = text.get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else fmt
    if fmt is not None and kind != "text":
        raise _refuse(
            "text.format",
            f"type {kind!r} is not supported: this gateway samples plain text and cannot constrain the output to "
            "JSON or a schema; leave text.format out (or {'type': 'text'}) and parse or validate the text yourself",
        )
    if text.get("verbosity") not in (None, "medium"):
        raise _refuse("text.verbosity", f"only 'medium' is supported, got {text['verbosity']!r}")


# ---------------------------------------------------------------------------------------------- input
#: A message item's content part type -> the key holding its text.
_PART_TEXT = {**{kind: "text" for kind in TEXT_PARTS}, "refusal": "refusal"}


def _content(content: Any, param: str) -> str:
    """A message item's content: a string, or text parts joined with newlines (as chat content parts are).

    Raises:
        InvalidArgumentError: As :func:`marti.types.chat_content.content_text`, with ``param`` the field at fault.
    """
    return content_text(content, param, _PART_TEXT)


def _role(value: Any, param: str) -> str:
    """A message item's role as rendered (``developer`` as ``system``); InvalidArgumentError naming ``param``
    for a role that is not a chat role, or ``tool`` (a tool's output is a ``function_call_output`` item)."""
    try:
        role = chat_role(checked_text(value, param), param)
    except InvalidArgumentError as exc:
        raise request_error(exc.message, param) from None
    if role == "tool":
        raise request_error(f"{param} is 'tool': send a function_call_output item", param)
    return role


def _item_type(item: Any, param: str) -> str:
    """An input item's type (``message`` when it has a ``role`` and no ``type``: OpenAI's easy input message)."""
    if not isinstance(item, dict):
        raise request_error(f"{param} must be an input item (an object)", param)
    kind = item.get("type", "message" if "role" in item else None)
    if kind not in ("message", "function_call", "function_call_output"):
        raise request_error(
            f"{param}.type is {kind!r}: the items supported are messages, function_call and "
            "function_call_output (no item references, reasoning or hosted tool items)",
            f"{param}.type",
        )
    return kind


def _function_call(item: dict[str, Any], param: str) -> dict[str, Any]:
    """A ``function_call`` item as a chat-template call (arguments parsed: they must be JSON of an object)."""
    call_id = checked_text(item.get("call_id"), f"{param}.call_id")
    name = checked_text(item.get("name"), f"{param}.name")
    text = checked_text(item.get("arguments"), f"{param}.arguments")
    try:
        arguments = loads_finite(text)
    except ValueError as exc:
        raise request_error(f"{param}.arguments is not JSON: {exc}", f"{param}.arguments") from None
    if not isinstance(arguments, dict):
        raise request_error(
            f"{param}.arguments must be JSON of an object, got {type(arguments).__name__}",
            f"{param}.arguments",
        )
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def input_messages(items: Any, previous: ChatMessages = ()) -> ChatMessages:
    """``input`` as chat-template messages; ``previous`` (the stored conversation before it) only supplies the
    calls a ``function_call_output`` may answer.

    Raises:
        InvalidArgumentError: ``input`` is absent, or neither a non-empty string nor a non-empty list of items, a malformed item or
            part, or a ``function_call_output`` whose ``call_id`` matches no earlier call (naming the field).
    """
    if isinstance(items, str) and items:
        return [{"role": "user", "content": checked_text(items, "input")}]
    if not isinstance(items, list) or not items:
        got = "is required" if items is None else f"is {items!r}"
        raise request_error(
            f"input {got}: it must be a non-empty string or a non-empty list of input items (the conversation "
            "the model answers; nothing is generated from an empty one)",
            "input",
        )
    out: ChatMessages = []
    origin: dict[int, int] = {}  # index in out of a tool message -> index of its item
    turn: dict[str, Any] | None = None  # the assistant message function_call items join
    for i, item in enumerate(items):
        param = f"input[{i}]"
        kind = _item_type(item, param)
        if kind == "function_call":
            if turn is None:
                turn = {"role": "assistant", "content": None}
                out.append(turn)
            turn.setdefault("tool_calls", []).append(_function_call(item, param))
            continue
        if kind == "function_call_output":
            msg = {"role": "tool", "tool_call_id": checked_text(item.get("call_id"), f"{param}.call_id")}
            msg["content"] = _content(item.get("output"), f"{param}.output")
            origin[len(out)] = i
            turn = None
        else:
            role = _role(item.get("role"), f"{param}.role")
            msg = {"role": role, "content": _content(item.get("content"), f"{param}.content")}
            turn = msg if role == "assistant" else None
        out.append(msg)
    _name_results(out, list(previous), origin)
    return out


def _name_results(out: ChatMessages, previous: ChatMessages, origin: dict[int, int]) -> None:
    """Give each ``tool`` message of ``out`` the ``name`` of the call it answers; InvalidArgumentError naming the
    ``call_id`` of the first that answers no call of ``previous`` or of an earlier item (``origin``: index in
    ``out`` -> index of its item)."""
    bad = unmatched_tool_result(previous + out)
    if bad is not None:
        k = bad - len(previous)
        param = f"input[{origin[k]}].call_id"
        raise request_error(
            f"{param} is {out[k]['tool_call_id']!r}, which matches no function_call of an earlier item (or of "
            "the previous response)",
            param,
        )
    names = {c["id"]: c["function"]["name"] for m in previous + out for c in m.get("tool_calls") or ()}
    for m in out:
        if m["role"] == "tool":
            m["name"] = names[m["tool_call_id"]]


# ---------------------------------------------------------------------------------------------- tools
def function_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """Responses' flat function tools (``{"type": "function", "name", "description", "parameters",
    "strict"}``) as chat function tools; ``strict`` is accepted (the arguments are not constrained to the schema).

    Raises:
        InvalidArgumentError: A tool in another API's shape (naming ``tools[i]`` and showing the flat shape), a
            tool that is not a function tool (hosted tools: web search, file search, ...), or whose name,
            description or parameters are malformed (naming ``tools[i]`` and the field).
    """
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        hint = wrong_shape(tool, "responses")
        if hint:
            raise request_error(f"{where}: {hint}", where)
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise request_error(
                f"{where}.type is {kind!r}: only function tools are supported; the gateway runs no hosted tools",
                f"{where}.type",
            )
        function: dict[str, Any] = {"name": checked_text(tool.get("name"), f"{where}.name")}
        if tool.get("description") is not None:
            function["description"] = checked_text(tool["description"], f"{where}.description")
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise request_error(f"{where}.parameters must be a JSON schema object", f"{where}.parameters")
        if parameters is not None:
            function["parameters"] = parameters
        out.append({"type": "function", "function": function})
    return out


def tool_choice(choice: Any) -> str | dict[str, str]:
    """The chat service's ``tool_choice``: ``auto`` (also when absent), ``none``, ``required``, or
    ``{"type": "function", "name": NAME}`` as ``{"name": NAME}``.

    Raises:
        InvalidArgumentError: Any other value (hosted tool choices, ``allowed_tools``, another API's shape: the
            message shows this one's), naming ``tool_choice``.
    """
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        return choice
    hint = wrong_shape(choice, "responses", choice=True)
    if hint:
        raise request_error(f"tool_choice: {hint}", "tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"name": checked_text(choice.get("name"), "tool_choice.name")}
    raise request_error(
        f"tool_choice must be 'auto', 'none', 'required' or {{'type': 'function', 'name': NAME}}, got {choice!r}",
        "tool_choice",
    )
