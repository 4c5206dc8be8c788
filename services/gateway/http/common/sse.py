"""Named server-sent events, as the Responses and Anthropic Messages APIs stream their answers (chat completions
and completions stream OpenAI's unnamed chunks: :mod:`services.gateway.http.completions.sse`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi.responses import StreamingResponse


def event_stream(events: Sequence[tuple[str, dict[str, Any]]]) -> StreamingResponse:
    """Named server-sent events, ``event: NAME`` and ``data: JSON`` per ``(NAME, data)`` pair, as the Responses
    and Anthropic Messages APIs send them (no ``[DONE]``: their last event says the answer is complete)."""

    async def body() -> AsyncIterator[bytes]:
        for name, data in events:
            yield f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)
