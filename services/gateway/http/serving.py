"""The handlers of the gateway's HTTP routes (vLLM's ``serving_*``): resolve the model, tokenize, size
``max_tokens``, generate through the :class:`~services.gateway.core.gateway.Gateway` (a client that disconnects
cancels its call) and shape the answer; report an episode's rewards."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from marti.errors import InvalidArgumentError
from services.gateway.core.gateway import Gateway
from services.gateway.http.chat_service import serve_chat
from services.gateway.http.chat_tools import assistant_message, chat_call
from services.gateway.http.context import check_path
from services.gateway.http.errors import request_error
from services.gateway.http.generate import Sizing, serve_prompt
from services.gateway.http.protocol import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    RewardRequest,
    marti_choice,
    marti_response,
    usage,
)
from services.gateway.http.sse import stream_response
from services.gateway.http.tokens import all_tokens, chat_logprobs, text_logprobs


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


async def report(gateway: Gateway, request: Request, episode_id: str, body: RewardRequest) -> JSONResponse:
    """Report one episode (both reward routes): 200 ``{"episode_id", "released", "dropped"}``, 202 with
    ``"queued"`` when released episodes were not inserted within ``gateway.report_wait_s``; ``"stale"`` (see
    :class:`~marti.inference.StaleCalls`) when calls of the released episodes are already past
    their agent's staleness bound."""
    check_path(request)
    try:
        released = await gateway.report(
            episode_id,
            dict(body.rewards),
            call_rewards=dict(body.call_rewards) if body.call_rewards else None,
            group_id=body.group_id or "",
            group_size=body.group_size or 0,
            failed=bool(body.failed),
        )
    except InvalidArgumentError as exc:
        if getattr(exc, "param", None) is None and exc.message.startswith(("episode_id ", "group_id ")):
            exc.param = exc.message.split(" ", 1)[0]  # type: ignore[attr-defined]
        raise
    out: dict[str, Any] = {"episode_id": episode_id, "released": len(released.episodes)}
    out["dropped"] = released.dropped
    if released.stale:
        out["stale"] = [dataclasses.asdict(s) for s in released.stale]
    if released.queued:  # accepted, inserted in the background: 202 with the count (a 200 body has none)
        return JSONResponse({**out, "queued": released.queued}, status_code=202)
    return JSONResponse(out)


async def report_under_prefix(
    gateway: Gateway, request: Request, prefix_episode: str, episode_id: str, body: RewardRequest
) -> JSONResponse:
    """The reward route under a traced ``base_url``: the prefix's episode must be ``episode_id``; its group (when
    the prefix has one) is the report's ``group_id``.

    Raises:
        InvalidArgumentError: The prefix and the report name different episodes, or different groups.
    """
    group = request.path_params.get("prefix_group", "")
    if prefix_episode != episode_id:
        raise request_error(
            f"the base URL names episode {prefix_episode!r} but the report is for episode {episode_id!r}; "
            "post a report under its own episode's prefix, or to /v1/episodes/{episode_id}/reward",
            "episode_id",
        )
    if group and body.group_id and body.group_id != group:
        raise request_error(
            f"the base URL names group {group!r} but the body names group_id {body.group_id!r}",
            "group_id",
        )
    if group:
        body = body.model_copy(update={"group_id": group})
    return await report(gateway, request, episode_id, body)
