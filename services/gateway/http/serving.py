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

from marti.errors import CancelledError, InvalidArgumentError
from services.gateway.convert import chat_role
from services.gateway.core.gateway import Gateway, Served
from services.gateway.http.context import IDEMPOTENCY_HEADER, check_path, episode_context, read_header
from services.gateway.http.errors import request_error
from services.gateway.http.protocol import (
    DEFAULT_CHAT_MAX_TOKENS,
    DEFAULT_COMPLETION_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    RewardRequest,
    SampledRequest,
    marti_choice,
    marti_response,
    usage,
)
from services.gateway.http.sse import stream_response
from services.gateway.http.tokens import all_tokens, chat_logprobs, text_logprobs


def _core_param(message: str, prompt_param: str, max_tokens_param: str) -> str | None:
    """The request field an InvalidArgumentError of the gateway core is about, read from its message (the core
    does not know the OpenAI field names); None when the message does not say reliably."""
    if message.startswith(("n must", "n is ")):
        return "n"
    # the prompt plus max_tokens exceed the context: max_tokens is the knob (a prompt alone that fills the
    # context is refused by the adapter itself, naming the prompt)
    if " and max_tokens is " in message:
        return max_tokens_param
    if message.startswith(("the prompt", "prompt token")):
        return prompt_param
    if "(gateway.max_stop" in message:  # max_stop and max_stop_chars
        return "stop"
    for key in ("episode_id", "group_id", "idempotency_key"):
        if message.startswith(f"{key} "):
            return key
    return None


def _name_param(exc: InvalidArgumentError, prompt_param: str, max_tokens_param: str) -> None:
    """Set ``exc.param`` (the OpenAI field) on a core error that has none, when its message names one."""
    if getattr(exc, "param", None) is None:
        exc.param = _core_param(exc.message, prompt_param, max_tokens_param)  # type: ignore[attr-defined]


async def _serve(
    gateway: Gateway,
    request: Request,
    body: SampledRequest,
    prompt: Any,
    max_tokens: int | None,
    param: str,
    default: int,
) -> Served:
    """Resolve, tokenize, size ``max_tokens`` and generate (shared by both completion routes); an
    InvalidArgumentError of the core gets ``param`` when its message names the field."""
    prompt_param = (
        "messages" if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) else "prompt"
    )
    try:
        episode_id, group_id = episode_context(request)
        agent, _ = gateway.resolve(body.model)
        try:  # tokenizing a long prompt takes a while: not on the event loop
            ids = await asyncio.to_thread(gateway.prompt_ids, agent, prompt)
        except Exception as exc:  # a chat template that refuses the conversation (jinja2's raise_exception)
            if type(exc).__module__.startswith("jinja2"):
                raise request_error(
                    f"the chat template of {agent!r} refused the messages: {exc}", "messages"
                ) from exc
            raise
        if max_tokens is None:
            room = gateway.backend.max_model_len(agent) - len(ids)
            if room <= 0:
                raise request_error(
                    f"the prompt has {len(ids)} tokens, which fills model {agent!r}'s context of "
                    f"{gateway.backend.max_model_len(agent)} tokens",
                    prompt_param,
                )
            max_tokens = min(default, room)
        sampling = body.sampling(max_tokens, param)
        n = 1 if body.n is None else body.n
        watcher = asyncio.ensure_future(_disconnect(request))

        async def gone() -> bool:
            return watcher.done() and not watcher.cancelled()

        work = asyncio.ensure_future(
            gateway.generate(
                body.model,
                ids,
                sampling,
                n=n,
                episode_id=episode_id,
                group_id=group_id,
                idempotency_key=read_header(request, IDEMPOTENCY_HEADER),
                disconnected=gone,
            )
        )
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # the client went away, or this handler was cancelled (shutdown): the call is cancelled too
            watcher.cancel()
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
        if work.cancelled():
            raise CancelledError("the client disconnected before its answer was ready")
        return work.result()
    except InvalidArgumentError as exc:
        _name_param(exc, prompt_param, param)
        raise


async def _disconnect(request: Request) -> None:
    """Return once the client of ``request`` disconnects (its body was read already, so the next ASGI message
    is ``http.disconnect``)."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # noqa: BLE001 - a transport that fails to receive has lost its client too
        return


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
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    messages = [
        {"role": chat_role(m.role, f"messages[{i}].role"), "content": m.content}
        for i, m in enumerate(body.messages)
    ]
    served = await _serve(gateway, request, body, messages, max_tokens, param, DEFAULT_CHAT_MAX_TOKENS)
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model}
    if body.stream:
        tokens = await all_tokens(gateway, served)
        head["object"] = "chat.completion.chunk"
        return stream_response(served, tokens, head, body, bool(body.logprobs))
    tokens = await all_tokens(gateway, served) if body.logprobs else None
    choices = []
    for i, g in enumerate(served.generations):
        lp = chat_logprobs(tokens[i], g.response_logprobs) if tokens is not None else None
        message = {"role": "assistant", "content": g.text}
        choices.append({"index": i, "message": message, "finish_reason": g.finish_reason, "logprobs": lp})
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
    served = await _serve(
        gateway, request, body, body.prompt, body.max_tokens, "max_tokens", DEFAULT_COMPLETION_MAX_TOKENS
    )
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
