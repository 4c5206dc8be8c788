"""The chat service every chat protocol adapter calls (chat completions, Responses, Anthropic messages): one
protocol-neutral chat call with tools in, one :class:`~marti.types.tools.ChatReply` per choice out.

An adapter translates its request into a :class:`ChatCall` (Hugging Face chat-template messages, OpenAI chat
function tool specs, a neutral ``tool_choice``) and its answer from :class:`ChatServed`.
:func:`serve_chat` checks the tools, renders the prompt (:meth:`Gateway.chat_ids`; with ``tool_choice``
``required`` or a named function the prompt is prefilled with the start of a call, so the reply is one), sizes
``max_tokens``, generates (a client that disconnects cancels its call) and parses each reply's tool calls with the
agent's parser (docs/gateway.md, "Tools").
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from marti.types.inference import ChatMessages
from marti.types.tools import ChatReply
from services.gateway.core.gateway import Gateway, Served
from services.gateway.http.common.errors import request_error
from services.gateway.http.common.generate import Sizing, serve_prompt
from services.gateway.http.common.protocol import SampledRequest

#: Chat ``max_tokens`` when absent: this many, or fewer when the model's context has less room left.
DEFAULT_CHAT_MAX_TOKENS = 512
#: ``tool_choice`` values besides a named function (``{"name": NAME}``).
TOOL_CHOICES = ("auto", "none", "required")


@dataclass(frozen=True)
class ChatCall:
    """One chat request, protocol-neutral.

    Attributes:
        body: The sampling fields, ``model``, ``n`` and streaming (a :class:`SampledRequest`, or a subclass).
        messages: Hugging Face chat-template messages: ``{"role", "content"}``, an assistant's ``tool_calls``
            (``[{"id", "type": "function", "function": {"name", "arguments": dict}}]``, content then may be None), a
            ``tool`` message's ``tool_call_id`` (and ``name``).
        tools: OpenAI chat function tool specs ``[{"type": "function", "function": {"name", "description",
            "parameters"}}]``; empty: no tools.
        tool_choice: ``"auto"`` (the model decides), ``"none"`` (tools are rendered but no call is parsed),
            ``"required"`` (the reply is one or more calls) or ``{"name": NAME}`` (the reply calls NAME).
        parallel_tool_calls: False: at most one call (generation stops at the end of the first, where the
            parser's format marks one; a reply with more is returned as text, unparsed).
        max_tokens: The request's limit on generated tokens, or None (:data:`DEFAULT_CHAT_MAX_TOKENS`, or the
            room the context has left).
        max_tokens_param: The field that carries ``max_tokens`` (named in errors).
        messages_param: The field that carries the messages (named in errors about the prompt).
        tools_param: The field that carries the tools (named in errors about them).
    """

    body: SampledRequest
    messages: ChatMessages
    tools: Sequence[dict[str, Any]] = ()
    tool_choice: str | dict[str, str] = "auto"
    parallel_tool_calls: bool = True
    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"
    messages_param: str = "messages"
    tools_param: str = "tools"


@dataclass
class ChatServed:
    """What a chat call got.

    Attributes:
        served: The generations (exact ids, log-probs, versions) and call ids; a forced call's prefilled start is
            part of each generation's prompt ids, not of its response.
        replies: One reply per generation, in order: content, parsed tool calls, finish reason.
        forced: The prefilled start of a call (``""`` when none).
    """

    served: Served
    replies: list[ChatReply] = field(default_factory=list)
    forced: str = ""


def forced_name(call: ChatCall) -> str | None:
    """The function a named ``tool_choice`` forces, or None."""
    return call.tool_choice.get("name") if isinstance(call.tool_choice, dict) else None


def _tool_name(tool: Any) -> Any:
    """The function name of an OpenAI function tool spec (None when it has none)."""
    fn = tool.get("function") if isinstance(tool, dict) else None
    return fn.get("name") if isinstance(fn, dict) else None


def check_tools(gateway: Gateway, call: ChatCall) -> None:
    """Check the tools and ``tool_choice`` of ``call``.

    Raises:
        InvalidArgumentError: Tools longer than ``gateway.max_tools_chars`` characters as JSON, a tool without a
            name or two with one name (naming ``tools``), a ``tool_choice`` that is not one of
            :data:`TOOL_CHOICES` or ``{"name": NAME}``, that needs tools when there are none, or that names a
            function the tools do not define (naming ``tool_choice``).
    """
    size = len(json.dumps(list(call.tools), ensure_ascii=False)) if call.tools else 0
    limit = gateway.limits.max_tools_chars
    if size > limit:
        raise request_error(
            f"{call.tools_param} is {size} characters as JSON, more than gateway.max_tools_chars ({limit})",
            call.tools_param,
        )
    names = [_tool_name(t) for t in call.tools]
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise request_error(f"{call.tools_param}[{i}] has no function name", call.tools_param)
        if name in names[:i]:
            raise request_error(
                f"{call.tools_param}[{i}] is a second function named {name!r}; tool names must be unique",
                call.tools_param,
            )
    choice = call.tool_choice
    if not (choice in TOOL_CHOICES or (isinstance(choice, dict) and isinstance(choice.get("name"), str))):
        raise request_error(
            f"tool_choice must be one of {list(TOOL_CHOICES)} or name a function, got {choice!r}",
            "tool_choice",
        )
    if choice not in ("auto", "none") and not call.tools:
        raise request_error(f"tool_choice {choice!r} needs tools, and the request has none", "tool_choice")
    name = forced_name(call)
    if name is not None and name not in names:
        raise request_error(
            f"tool_choice names the function {name!r}, which is not among the tools: {names}", "tool_choice"
        )


async def serve_chat(gateway: Gateway, request: Request, call: ChatCall) -> ChatServed:
    """Serve one chat call: check, render, size, generate (cancelled if the client disconnects), parse.

    Raises:
        InvalidArgumentError: As :func:`check_tools`; a template that refuses the messages or a prompt too long
            (naming ``call.messages_param``); a bad sampling field or ``max_tokens`` (naming it).
        NotFoundError: Unknown model.  CancelledError: The client disconnected.
        As :meth:`Gateway.generate` otherwise.
    """
    check_tools(gateway, call)
    parse = list(call.tools) if call.tools and call.tool_choice != "none" else None
    agent, _ = gateway.resolve(call.body.model)
    parser = gateway.tool_parser(agent)
    forced = ""
    if parse and call.tool_choice != "auto":
        forced = parser.forced_prefix(forced_name(call))

    tools = list(call.tools) or None
    traced: list[str] = []

    async def render(agent: str, episode_id: str) -> list[int]:
        traced.append(episode_id)
        ids = await gateway.chat_ids(agent, call.messages, tools, episode_id)
        return ids + gateway.backend.encode(agent, forced) if forced else ids

    size = Sizing(
        call.max_tokens,
        call.max_tokens_param,
        DEFAULT_CHAT_MAX_TOKENS,
        call.messages_param,
        (parser.call_end,) if parse and not call.parallel_tool_calls and parser.call_end else (),
        "(the tool parser's end-of-call string) because the request allows one tool call at most "
        "(parallel_tool_calls false; disable_parallel_tool_use on /v1/messages): generation stops after it",
    )
    served = await serve_prompt(gateway, request, call.body, render, size)
    one = not call.parallel_tool_calls
    replies = [
        gateway.parse_reply(served.agent, g, parse, forced, one, cid)
        for g, cid in zip(served.generations, served.call_ids, strict=True)
    ]
    if traced and traced[-1]:
        gateway.remember_replies(traced[-1], served, call.messages, tools, replies)
    return ChatServed(served, replies, forced)
