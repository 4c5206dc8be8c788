"""The handler of Anthropic's Messages API (``POST /v1/messages``): the request goes through the chat service
(:func:`~services.gateway.http.common.chat_service.serve_chat`, traced like a chat completion) and its reply comes
back as Anthropic's Message object, or as Anthropic's server-sent events when ``stream`` is set (docs/gateway.md,
"Anthropic Messages").

The engine generates whole responses, so a stream is built from the finished generation and sent at once: a
plain reply's text arrives as one ``text_delta`` per generated token that adds text (the pieces join to the text),
each tool call's input as one ``input_json_delta`` (its whole JSON).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from marti.errors import InvalidArgumentError
from marti.types.inference import Generation
from marti.types.tools import ChatReply
from services.gateway.core.gateway import Gateway
from services.gateway.http.anthropic.protocol import MessagesRequest, chat_call
from services.gateway.http.common.chat_service import serve_chat
from services.gateway.http.common.protocol import marti_choice, marti_response
from services.gateway.http.common.sse import event_stream
from services.gateway.http.common.tokens import all_tokens

#: Prefix of a ``tool_use`` block's id; the rest is the gateway's call id after its ``call_`` prefix.
TOOL_USE_ID_PREFIX = "toolu_"


async def messages(
    gateway: Gateway, body: MessagesRequest, request: Request
) -> JSONResponse | StreamingResponse:
    """Answer one Messages request: one assistant message (``text`` and ``tool_use`` blocks), traced when the
    call names an episode, with the gateway's extensions (``prompt_token_ids``, ``token_ids``, ``call_id``,
    ``call_ids``, ``policy_version``, ``agent``).

    Raises:
        InvalidArgumentError: A bad request, naming the field (:func:`~.protocol.chat_call`,
            :func:`~services.gateway.http.common.chat_service.serve_chat`; the stop strings are ``stop_sequences``).
        NotFoundError: Unknown model.  CancelledError: The client disconnected.
    """
    call = chat_call(body)
    try:
        chat = await serve_chat(gateway, request, call)
    except InvalidArgumentError as exc:
        if getattr(exc, "param", None) == "stop":  # the chat service's name for the stop strings
            exc.param = "stop_sequences"  # type: ignore[attr-defined]
        raise
    served = chat.served
    g, reply = served.generations[0], chat.replies[0]
    reason, sequence = await _stop_reason(gateway, served.agent, g, reply, call.body.stop)
    message = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": body.model,
        "content": content_blocks(reply),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {"input_tokens": len(g.prompt_token_ids), "output_tokens": len(g.response_token_ids)},
        **marti_response(served),
        **marti_choice(served, 0),
    }
    if not body.stream:
        return JSONResponse(message)
    pieces = (await all_tokens(gateway, served))[0].pieces if reply.content == g.text else None
    return event_stream(stream_events(message, reply, pieces))


def content_blocks(reply: ChatReply) -> list[dict[str, Any]]:
    """A reply's content blocks: its text (a plain reply always has one text block, possibly empty), then one
    ``tool_use`` block per call (``input``: the arguments as an object)."""
    blocks: list[dict[str, Any]] = []
    if reply.content or not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.content or ""})
    for c in reply.tool_calls:
        block_id = TOOL_USE_ID_PREFIX + c.id.removeprefix("call_")
        blocks.append({"type": "tool_use", "id": block_id, "name": c.name, "input": json.loads(c.arguments)})
    return blocks


async def _stop_reason(
    gateway: Gateway, agent: str, g: Generation, reply: ChatReply, stops: Sequence[str]
) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)``: ``tool_use`` for calls, ``max_tokens`` at the limit, ``stop_sequence``
    with the stop string that ended the text (the response's ids keep the token completing it, the text ends
    before it), else ``end_turn``."""
    if reply.tool_calls:
        return "tool_use", None
    if reply.finish_reason == "length":
        return "max_tokens", None
    if stops:
        whole = await asyncio.to_thread(gateway.backend.decode, agent, g.response_token_ids)
        if whole.startswith(g.text):
            tail = whole[len(g.text) :]
            for s in stops:
                if tail.startswith(s):
                    return "stop_sequence", s
    return "end_turn", None


def stream_events(
    message: dict[str, Any], reply: ChatReply, pieces: Sequence[str] | None
) -> list[tuple[str, dict[str, Any]]]:
    """Anthropic's stream of ``message`` as ``(event, data)`` pairs: ``message_start`` (the message without
    content, with every extension), per block ``content_block_start`` / ``content_block_delta`` /
    ``content_block_stop``, ``message_delta`` (``stop_reason``, ``stop_sequence``, ``output_tokens``) and
    ``message_stop``.

    Args:
        message: The whole Message object.
        reply: The reply it was built from (a call's input streams as its arguments' JSON text).
        pieces: Each generated token's text piece, when they join to the text block's text; None: one delta.
    """
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {"input_tokens": usage["input_tokens"], "output_tokens": 0}
    events = [("message_start", {"type": "message_start", "message": start})]
    arguments = iter(c.arguments for c in reply.tool_calls)
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            first = {"type": "text", "text": ""}
            texts = [block["text"]] if pieces is None else pieces
            deltas = [{"type": "text_delta", "text": t} for t in texts if t]
        else:
            first = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": next(arguments)}]
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": i, "content_block": first})
        )
        events += [
            ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d}) for d in deltas
        ]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    events.append(
        (
            "message_delta",
            {"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage["output_tokens"]}},
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events
