"""The handler of OpenAI's Responses API (``POST /v1/responses``): the request (with the conversation of its
``previous_response_id``) goes through the chat service
(:func:`~services.gateway.http.common.chat_service.serve_chat`, traced like a chat completion) and its reply comes
back as the Response object, or as the Responses server-sent events when ``stream`` is set (docs/gateway.md,
"Responses API").

The engine generates whole responses, so a stream is built from the finished generation and sent at once: a
plain reply's text arrives as one ``response.output_text.delta`` per generated token that adds text (the deltas
join to the text), each function call's arguments as one ``response.function_call_arguments.delta``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from marti.types.tools import ChatReply
from services.gateway.core.gateway import Gateway
from services.gateway.http.common.chat_service import ChatServed, serve_chat
from services.gateway.http.common.context import episode_context
from services.gateway.http.common.protocol import marti_choice, marti_response
from services.gateway.http.common.sse import event_stream
from services.gateway.http.common.tokens import all_tokens
from services.gateway.http.responses.protocol import ResponsesRequest, chat_call
from services.gateway.http.responses.store import ResponseStore, StoredResponse, new_response_id


async def create_response(
    gateway: Gateway, store: ResponseStore, body: ResponsesRequest, request: Request
) -> JSONResponse | StreamingResponse:
    """Answer one Responses request: ``output`` holds a ``message`` item (``output_text``) and one
    ``function_call`` item per call, traced when the call names an episode, with the gateway's extensions
    (``prompt_token_ids``, ``token_ids``, ``call_id``, ``call_ids``, ``policy_version``, ``agent``); stored
    (``store``, the default) for a later ``previous_response_id`` of the same episode.

    Raises:
        InvalidArgumentError: A bad request, naming the field (:func:`~.protocol.chat_call`,
            :func:`~services.gateway.http.common.chat_service.serve_chat`); a ``previous_response_id`` of another
            episode.
        NotFoundError: Unknown model, or a ``previous_response_id`` not stored.  CancelledError: The client
            disconnected.
    """
    episode_id, _ = episode_context(request)
    previous = None
    if body.previous_response_id is not None:
        previous = store.get(body.previous_response_id, episode_id)
    history = previous.conversation() if previous is not None else []
    call = chat_call(body, history)
    chat = await serve_chat(gateway, request, call)
    rid = new_response_id()
    reply = chat.replies[0]
    if body.store is not False:
        own = call.messages[len(history) + (body.instructions is not None) :]  # the input's own messages
        store.put(StoredResponse(rid, episode_id, (*own, reply_message(reply)), previous))
    response = response_object(rid, body, chat)
    if not body.stream:
        return JSONResponse(response)
    g = chat.served.generations[0]
    pieces = (await all_tokens(gateway, chat.served))[0].pieces if reply.content == g.text else None
    return event_stream([(e["type"], e) for e in stream_events(response, pieces)])


def reply_message(reply: ChatReply) -> dict[str, Any]:
    """A reply as the chat-template assistant message its output items translate back to (the message's text,
    or None when the reply is only calls; the calls with parsed arguments)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.loads(c.arguments)},
            }
            for c in reply.tool_calls
        ]
    return message


def output_items(reply: ChatReply) -> list[dict[str, Any]]:
    """A reply's output items: a ``message`` with its text (a reply without calls always has one, possibly
    empty), then one ``function_call`` per call (``call_id`` is the gateway's ``call_...`` id)."""
    status = "incomplete" if reply.finish_reason == "length" else "completed"
    items: list[dict[str, Any]] = []
    if reply.content or not reply.tool_calls:
        text = {"type": "output_text", "text": reply.content or "", "annotations": [], "logprobs": []}
        items.append(
            {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "status": status}
        )
        items[-1]["content"] = [text]
    for c in reply.tool_calls:
        items.append(
            {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                "call_id": c.id,
                "name": c.name,
                "arguments": c.arguments,
                "status": "completed",
            }
        )
    return items


def response_object(rid: str, body: ResponsesRequest, chat: ChatServed) -> dict[str, Any]:
    """The Response object of a served request: ``status`` ``completed``, or ``incomplete`` (with
    ``incomplete_details.reason`` ``max_output_tokens``) when the reply was cut by the limit; the request's
    settings echoed; ``usage`` in tokens; the gateway's extensions."""
    served, reply = chat.served, chat.replies[0]
    g = served.generations[0]
    cut = reply.finish_reason == "length"
    prompt, output = len(g.prompt_token_ids), len(g.response_token_ids)
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": body.model,
        "instructions": body.instructions,
        "output": output_items(reply),
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": list(body.tools or ()),
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_output_tokens": body.max_output_tokens,
        "previous_response_id": body.previous_response_id,
        "store": body.store is not False,
        "metadata": dict(body.metadata or {}),
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output,
        },
        **marti_response(served),
        **marti_choice(served, 0),
    }


def stream_events(response: dict[str, Any], pieces: Sequence[str] | None) -> list[dict[str, Any]]:
    """The Responses stream of ``response``: ``response.created`` and ``response.in_progress`` (the response
    without output), per output item ``response.output_item.added``, its content (a message:
    ``response.content_part.added``, ``response.output_text.delta`` s, ``response.output_text.done``,
    ``response.content_part.done``; a function call: ``response.function_call_arguments.delta`` and ``.done``)
    and ``response.output_item.done``, then ``response.completed`` (or ``response.incomplete``) with the whole
    response; every event has its ``sequence_number``.

    Args:
        response: The whole Response object.
        pieces: Each generated token's text piece, when they join to the message's text; None: one delta.
    """
    start = {**response, "status": "in_progress", "output": [], "incomplete_details": None}
    events = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
    ]
    for k, item in enumerate(response["output"]):
        events.append({"type": "response.output_item.added", "output_index": k, "item": _started(item)})
        events += _message_events(item, k, pieces) if item["type"] == "message" else _call_events(item, k)
        events.append({"type": "response.output_item.done", "output_index": k, "item": item})
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    events.append({"type": final, "response": response})
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]


def _started(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as ``response.output_item.added`` shows it: in progress, without its content."""
    if item["type"] == "message":
        return {**item, "status": "in_progress", "content": []}
    return {**item, "status": "in_progress", "arguments": ""}


def _message_events(item: dict[str, Any], k: int, pieces: Sequence[str] | None) -> list[dict[str, Any]]:
    """The events of a message item's one ``output_text`` part."""
    part = item["content"][0]
    at = {"item_id": item["id"], "output_index": k, "content_index": 0}
    texts = [part["text"]] if pieces is None else pieces
    return [
        {"type": "response.content_part.added", **at, "part": {**part, "text": ""}},
        *({"type": "response.output_text.delta", **at, "delta": t, "logprobs": []} for t in texts if t),
        {"type": "response.output_text.done", **at, "text": part["text"], "logprobs": []},
        {"type": "response.content_part.done", **at, "part": part},
    ]


def _call_events(item: dict[str, Any], k: int) -> list[dict[str, Any]]:
    """The events of a function call item's arguments (one delta: the whole JSON text)."""
    at = {"item_id": item["id"], "output_index": k}
    return [
        {"type": "response.function_call_arguments.delta", **at, "delta": item["arguments"]},
        {
            "type": "response.function_call_arguments.done",
            **at,
            "name": item["name"],
            "arguments": item["arguments"],
        },
    ]
