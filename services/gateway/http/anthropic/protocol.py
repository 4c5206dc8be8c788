"""Anthropic's Messages API request (``POST /v1/messages``) and its translation into a protocol-neutral
:class:`~services.gateway.http.common.chat_service.ChatCall` (Hugging Face chat-template messages, OpenAI chat
function tools, a neutral ``tool_choice``); docs/gateway.md, "Anthropic Messages".

The engine reads text only and samples plain text: image, document and other non-text blocks, ``thinking``,
``output_config.format`` (structured output), ``mcp_servers`` and ``container`` (server tools) are refused with 400
naming the field, never dropped. ``cache_control`` (a prompt-cache hint), ``citations`` and ``metadata`` change
nothing a model generates and are accepted; other unknown keys are ignored, as on the OpenAI routes. ``seed`` (sent
with ``extra_body``: Anthropic's API has none) is honoured as on chat completions. ``temperature`` must be in
[0, 1] (Anthropic's range, not OpenAI's [0, 2]), ``top_p`` in [0, 1] and ``top_k`` >= 0: a value outside is a 400
naming the field and the value.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StrictBool, StrictInt, field_validator

from services.gateway.http.common.chat_service import ChatCall
from services.gateway.http.common.errors import request_error
from services.gateway.http.common.protocol import (
    SampledRequest,
    _Body,
    _Float,
    _Seed,
    _Str,
    _TopP,
    checked_text,
    unapplied,
)
from services.gateway.http.common.tool_shapes import wrong_shape

#: Why ``mcp_servers`` and ``container`` (what server tools run with) are refused.
SERVER_TOOLS = (
    "the gateway runs no server tools (MCP servers, code execution); leave it out and send client tools"
)
#: ``tool_choice`` types of Anthropic's API -> the chat service's choice (``tool``: ``{"name": NAME}``).
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
#: What an ``is_error`` tool result's text is rendered after (chat templates have no error flag for a tool turn).
TOOL_ERROR_PREFIX = "Error: "


class AnthropicMetadata(_Body):
    """``metadata``: ``user_id`` (an opaque id of the end user; it changes nothing generated)."""

    user_id: _Str | None = None


class AnthropicMessage(_Body):
    """One message: ``role`` ``user`` or ``assistant``; ``content`` a string or a list of content blocks (checked
    when translated, naming the block: :func:`chat_call`)."""

    role: _Str
    content: Any

    @field_validator("role")
    @classmethod
    def _role(cls, v: str) -> str:
        if v not in ("user", "assistant"):
            raise ValueError("a message's role must be 'user' or 'assistant' (the system prompt is 'system')")
        return v


class MessagesRequest(_Body):
    """Body of ``POST /v1/messages`` (Anthropic's fields; see the module docstring for what is refused)."""

    model: _Str
    max_tokens: StrictInt
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: Any = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    temperature: Annotated[_Float, Field(ge=0, le=1)] | None = None  # Anthropic's range: [0, 1]
    top_p: _TopP | None = None
    top_k: Annotated[StrictInt, Field(ge=0)] | None = None
    stop_sequences: list[_Str] | None = None
    seed: _Seed | None = None  # an extension (Anthropic's API has none), honoured as on chat completions
    stream: StrictBool | None = False
    metadata: AnthropicMetadata | None = None
    thinking: Any = Field(default=None, validate_default=True)
    output_config: Any = None
    mcp_servers: unapplied(([],), SERVER_TOOLS) = None  # type: ignore[valid-type]
    container: unapplied((), SERVER_TOOLS) = None  # type: ignore[valid-type]

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and not all(v):
            raise ValueError("stop sequences must be non-empty strings")
        return v

    @field_validator("thinking", mode="before")
    @classmethod
    def _thinking(cls, v: Any) -> None:
        """Only absent, null or ``{"type": "disabled"}``: the engine samples one text, without thinking blocks."""
        if v is None or v == {"type": "disabled"}:
            return None
        raise ValueError(
            "extended thinking is not supported: this gateway samples the policy's text as it is, with no separate "
            "thinking blocks; leave thinking out (or {'type': 'disabled'})"
        )

    @field_validator("output_config", mode="before")
    @classmethod
    def _output_config(cls, v: Any) -> Any:
        """No ``format`` (structured output): the engine cannot constrain its sampling to a JSON schema."""
        if isinstance(v, dict) and v.get("format") is not None:
            raise ValueError(
                "output_config.format (structured output) is not supported: this gateway samples plain text and "
                "cannot constrain it to a JSON schema; leave it out and parse or validate the text yourself"
            )
        return v


def chat_call(body: MessagesRequest) -> ChatCall:
    """The chat call of a Messages request: the system prompt and messages as chat-template messages, the tools
    as chat function tools, ``tool_choice`` and the sampling fields.

    Raises:
        InvalidArgumentError: A block the engine cannot read (image, document, thinking, ...), a block in the
            wrong role's message, a ``tool_result`` whose ``tool_use_id`` no earlier ``tool_use`` has, a
            conversation that ends with an assistant message (prefill), a malformed tool or ``tool_choice``
            (each naming the field, e.g. ``messages[2].content[0].tool_use_id``).
    """
    last = len(body.messages) - 1
    if body.messages[last].role != "user":
        raise request_error(
            f"messages[{last}].role is 'assistant': continuing an assistant turn (prefill) is not supported; "
            "end the conversation with a user message",
            f"messages[{last}].role",
        )
    choice, parallel = _tool_choice(body.tool_choice, bool(body.tools))
    sampled = SampledRequest(
        model=body.model,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        stop=list(body.stop_sequences or ()),
        seed=body.seed,
        stream=body.stream,
    )
    return ChatCall(
        body=sampled,
        messages=_system(body.system) + _messages(body.messages),
        tools=_tools(body.tools or []),
        tool_choice=choice,
        parallel_tool_calls=parallel,
        max_tokens=body.max_tokens,
    )


# ---------------------------------------------------------------------------------------------- blocks
def _block_type(block: Any, param: str) -> str:
    """The ``type`` of a content block; InvalidArgumentError naming ``param`` when it is not an object with one."""
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise request_error(f"{param} must be a content block (an object with a 'type')", param)
    return block["type"]


def _refuse_block(kind: str, param: str, allowed: str) -> Exception:
    """The error for a block of ``kind`` where only ``allowed`` blocks may be."""
    why = {
        "image": "this engine reads text only",
        "document": "this engine reads text only",
        "thinking": "extended thinking is not supported",
        "redacted_thinking": "extended thinking is not supported",
    }.get(kind, "it is not supported here")
    return request_error(
        f"{param}.type is {kind!r}: {why}; the blocks allowed here are {allowed}", f"{param}.type"
    )


def _joined_text(blocks: Any, param: str) -> str:
    """The text of a list of ``text`` blocks, joined with newlines (as chat content parts are)."""
    if not isinstance(blocks, list):
        raise request_error(f"{param} must be a string or a list of text blocks", param)
    texts = []
    for j, block in enumerate(blocks):
        if _block_type(block, f"{param}[{j}]") != "text":
            raise _refuse_block(block["type"], f"{param}[{j}]", "'text'")
        texts.append(checked_text(block.get("text"), f"{param}[{j}].text"))
    return "\n".join(texts)


def _system(system: Any) -> list[dict[str, Any]]:
    """The system message (none when ``system`` is absent): a string or a list of text blocks."""
    if system is None:
        return []
    text = system if isinstance(system, str) else _joined_text(system, "system")
    return [{"role": "system", "content": checked_text(text, "system")}]


def _messages(messages: list[AnthropicMessage]) -> list[dict[str, Any]]:
    """The conversation as chat-template messages (a user message's ``tool_result`` blocks become ``tool``
    messages, in order)."""
    out: list[dict[str, Any]] = []
    calls: dict[str, str] = {}  # tool_use id -> tool name, of the assistant messages so far
    for i, m in enumerate(messages):
        param = f"messages[{i}].content"
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": checked_text(m.content, param)})
        elif not isinstance(m.content, list) or not m.content:
            raise request_error(f"{param} must be a string or a non-empty list of content blocks", param)
        elif m.role == "assistant":
            out.append(_assistant(m.content, param, calls))
        else:
            out.extend(_user(m.content, param, calls))
    return out


def _assistant(blocks: list[Any], param: str, calls: dict[str, str]) -> dict[str, Any]:
    """One assistant message: its text blocks (joined) and its ``tool_use`` blocks as tool calls; a text block
    after a ``tool_use`` block is refused (the template would render it before the calls: the order would change,
    silently)."""
    texts: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        where = f"{param}[{j}]"
        kind = _block_type(block, where)
        if kind == "text" and tool_calls:  # the chat template renders a message's text before its calls
            raise request_error(
                f"{where} is a text block after a tool_use block: an assistant message is rendered as its text "
                "then its tool calls, so text after a call would change places; put the text first",
                where,
            )
        if kind == "text":
            texts.append(checked_text(block.get("text"), f"{where}.text"))
        elif kind == "tool_use":
            call_id = checked_text(block.get("id"), f"{where}.id")
            name = checked_text(block.get("name"), f"{where}.name")
            arguments = block.get("input")
            if not isinstance(arguments, dict):
                raise request_error(
                    f"{where}.input must be an object (the call's arguments)", f"{where}.input"
                )
            calls[call_id] = name
            tool_calls.append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        else:
            raise _refuse_block(kind, where, "'text' and 'tool_use' (in an assistant message)")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def _user(blocks: list[Any], param: str, calls: dict[str, str]) -> list[dict[str, Any]]:
    """One user message's blocks: each ``tool_result`` a ``tool`` message, consecutive ``text`` blocks one user
    message, in the order sent."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        where = f"{param}[{j}]"
        kind = _block_type(block, where)
        if kind == "text":
            texts.append(checked_text(block.get("text"), f"{where}.text"))
            continue
        if kind != "tool_result":
            raise _refuse_block(kind, where, "'text' and 'tool_result' (in a user message)")
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
            texts = []
        out.append(_tool_result(block, where, calls))
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tool_result(block: dict[str, Any], where: str, calls: dict[str, str]) -> dict[str, Any]:
    """A ``tool_result`` block as a ``tool`` message: its content (a string or text blocks), after
    :data:`TOOL_ERROR_PREFIX` when ``is_error``."""
    call_id = checked_text(block.get("tool_use_id"), f"{where}.tool_use_id")
    if call_id not in calls:
        raise request_error(
            f"{where}.tool_use_id {call_id!r} matches no tool_use block of an earlier assistant message "
            f"(their ids: {list(calls)})",
            f"{where}.tool_use_id",
        )
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = checked_text(content, f"{where}.content")
    else:
        text = _joined_text(content, f"{where}.content")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise request_error(f"{where}.is_error must be a boolean, got {is_error!r}", f"{where}.is_error")
    if is_error:
        text = TOOL_ERROR_PREFIX + text
    return {"role": "tool", "tool_call_id": call_id, "name": calls[call_id], "content": text}


# ---------------------------------------------------------------------------------------------- tools
def _tools(tools: list[Any]) -> list[dict[str, Any]]:
    """Anthropic's client tools (``name``, ``description``, ``input_schema``) as chat function tools; a tool in
    another API's shape is refused naming ``tools[i]`` and showing this one's."""
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise request_error(f"{where} must be a tool object", where)
        hint = wrong_shape(tool, "messages")
        if hint:
            raise request_error(f"{where}: {hint}", where)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise request_error(
                f"{where}.type is {kind!r}: only client tools (name, description, input_schema) are supported; "
                "the gateway runs no server tools",
                f"{where}.type",
            )
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise request_error(f"{where}.input_schema must be a JSON schema object", f"{where}.input_schema")
        function = {"name": checked_text(tool.get("name"), f"{where}.name"), "parameters": schema}
        if tool.get("description") is not None:
            function["description"] = checked_text(tool["description"], f"{where}.description")
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any, has_tools: bool) -> tuple[str | dict[str, str], bool]:
    """``(chat service tool_choice, parallel calls allowed)`` of Anthropic's ``tool_choice`` (absent: auto); ``any``
    and ``tool`` need tools."""
    if choice is None:
        return "auto", True
    kind = choice.get("type") if isinstance(choice, dict) else None
    hint = wrong_shape(choice, "messages", choice=True)
    if hint:
        raise request_error(f"tool_choice: {hint}", "tool_choice")
    if kind not in (*TOOL_CHOICES, "tool"):
        raise request_error(
            f"tool_choice must be an object whose type is one of {[*TOOL_CHOICES, 'tool']}, got {choice!r}",
            "tool_choice",
        )
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise request_error(
            f"tool_choice.disable_parallel_tool_use must be a boolean, got {disable!r}",
            "tool_choice.disable_parallel_tool_use",
        )
    if kind in ("any", "tool") and not has_tools:
        raise request_error(f"tool_choice {choice!r} needs tools, and the request has none", "tool_choice")
    if kind == "tool":
        return {"name": checked_text(choice.get("name"), "tool_choice.name")}, not disable
    return TOOL_CHOICES[kind], not disable
