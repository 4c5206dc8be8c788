"""The server-sent events of a streamed answer (see :mod:`services.gateway.http`, "Streaming"): the engine
generates whole responses, so the events are built from the finished generation and sent at once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi.responses import StreamingResponse

from services.gateway.core.gateway import Served
from services.gateway.http.protocol import SampledRequest, marti_choice, usage
from services.gateway.http.tokens import Tokens, chat_logprobs, text_logprobs


def stream_response(
    served: Served, tokens: Sequence[Tokens], head: dict[str, Any], body: SampledRequest, logprobs: bool
) -> StreamingResponse:
    """The server-sent events of a served request: per choice, (chat: the role,) one chunk per generated token
    whose piece is not empty (every token when ``logprobs``), the final chunk with ``finish_reason`` and the
    choice's extensions; the first chunk has ``prompt_token_ids``; then the usage chunk when asked, ``[DONE]``."""
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
