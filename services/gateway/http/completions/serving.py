"""The handlers of the Chat Completions and Completions routes (vLLM's ``serving_chat`` and
``serving_completion``): resolve the model, tokenize, size ``max_tokens``, generate through the
:class:`~services.gateway.core.gateway.Gateway` (a client that disconnects cancels its call) and shape the
answer."""

from __future__ import annotations

import asyncio
import time
import uuid

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from services.gateway.core.gateway import Gateway
from services.gateway.http.common.chat_service import serve_chat
from services.gateway.http.common.errors import request_error
from services.gateway.http.common.generate import Sizing, serve_prompt
from services.gateway.http.common.protocol import marti_choice, marti_response
from services.gateway.http.common.tokens import all_tokens, chat_logprobs, text_logprobs
from services.gateway.http.completions.chat_tools import assistant_message, chat_call
from services.gateway.http.completions.protocol import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    usage,
)
from services.gateway.http.completions.sse import stream_response


async def chat_completion(
    gateway: Gateway, body: ChatCompletionRequest, request: Request
) -> JSONResponse | StreamingResponse:
    """Answer one chat completion request (``n`` choices), traced when it names an episode.

    Raises:
        InvalidArgumentError: A field the engine cannot honour (``top_logprobs``), or a bad request (naming it).
    """
    if body.top_logprobs:
        raise request_error(
            f"top_logprobs must be 0 or absent, got {body.top_logprobs}: the engine records only the sampled "
            "token's log-probability",
            "top_logprobs",
        )
    chat = await serve_chat(gateway, request, chat_call(body))
    served = chat.served
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model}
    if body.stream:
        tokens = await all_tokens(gateway, served)
        head["object"] = "chat.completion.chunk"
        return stream_response(served, tokens, head, body, bool(body.logprobs), chat)
    tokens = await all_tokens(gateway, served) if body.logprobs else None
    choices = []
    for i, (g, reply) in enumerate(zip(served.generations, chat.replies, strict=True)):
        lp = chat_logprobs(tokens[i], g.response_logprobs) if tokens is not None else None
        message = assistant_message(reply)
        choices.append({"index": i, "message": message, "finish_reason": reply.finish_reason, "logprobs": lp})
        choices[-1].update(marti_choice(served, i))
    out = {**head, "object": "chat.completion", "choices": choices, "usage": usage(served)}
    return JSONResponse({**out, "system_fingerprint": None, **marti_response(served)})


async def completion(
    gateway: Gateway, body: CompletionRequest, request: Request
) -> JSONResponse | StreamingResponse:
    """Answer one text completion request (``n`` choices), traced when it names an episode.

    Raises:
        InvalidArgumentError: ``logprobs`` above 1, ``echo``, or a bad request (naming the field).
    """
    if body.logprobs is not None and not 0 <= body.logprobs <= 1:
        raise request_error(
            f"logprobs must be 0 or 1, got {body.logprobs}: the engine records only the sampled token's "
            "log-probability",
            "logprobs",
        )
    if body.echo:
        raise request_error("echo is not supported", "echo")
    prompt = body.prompt

    async def render(agent: str, episode_id: str) -> list[int]:  # tokenizing a long prompt takes a while
        return await asyncio.to_thread(gateway.prompt_ids, agent, prompt)

    size = Sizing(body.max_tokens, "max_tokens", DEFAULT_COMPLETION_MAX_TOKENS, "prompt")
    served = await serve_prompt(gateway, request, body, render, size)
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time())}
    head["model"] = body.model
    want = body.logprobs is not None
    if body.stream:
        return stream_response(served, await all_tokens(gateway, served), head, body, want)
    tokens = await all_tokens(gateway, served) if want else None
    choices = []
    for i, g in enumerate(served.generations):
        lp = text_logprobs(tokens[i], g.response_logprobs) if tokens is not None else None
        choices.append({"index": i, "text": g.text, "logprobs": lp, "finish_reason": g.finish_reason})
        choices[-1].update(marti_choice(served, i))
    return JSONResponse({**head, "choices": choices, "usage": usage(served), **marti_response(served)})
