"""OpenAI-compatible HTTP adapter of the inference gateway (FastAPI).

Routes (every one needs ``Authorization: Bearer <token>`` when the app has a token):

* ``GET  /v1/models``: every servable model name (each agent, and ``agent@VERSION`` per resident version).
* ``POST /v1/chat/completions``: chat completions, optionally streamed as server-sent events.
* ``POST /v1/completions``: text completions of a string or of token ids, optionally streamed.
* ``POST /v1/episodes/{episode_id}/reward``: report an episode's rewards (releases it to training).
* ``GET  /v1/gateway/stats``: the gateway's counters.

**Episode context.** A call is recorded for training when it names an episode: with the header
``X-Marti-Episode`` (and optionally ``X-Marti-Group``), or through the same inference routes under
``/episodes/{episode_id}/v1/...`` and ``/episodes/{episode_id}/groups/{group_id}/v1/...``, so unchanged client
code can carry the ids in its ``base_url``. A header and a path that name different episodes are refused.

**Extensions** (like vLLM's ``return_token_ids`` and Agent Lightning): every response has ``prompt_token_ids``
(the prompt as the model saw it, chat template applied), ``policy_version`` (the oldest version among the
choices; they differ only when a weight update lands between two batches of one request), ``call_ids`` (one per
choice, the ids per-call rewards name) and ``agent``; every choice has ``token_ids`` (exactly the generated ids,
eos included when generation stopped on it), ``call_id`` and ``policy_version``. When streaming, the first
chunk carries ``prompt_token_ids`` and each choice's final chunk (the one with ``finish_reason``) carries
``token_ids``, ``call_id`` and ``policy_version``.

**Log-probabilities** are the raw (temperature 1) log-probabilities of the sampled tokens under the policy that
sampled them (see :mod:`marti.inference`); alternatives are not recorded, so ``top_logprobs`` must be 0 or absent
(chat) and ``logprobs`` at most 1 (completions). A token's ``token`` is its own decoded text (special tokens
included) and ``bytes`` the UTF-8 of that text.

**Streaming.** The engine generates whole responses, so a stream starts when the generation is done and then
sends the role, one content delta per generated token, the final chunk with ``finish_reason``, the usage chunk
when ``stream_options.include_usage`` is set, and ``data: [DONE]``. Errors therefore still arrive as plain HTTP
errors before any event is sent.

Parameters the engine does not implement (``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``tools``,
``response_format``, ``user``, ...) are accepted and ignored, as OpenAI clients send them; ``echo`` is refused.

**Lifecycle.** :func:`build_app` does not own the gateway: the caller runs ``await gateway.start()`` on the loop
that serves the app before serving and ``await gateway.close()`` after (the gRPC adapter may share the loop and
the gateway).
"""

from __future__ import annotations

import hmac
import itertools
import json
import math
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import (
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
)
from starlette.types import ASGIApp, Receive, Scope, Send

from marti.errors import InvalidArgumentError
from marti.inference import SamplingParams
from services.gateway.core.gateway import Gateway, Served
from services.gateway.http_errors import error_response, install_error_handlers, request_error

__all__ = [
    "DEFAULT_CHAT_MAX_TOKENS",
    "DEFAULT_COMPLETION_MAX_TOKENS",
    "EPISODE_HEADER",
    "GROUP_HEADER",
    "build_app",
]

EPISODE_HEADER = "X-Marti-Episode"
GROUP_HEADER = "X-Marti-Group"
#: Chat ``max_tokens`` when absent: this many, or fewer when the model's context has less room left.
DEFAULT_CHAT_MAX_TOKENS = 512
#: Completions ``max_tokens`` when absent (OpenAI's default).
DEFAULT_COMPLETION_MAX_TOKENS = 16
#: Longest episode or group id, characters.
MAX_ID_CHARS = 256
#: What a log-probability of -inf is reported as (JSON has no infinities; vLLM does the same).
NEG_INF_LOGPROB = -9999.0

_Float = Annotated[float, Strict(), AllowInfNan(False)]
_Seed = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]


# ---------------------------------------------------------------------------------------------- request bodies
class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    """``stream_options``: ``include_usage`` adds a final chunk with the usage and no choices."""

    include_usage: StrictBool | None = False


class _Sampled(_Body):
    model: StrictStr
    temperature: _Float | None = None
    top_p: _Float | None = None
    top_k: StrictInt | None = None
    stop: Any = Field(default=None, validate_default=True)
    n: StrictInt | None = None
    seed: _Seed | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, v: Any) -> tuple[str, ...]:
        if v is None:
            return ()
        if isinstance(v, str):
            return (v,)
        if isinstance(v, list) and all(isinstance(s, str) for s in v):
            return tuple(v)
        raise ValueError("stop must be a string or a list of strings")

    def sampling(self, max_tokens: int, max_tokens_param: str) -> SamplingParams:
        """Sampling parameters; a bad value raises InvalidArgumentError naming the request field."""
        try:
            return SamplingParams(
                max_new_tokens=max_tokens,
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=0 if self.top_k in (None, -1) else self.top_k,  # vLLM's -1 disables top-k, like 0
                stop=self.stop,
                seed=self.seed,
            )
        except InvalidArgumentError as exc:
            names = {"max_new_tokens": max_tokens_param, "temperature": "temperature", "top_p": "top_p"}
            names |= {"top_k": "top_k", "stop": "stop"}
            for field, param in names.items():
                if f"SamplingParams.{field} " in exc.message:
                    raise request_error(exc.message.replace(f"SamplingParams.{field}", param), param) from exc
            raise


class ChatMessage(_Body):
    """One message; ``content`` is a string, null, or a list of ``{"type": "text", "text": ...}`` parts (joined
    with newlines, as vLLM does)."""

    role: StrictStr
    content: Any = Field(default=None, validate_default=True)

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise ValueError("content must be a string or a list of content parts")
        texts = []
        for j, part in enumerate(v):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"content part {j} has type {kind!r}; only {{'type': 'text', 'text': str}} parts are supported"
                )
            texts.append(part["text"])
        return "\n".join(texts)


class ChatCompletionRequest(_Sampled):
    """Body of ``POST /v1/chat/completions`` (OpenAI's fields; see the module docstring for what is ignored)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = None


class CompletionRequest(_Sampled):
    """Body of ``POST /v1/completions``: ``prompt`` is a string or token ids (or a one-element list of either)."""

    prompt: Any
    max_tokens: StrictInt | None = None
    logprobs: StrictInt | None = None
    echo: StrictBool | None = False

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v: Any) -> str | list[int]:
        if isinstance(v, list) and len(v) == 1 and isinstance(v[0], (str, list)):
            v = v[0]  # a batch of one prompt
        if isinstance(v, str):
            return v
        if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            if min(v) < 0:
                raise ValueError(f"token ids must be >= 0, got {min(v)}")
            return v
        if isinstance(v, list) and len(v) > 1 and all(isinstance(p, (str, list)) for p in v):
            raise ValueError(f"a batch of {len(v)} prompts is not supported; send one request per prompt")
        raise ValueError("prompt must be a string or a non-empty list of token ids")


class RewardRequest(_Body):
    """Body of ``POST /v1/episodes/{episode_id}/reward`` (see :meth:`Gateway.report`)."""

    rewards: dict[StrictStr, _Float] = Field(default_factory=dict)
    call_rewards: dict[StrictStr, _Float] | None = None
    group_id: StrictStr | None = ""
    group_size: StrictInt | None = 0
    failed: StrictBool | None = False


# ---------------------------------------------------------------------------------------------- helpers
class _BearerAuth:
    """ASGI middleware: 401 unless ``Authorization: Bearer <token>`` matches (constant-time comparison)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raw = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, given = raw.partition(b" ")
            ok = scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)
            if not ok:
                msg = "missing or wrong API key: send 'Authorization: Bearer <token>' (the client's api_key)"
                await error_response(401, msg, "authentication_error", None, "unauthenticated")(
                    scope, receive, send
                )
                return
        await self.app(scope, receive, send)


def _context(request: Request) -> tuple[str, str]:
    """(episode id, group id) of a call, from the path prefix or the headers; empty = untraced."""
    out = []
    for key, header in (("episode_id", EPISODE_HEADER), ("group_id", GROUP_HEADER)):
        path, head = request.path_params.get(key, ""), request.headers.get(header, "")
        if path and head and path != head:
            raise request_error(f"the path names {key} {path!r} but header {header} names {head!r}", key)
        value = path or head
        if len(value) > MAX_ID_CHARS:
            raise request_error(f"{key} has {len(value)} characters, the limit is {MAX_ID_CHARS}", key)
        out.append(value)
    return out[0], out[1]


def _finite(x: float) -> float:
    return float(x) if math.isfinite(x) else NEG_INF_LOGPROB


def _token_texts(gateway: Gateway, agent: str, ids: Sequence[int]) -> list[str]:
    """Each token's own text (the backend's :meth:`~services.gateway.core.backend.InferenceBackend.token_texts`)."""
    return list(gateway.backend.token_texts(agent, list(ids)))


def _pieces(text: str, token_texts: Sequence[str]) -> list[str]:
    """Split ``text`` into one piece per token whose concatenation is ``text`` exactly: tokens whose text
    continues it get their text; from the first that does not (a stop string cut, a partial UTF-8 character),
    that token gets the rest and later tokens get ``""``."""
    pieces, pos = [], 0
    for t in token_texts:
        if t and text.startswith(t, pos):
            pieces.append(t)
            pos += len(t)
        else:
            pieces.append(text[pos:])
            pos = len(text)
    if pos < len(text):
        if pieces:
            pieces[-1] += text[pos:]
        else:
            pieces.append(text[pos:])
    return pieces


def _usage(served: Served) -> dict[str, int]:
    prompt = len(served.generations[0].prompt_token_ids)
    completion = sum(len(g.response_token_ids) for g in served.generations)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _marti_choice(served: Served, i: int) -> dict[str, Any]:
    g = served.generations[i]
    return {
        "token_ids": list(g.response_token_ids),
        "call_id": served.call_ids[i],
        "policy_version": g.policy_version,
    }


def _marti_response(served: Served) -> dict[str, Any]:
    return {
        "prompt_token_ids": list(served.generations[0].prompt_token_ids),
        "policy_version": min(g.policy_version for g in served.generations),
        "call_ids": list(served.call_ids),
        "agent": served.agent,
    }


def _chat_logprobs(toks: Sequence[str], logps: Sequence[float]) -> dict[str, Any]:
    """Chat ``logprobs``: one entry per token with its text, log-prob and UTF-8 bytes."""
    return {
        "content": [
            {"token": t, "logprob": _finite(x), "bytes": list(t.encode()), "top_logprobs": []}
            for t, x in zip(toks, logps, strict=True)
        ]
    }


def _text_logprobs(toks: Sequence[str], logps: Sequence[float], offsets: Sequence[int]) -> dict[str, Any]:
    """Completions ``logprobs``: the tokens' texts, log-probs and character offsets into the text."""
    lps = [_finite(x) for x in logps]
    return {
        "tokens": list(toks),
        "token_logprobs": lps,
        "top_logprobs": None,
        "text_offset": list(offsets)[: len(lps)],
    }


def _offsets(pieces: Sequence[str]) -> list[int]:
    return list(itertools.accumulate((len(p) for p in pieces), initial=0))[: len(pieces)]


def _stream(
    gateway: Gateway, served: Served, head: dict[str, Any], body: _Sampled, logprobs: bool
) -> StreamingResponse:
    """The server-sent events of a served request: per choice, (chat: the role,) one chunk per generated token
    whose text is not empty (every token when ``logprobs``), the final chunk with ``finish_reason`` and the
    choice's extensions; the first chunk has ``prompt_token_ids``; then the usage chunk when asked, ``[DONE]``."""
    chat = head["object"] == "chat.completion.chunk"
    chunks: list[dict[str, Any]] = []
    for i, g in enumerate(served.generations):

        def choice(
            piece: str | None, lp: dict[str, Any] | None, finish: str | None, i: int = i
        ) -> dict[str, Any]:
            text = {"delta": {} if piece is None else {"content": piece}} if chat else {"text": piece or ""}
            return {**head, "choices": [{"index": i, **text, "logprobs": lp, "finish_reason": finish}]}

        if chat:
            chunks.append(choice("", None, None))
            chunks[-1]["choices"][0]["delta"]["role"] = "assistant"
        toks = _token_texts(gateway, served.agent, g.response_token_ids)
        pieces = _pieces(g.text, toks)
        for t, x, piece, off in zip(toks, g.response_logprobs, pieces, _offsets(pieces), strict=False):
            if piece or logprobs:
                lp = (
                    (_chat_logprobs([t], [x]) if chat else _text_logprobs([t], [x], [off]))
                    if logprobs
                    else None
                )
                chunks.append(choice(piece, lp, None))
        chunks.append(choice(None, None, g.finish_reason))
        chunks[-1]["choices"][0].update(_marti_choice(served, i))
    chunks[0] = {**chunks[0], "prompt_token_ids": list(served.generations[0].prompt_token_ids)}
    if body.stream_options is not None and body.stream_options.include_usage:
        chunks.append({**head, "choices": [], "usage": _usage(served)})

    def events() -> Iterator[bytes]:
        for c in chunks:
            yield b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)


async def _serve(
    gateway: Gateway,
    request: Request,
    body: _Sampled,
    prompt: Any,
    max_tokens: int | None,
    param: str,
    default: int,
) -> Served:
    """Resolve, tokenize, size ``max_tokens`` and generate (shared by both completion routes)."""
    episode_id, group_id = _context(request)
    agent, _ = gateway.resolve(body.model)
    try:
        ids = gateway.prompt_ids(agent, prompt)
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
                "messages"
                if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict)
                else "prompt",
            )
        max_tokens = min(default, room)
    sampling = body.sampling(max_tokens, param)
    n = 1 if body.n is None else body.n
    return await gateway.generate(body.model, ids, sampling, n=n, episode_id=episode_id, group_id=group_id)


# ---------------------------------------------------------------------------------------------- the app
def build_app(gateway: Gateway, token: str | None = None) -> FastAPI:
    """Build the OpenAI-compatible HTTP app over ``gateway`` (routes and fields: the module docstring).

    Args:
        gateway: The gateway; the app does not start or close it (see the module docstring).
        token: When set, every route requires ``Authorization: Bearer <token>``; None = no authentication.

    Raises:
        InvalidArgumentError: ``token`` is an empty string (use None for no authentication).
    """
    if token is not None and not token:
        raise InvalidArgumentError("token must be a non-empty string, or None for no authentication")
    app = FastAPI(title="marti inference gateway", docs_url=None, redoc_url=None)
    install_error_handlers(app)
    if token is not None:
        app.add_middleware(_BearerAuth, token=token)
    created = int(time.time())
    api = APIRouter()

    @api.get("/v1/models")
    async def list_models() -> JSONResponse:
        """Every servable model name with its agent and policy version."""
        data = [
            {"id": m.id, "object": "model", "created": created, "owned_by": "marti", "agent": m.agent,
             "policy_version": m.version}
            for m in gateway.models()
        ]  # fmt: skip
        return JSONResponse({"object": "list", "data": data})

    @api.post("/v1/chat/completions", response_model=None)
    async def chat_completions(
        body: ChatCompletionRequest, request: Request
    ) -> JSONResponse | StreamingResponse:
        """One chat completion request (``n`` choices), traced when it names an episode."""
        if body.top_logprobs:
            raise request_error(
                f"top_logprobs must be 0 or absent, got {body.top_logprobs}: the engine records only the sampled "
                "token's log-probability",
                "top_logprobs",
            )
        param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        messages = [{"role": m.role, "content": m.content} for m in body.messages]
        served = await _serve(gateway, request, body, messages, max_tokens, param, DEFAULT_CHAT_MAX_TOKENS)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model}
        if body.stream:
            return _stream(
                gateway, served, {**head, "object": "chat.completion.chunk"}, body, bool(body.logprobs)
            )
        choices = []
        for i, g in enumerate(served.generations):
            lp = (
                _chat_logprobs(_token_texts(gateway, served.agent, g.response_token_ids), g.response_logprobs)
                if body.logprobs
                else None
            )
            message = {"role": "assistant", "content": g.text}
            choices.append({"index": i, "message": message, "finish_reason": g.finish_reason, "logprobs": lp})
            choices[-1].update(_marti_choice(served, i))
        out = {**head, "object": "chat.completion", "choices": choices, "usage": _usage(served)}
        return JSONResponse({**out, "system_fingerprint": None, **_marti_response(served)})

    @api.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> JSONResponse | StreamingResponse:
        """One text completion request (``n`` choices), traced when it names an episode."""
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
            return _stream(gateway, served, head, body, want)
        choices = []
        for i, g in enumerate(served.generations):
            lp = None
            if want:
                toks = _token_texts(gateway, served.agent, g.response_token_ids)
                lp = _text_logprobs(toks, g.response_logprobs, _offsets(_pieces(g.text, toks)))
            choices.append({"index": i, "text": g.text, "logprobs": lp, "finish_reason": g.finish_reason})
            choices[-1].update(_marti_choice(served, i))
        return JSONResponse({**head, "choices": choices, "usage": _usage(served), **_marti_response(served)})

    @app.post("/v1/episodes/{episode_id}/reward")
    async def report_reward(episode_id: str, body: RewardRequest) -> JSONResponse:
        """End an episode with its rewards (or as failed); returns how many episodes were released and dropped."""
        released = await gateway.report(
            episode_id,
            dict(body.rewards),
            call_rewards=dict(body.call_rewards) if body.call_rewards else None,
            group_id=body.group_id or "",
            group_size=body.group_size or 0,
            failed=bool(body.failed),
        )
        out = {"episode_id": episode_id, "released": len(released.episodes), "dropped": released.dropped}
        return JSONResponse(out)

    @app.get("/v1/gateway/stats")
    async def stats() -> JSONResponse:
        """The gateway's counters (:meth:`Gateway.stats`)."""
        return JSONResponse(gateway.stats())

    app.include_router(api)
    app.include_router(api, prefix="/episodes/{episode_id}", include_in_schema=False)
    app.include_router(api, prefix="/episodes/{episode_id}/groups/{group_id}", include_in_schema=False)
    return app
