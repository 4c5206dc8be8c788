"""The server-sent events of a streamed chat completion or completion (see :mod:`services.gateway.http`,
"Streaming"): the engine generates whole responses, so the events are built from the finished generation and sent
at once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi.responses import StreamingResponse

from marti.types.tools import ChatReply
from services.gateway.core.gateway import Served
from services.gateway.http.common.chat_service import ChatServed
from services.gateway.http.common.protocol import SampledRequest, marti_choice
from services.gateway.http.common.tokens import Tokens, chat_logprobs, text_logprobs
from services.gateway.http.completions.chat_tools import tool_call_deltas
from services.gateway.http.completions.protocol import usage


def stream_response(
    served: Served,
    tokens: Sequence[Tokens],
    head: dict[str, Any],
    body: SampledRequest,
    logprobs: bool,
    replies: ChatServed | None = None,
) -> StreamingResponse:
    """The server-sent events of a served request: per choice, (chat: the role,) one chunk per generated token
    whose piece is not empty (every token when ``logprobs``), the final chunk with ``finish_reason`` and the
    choice's extensions; the first chunk has ``prompt_token_ids``; then the usage chunk when asked, ``[DONE]``.

    Chat choices whose reply (``replies``) made tool calls are streamed as the reply's content (one chunk, when
    there is any), then each call's ``delta.tool_calls`` (:func:`tool_call_deltas`), with every token's log-prob
    on the first of those chunks; a forced call's prefilled start that was not parsed is the first content chunk.
    """
    chat = head["object"] == "chat.completion.chunk"
    chunks: list[dict[str, Any]] = []
    for i, (g, toks) in enumerate(zip(served.generations, tokens, strict=True)):

        def choice(
            piece: str | None, lp: dict[str, Any] | None, finish: str | None, i: int = i
        ) -> dict[str, Any]:
            text = {"delta": {} if piece is None else {"content": piece}} if chat else {"text": piece or ""}
            return {**head, "choices": [{"index": i, **text, "logprobs": lp, "finish_reason": finish}]}

        if chat:
            chunks.append(choice("", None, None))
            chunks[-1]["choices"][0]["delta"]["role"] = "assistant"
        reply = replies.replies[i] if replies is not None else None
        if reply is not None and reply.tool_calls:
            lp = chat_logprobs(toks, g.response_logprobs) if logprobs else None
            chunks.extend(_call_chunks(reply, lp, lambda p, lp, i=i: choice(p, lp, None, i)))
            chunks.append(choice(None, None, reply.finish_reason))
            chunks[-1]["choices"][0].update(marti_choice(served, i))
            continue
        if replies is not None and replies.forced:
            chunks.append(choice(replies.forced, None, None))
        for k, piece in enumerate(toks.pieces):
            if piece or logprobs:
                at = slice(k, k + 1)
                lp = None
                if logprobs:
                    lp = (
                        chat_logprobs(toks, g.response_logprobs, at)
                        if chat
                        else text_logprobs(toks, g.response_logprobs, at)
                    )
                chunks.append(choice(piece, lp, None))
        chunks.append(choice(None, None, g.finish_reason))
        chunks[-1]["choices"][0].update(marti_choice(served, i))
    chunks[0] = {**chunks[0], "prompt_token_ids": list(served.generations[0].prompt_token_ids)}
    if body.stream_options is not None and body.stream_options.include_usage:
        chunks.append({**head, "choices": [], "usage": usage(served)})

    async def events() -> AsyncIterator[bytes]:
        for c in chunks:
            yield b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


def _call_chunks(
    reply: ChatReply,
    lp: dict[str, Any] | None,
    choice: Callable[[str | None, dict[str, Any] | None], dict[str, Any]],
) -> list[dict[str, Any]]:
    """The chunks of a reply with tool calls before its final one: its content (when any), then each call's
    deltas; ``lp`` (the whole reply's log-probs, or None) goes on the first of them."""
    out = []
    if reply.content:
        out.append(choice(reply.content, lp))
        lp = None
    for k, call in enumerate(reply.tool_calls):
        for delta in tool_call_deltas(k, call):
            out.append(choice(None, lp))
            out[-1]["choices"][0]["delta"] = {"tool_calls": [delta]}
            lp = None
    return out
