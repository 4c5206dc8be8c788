"""The chat completions route's side of tool calling: its request as a :class:`ChatCall` (OpenAI messages with
``tool_calls`` and ``tool`` results as Hugging Face chat-template messages), and a :class:`~marti.types.tools.ChatReply`
as OpenAI's assistant message or as streamed tool-call deltas."""

from __future__ import annotations

from typing import Any

from marti.types.inference import ChatMessages
from marti.types.tools import ChatReply, ToolCall
from services.gateway.convert import chat_role
from services.gateway.core.json_text import loads_finite
from services.gateway.core.tools import unmatched_tool_result
from services.gateway.http.common.chat_service import ChatCall
from services.gateway.http.common.errors import request_error
from services.gateway.http.completions.protocol import ChatCompletionRequest, ChatMessage

#: Characters of a call's arguments per streamed delta after the first.
ARGUMENT_PIECE_CHARS = 16


def _calls(m: ChatMessage, i: int) -> list[dict[str, Any]]:
    """Message ``i``'s tool calls as chat-template calls (arguments parsed into a dict).

    Raises:
        InvalidArgumentError: Tool calls on a message that is not an assistant's, or arguments that are not JSON
            of an object (naming ``messages[i].tool_calls[j].function.arguments``).
    """
    if m.role != "assistant":
        raise request_error(
            f"messages[{i}] is a {m.role!r} message with tool_calls; only assistant messages make tool calls",
            f"messages[{i}].tool_calls",
        )
    out = []
    for j, c in enumerate(m.tool_calls or ()):
        param = f"messages[{i}].tool_calls[{j}].function.arguments"
        try:
            args = loads_finite(c.function.arguments)
        except ValueError as exc:
            raise request_error(f"{param} is not JSON: {exc}", param) from None
        if not isinstance(args, dict):
            raise request_error(f"{param} must be JSON of an object, got {type(args).__name__}", param)
        out.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": args}})
    return out


def chat_messages(body: ChatCompletionRequest) -> ChatMessages:
    """The request's messages as Hugging Face chat-template messages (``developer`` as ``system``; a message's
    ``name`` is carried as the template message's ``name``, for the chat template to render; a ``refusal`` is
    rendered as content, after the message's own on a new line; a ``tool`` message
    gets the ``name`` of the call it answers when it has none).

    Raises:
        InvalidArgumentError: A bad role, tool calls on a non-assistant message, call arguments that are not JSON
            of an object, a ``tool`` message without a ``tool_call_id`` or whose id matches no earlier call (each
            naming the field).
    """
    out: ChatMessages = []
    names: dict[str, str] = {}
    for i, m in enumerate(body.messages):
        content = "\n".join(t for t in (m.content, m.refusal) if t) if m.refusal else m.content
        msg: dict[str, Any] = {"role": chat_role(m.role, f"messages[{i}].role"), "content": content}
        if m.name is not None:  # the participant's name: the chat template may render it (never dropped here)
            msg["name"] = m.name
        if m.tool_calls:
            msg["tool_calls"] = _calls(m, i)
            names |= {c["id"]: c["function"]["name"] for c in msg["tool_calls"]}
        if m.role == "tool":
            if not m.tool_call_id:
                raise request_error(
                    f"messages[{i}] is a tool message without tool_call_id: it must name the call it answers",
                    f"messages[{i}].tool_call_id",
                )
            msg["tool_call_id"] = m.tool_call_id
            msg["name"] = m.name or names.get(m.tool_call_id, "")
        out.append(msg)
    bad = unmatched_tool_result(out)
    if bad is not None:
        raise request_error(
            f"messages[{bad}].tool_call_id is {out[bad]['tool_call_id']!r}, which matches no tool call of an "
            "earlier assistant message",
            f"messages[{bad}].tool_call_id",
        )
    return out


def chat_call(body: ChatCompletionRequest) -> ChatCall:
    """The request as a protocol-neutral :class:`ChatCall`.

    Raises:
        InvalidArgumentError: As :func:`chat_messages`; or ``max_tokens`` and ``max_completion_tokens`` both given
            with different values (``max_completion_tokens`` would win silently; equal values pass).
    """
    both = body.max_tokens is not None and body.max_completion_tokens is not None
    if both and body.max_tokens != body.max_completion_tokens:
        raise request_error(
            f"max_tokens ({body.max_tokens}) and max_completion_tokens ({body.max_completion_tokens}) disagree: "
            "send one of them (max_tokens is the older name of max_completion_tokens)",
            "max_completion_tokens",
        )
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return ChatCall(
        body=body,
        messages=chat_messages(body),
        tools=[t.model_dump(exclude_none=True) for t in body.tools or ()],
        tool_choice=body.tool_choice,
        parallel_tool_calls=body.parallel_tool_calls is not False,
        max_tokens=max_tokens,
        max_tokens_param=param,
    )


def _call_object(call: ToolCall) -> dict[str, Any]:
    """OpenAI's ``tool_calls[i]`` of a call."""
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def assistant_message(reply: ChatReply) -> dict[str, Any]:
    """OpenAI's assistant ``message`` of a reply (``tool_calls`` only when it made calls)."""
    out: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        out["tool_calls"] = [_call_object(c) for c in reply.tool_calls]
    return out


def tool_call_deltas(index: int, call: ToolCall) -> list[dict[str, Any]]:
    """The streamed ``delta.tool_calls`` entries of call ``index``: its id, type and name with empty arguments,
    then its arguments in pieces of :data:`ARGUMENT_PIECE_CHARS` characters (OpenAI's chunk format)."""
    head = {
        "index": index,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": ""},
    }
    args = call.arguments
    pieces = [args[k : k + ARGUMENT_PIECE_CHARS] for k in range(0, len(args), ARGUMENT_PIECE_CHARS)]
    return [head] + [{"index": index, "function": {"arguments": p}} for p in pieces]
