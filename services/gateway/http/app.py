"""OpenAI-compatible HTTP adapter of the inference gateway (FastAPI).

Routes (every one needs ``Authorization: Bearer <token>`` when the app has a token):

* ``GET  /v1/models``: every servable model name (each agent, and ``agent@VERSION`` per resident version).
* ``GET  /v1/models/{model}``: one of them (404 with the OpenAI error JSON for any other name).
* ``POST /v1/chat/completions``: chat completions, optionally streamed as server-sent events.
* ``POST /v1/completions``: text completions of a string or of token ids, optionally streamed.
* ``POST /v1/episodes/{episode_id}/reward``: report an episode's rewards (releases it to training); 202 with
  ``"queued": N`` when its released episodes were not inserted within ``gateway.report_wait_s``, 429 while
  ``gateway.max_backlog_episodes`` wait.
* ``GET  /v1/gateway/stats``: the gateway's counters.

**Episode context.** A call is recorded for training when it names an episode: with the header
``X-Marti-Episode`` (and optionally ``X-Marti-Group``), or through the same inference routes under
``/episodes/{episode_id}/v1/...`` and ``/episodes/{episode_id}/groups/{group_id}/v1/...``, so unchanged client
code can carry the ids in its ``base_url``. A header and a path that name different episodes are refused. Header
values (``X-Marti-Episode``, ``X-Marti-Group``, ``Idempotency-Key``) must be printable ASCII, and path ids valid
UTF-8 once percent-decoded; anything else is refused with 400 naming the header or the path parameter, so no id
is ever garbled (Latin-1) or merged with another (U+FFFD).

**Retries are recorded once.** A traced call whose client disconnected (or timed out) before the answer was ready
is not recorded, so the client's retry is the one that trains. A disconnect cancels the call as a gRPC cancel
does: still queued, it is dropped before it reaches the engine (unless it has an idempotency key: a retry may
wait for it); already running, it runs to the end and its answer is discarded. A call may also carry an ``Idempotency-Key`` header
(``extra_headers`` in the openai client): a retry with the same key within the same open episode gets the first
call's answer (same ``call_ids``) without generating or recording again (see :meth:`Gateway.generate`).

**Extensions** (like vLLM's ``return_token_ids`` and Agent Lightning): every response has ``prompt_token_ids``
(the prompt as the model saw it, chat template applied), ``policy_version`` (the oldest version among the
choices; they differ only when a weight update lands between two batches of one request), ``call_ids`` (one per
choice, the ids per-call rewards name) and ``agent``; every choice has ``token_ids`` (exactly the generated ids,
eos included when generation stopped on it), ``call_id`` and ``policy_version``. When streaming, the first
chunk carries ``prompt_token_ids`` and each choice's final chunk (the one with ``finish_reason``) carries
``token_ids``, ``call_id`` and ``policy_version``.

**Log-probabilities** are the raw (temperature 1) log-probabilities of the sampled tokens under the policy that
sampled them (see :mod:`marti.inference`); alternatives are not recorded, so ``top_logprobs`` must be 0 or absent
(chat: each token's ``top_logprobs`` is ``[]``) and ``logprobs`` 0 or 1 (completions: each position's
``top_logprobs`` entry is ``{token: logprob}`` of the sampled token alone, as vLLM always includes the sampled
token). A token's ``token`` (completions: its entry of ``tokens``) is its
own decoded text, special tokens included; a token that holds only part of a multi-byte character (byte-level
tokenizers split emoji and CJK characters) decodes to U+FFFD there. Its ``bytes`` are the token's exact bytes
when the backend keeps the agent's Hugging Face tokenizer in a ``tokenizers`` mapping (both backends of
:mod:`services.trainer.gateway_backend` do) and that tokenizer is byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM);
otherwise the UTF-8 of its text, or, for a token that is part of a character, of the text it completes (see the
stream's pieces below), so that the bytes of a completion's tokens still join to its text. ``text_offset`` is where
each token's piece starts in ``text``.

**Streaming.** The engine generates whole responses, so a stream starts when the generation is done and then
sends the role, the content deltas, the final chunk with ``finish_reason``, the usage chunk when
``stream_options.include_usage`` is set, and ``data: [DONE]``. Each generated token's delta is the text it adds
under incremental detokenization (:func:`services.gateway.convert.token_texts`, as the gRPC stream): a character
split over tokens arrives whole with its last token, and the deltas join to the completion's text exactly. Tokens
that add no text send no delta, unless log-probabilities were asked for (then every token has its chunk). Errors
still arrive as plain HTTP errors before any event is sent.

**Limits.** A request body larger than ``gateway.max_request_bytes`` is refused with 413 (by its
``Content-Length``, or once that many bytes arrived). Episode and group ids longer than ``gateway.max_id_chars``
characters, or containing ``/`` (the gateway's rule), are refused with 400, on the inference routes and the reward
route alike. Strings of the request (messages, prompt, stop strings, ids, the model) must be encodable as UTF-8: a
lone surrogate escape such as ``"\\ud800"`` is refused with 400 naming the field.

Parameters the engine does not implement (``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``tools``,
``user``, ...) are accepted and ignored, as OpenAI clients send them; ``echo`` is refused, and so is a
``response_format`` other than ``{"type": "text"}`` (structured output: the engine cannot constrain its sampling to
a JSON schema, and an answer that silently ignored it would look like a model error). The reward report's body
refuses unknown keys (a typo such as ``reward`` or ``groupsize`` would otherwise train with reward 0 or as a group
of one), naming them.

**Where things are.** The reward route is also served under the episode prefixes
(``/episodes/{episode_id}[/groups/{group_id}]/v1/episodes/{episode_id}/reward``, what a client whose ``base_url``
carries the ids naturally posts to): the two episode ids must be the same, and the prefix's group is the report's
``group_id`` unless the body gives the same one. An unknown route gets a 404 whose message lists the routes that
exist (``/v1/responses``: the Responses API is not served, use ``/v1/chat/completions``).

**Lifecycle.** :func:`build_app` does not own the gateway: the caller runs ``await gateway.start()`` on the loop
that serves the app before serving and ``await gateway.close()`` after (the gRPC adapter may share the loop and
the gateway).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import itertools
import json
import math
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import unquote_to_bytes

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import (
    AfterValidator,
    AllowInfNan,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from marti.errors import CancelledError, InvalidArgumentError, NotFoundError
from marti.inference import Generation, SamplingParams
from services.gateway.convert import CHAT_ROLES, chat_role, token_texts
from services.gateway.core.backend import InferenceBackend
from services.gateway.core.gateway import Gateway, ModelCard, Served
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
#: A client's key of one call within its episode: a retry with the same key gets the first answer, recorded once.
IDEMPOTENCY_HEADER = "Idempotency-Key"
#: Chat ``max_tokens`` when absent: this many, or fewer when the model's context has less room left.
DEFAULT_CHAT_MAX_TOKENS = 512
#: Completions ``max_tokens`` when absent (OpenAI's default).
DEFAULT_COMPLETION_MAX_TOKENS = 16
#: What a log-probability of -inf is reported as (JSON has no infinities; vLLM does the same).
NEG_INF_LOGPROB = -9999.0

_Float = Annotated[float, Strict(), AllowInfNan(False)]
_Seed = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]


def _utf8(v: str) -> str:
    """``v`` unchanged; ValueError when it cannot be encoded as UTF-8 (JSON's lone surrogate escapes)."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"the text is not valid Unicode: character {exc.start} is the lone surrogate {v[exc.start]!r}, "
            "which UTF-8 cannot encode"
        ) from None
    return v


#: A string that is valid Unicode (encodable as UTF-8).
_Str = Annotated[StrictStr, AfterValidator(_utf8)]


# ---------------------------------------------------------------------------------------------- request bodies
class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    """``stream_options``: ``include_usage`` adds a final chunk with the usage and no choices."""

    include_usage: StrictBool | None = False


class _Sampled(_Body):
    model: _Str
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
            return (_utf8(v),)
        if isinstance(v, list) and all(isinstance(s, str) for s in v):
            return tuple(_utf8(s) for s in v)
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
    """One message; ``role`` is one of OpenAI's (:data:`~services.gateway.convert.CHAT_ROLES`; ``developer`` is
    rendered as ``system``); ``content`` is a string or a list of ``{"type": "text", "text": ...}`` parts (joined
    with newlines, as vLLM does), or null (or absent) in an assistant message only (one that made tool calls)."""

    role: _Str
    content: Any = Field(default=None, validate_default=True)

    @field_validator("role")
    @classmethod
    def _role(cls, v: str) -> str:
        if v not in CHAT_ROLES:
            raise ValueError(f"a chat message's role must be one of {list(CHAT_ROLES)}")
        return v

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, v: Any, info: ValidationInfo) -> str:
        if v is None:
            role = info.data.get("role")
            if role is not None and role != "assistant":  # None: the role was refused already
                raise ValueError(
                    f"content is required in a {role!r} message (only an assistant's may be null)"
                )
            return ""
        if isinstance(v, str):
            return _utf8(v)
        if not isinstance(v, list):
            raise ValueError("content must be a string or a list of content parts")
        texts = []
        for j, part in enumerate(v):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ValueError(
                    f"content part {j} has type {kind!r}; only {{'type': 'text', 'text': str}} parts are supported"
                )
            texts.append(_utf8(part["text"]))
        return "\n".join(texts)


class ChatCompletionRequest(_Sampled):
    """Body of ``POST /v1/chat/completions`` (OpenAI's fields; see the module docstring for what is ignored)."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool | None = False
    top_logprobs: StrictInt | None = None
    response_format: Any = Field(default=None, validate_default=True)

    @field_validator("response_format", mode="before")
    @classmethod
    def _response_format(cls, v: Any) -> None:
        """Only plain text (absent, null or ``{"type": "text"}``): the engine cannot constrain its output."""
        if v is None or v == {"type": "text"}:
            return None
        kind = v.get("type") if isinstance(v, dict) else None
        raise ValueError(
            f"response_format type {kind!r} is not supported: this gateway samples plain text and cannot "
            "constrain the output to JSON or a schema; leave response_format out (or {'type': 'text'}) and "
            "parse or validate the text yourself"
        )


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
            return _utf8(v)
        if isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
            if min(v) < 0:
                raise ValueError(f"token ids must be >= 0, got {min(v)}")
            return v
        if isinstance(v, list) and len(v) > 1 and all(isinstance(p, (str, list)) for p in v):
            raise ValueError(f"a batch of {len(v)} prompts is not supported; send one request per prompt")
        raise ValueError("prompt must be a string or a non-empty list of token ids")


class RewardRequest(_Body):
    """Body of ``POST /v1/episodes/{episode_id}/reward`` (see :meth:`Gateway.report`); unknown keys are refused
    (400 naming them), so a typo never trains as reward 0 or as a group of one."""

    model_config = ConfigDict(extra="forbid")

    rewards: dict[_Str, _Float] = Field(default_factory=dict)
    call_rewards: dict[_Str, _Float] | None = None
    group_id: _Str | None = ""
    group_size: StrictInt | None = 0
    failed: StrictBool | None = False


#: Request fields an error message may name (``param``; see :func:`~services.gateway.http_errors.named_param`):
#: body fields, path ids and the episode headers; ``n`` and ``failed`` are left out, as words of ordinary text.
_FIELDS = tuple(
    name
    for name in dict.fromkeys(
        [
            *(n for m in (ChatCompletionRequest, CompletionRequest, RewardRequest) for n in m.model_fields),
            *("episode_id", "group_id", "idempotency_key", EPISODE_HEADER, GROUP_HEADER, IDEMPOTENCY_HEADER),
        ]
    )
    if name not in ("n", "failed")
)


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


class _BodyLimit:
    """ASGI middleware: 413 for a request body over ``max_bytes`` (by ``Content-Length``, or by counting what
    arrives), before the app parses it; a body within the limit is read here and handed on whole."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _refuse(self, size: str) -> Any:
        msg = (
            f"the request body has {size} bytes, more than the limit of {self.max_bytes} bytes "
            "(gateway.max_request_bytes)"
        )
        return error_response(413, msg, "invalid_request_error", None, "resource_exhausted")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.strip().isdigit() and int(length) > self.max_bytes:
            await self._refuse(str(int(length)))(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(f"at least {size}")(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            nonlocal body
            if body is not None:
                message, body = body, None
                return message
            return await receive()

        await self.app(scope, replay, send)


def _header(request: Request, name: str) -> str:
    """The value of header ``name`` (``""`` when absent).

    Raises:
        InvalidArgumentError: The header is present but empty, or its value is not printable ASCII (bytes 0x20-0x7E): HTTP gives other bytes no
            character set (Starlette would read them as Latin-1), so an id sent that way is refused rather than
            garbled; non-ASCII ids go in the path, percent-encoded UTF-8.
    """
    value = request.headers.get(name)  # Latin-1: one character per byte
    if value is None:
        return ""
    if not value:  # sent but empty: never read as "no id" (an untraced call would silently train nothing)
        raise request_error(
            f"header {name} is empty; send an id, or leave the header out (a call without {EPISODE_HEADER} is "
            "served but not recorded for training)",
            name,
        )
    if not (value.isascii() and value.isprintable()):
        bad = next(c for c in value if not (c.isascii() and c.isprintable()))
        raise request_error(
            f"header {name} holds byte 0x{ord(bad):02x}; its value must be printable ASCII (0x20-0x7E): send "
            "ids with other characters in the path (/episodes/{episode_id}/..., percent-encoded UTF-8)",
            name,
        )
    return value


def _check_path(request: Request) -> None:
    """Raise InvalidArgumentError (naming the path parameter) when a segment of the request's path is not valid
    UTF-8 once percent-decoded: the server would decode it with U+FFFD replacements, so two different ids
    would become one."""
    raw = request.scope.get("raw_path")
    if not isinstance(raw, bytes):
        return
    for segment in raw.split(b"/"):
        data = unquote_to_bytes(segment)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            text = data.decode("utf-8", "replace")
            param = next((k for k, v in request.path_params.items() if v == text), None)
            raise request_error(
                f"{param or 'the path'} is not valid UTF-8 once percent-decoded (byte {exc.start} is "
                f"0x{data[exc.start]:02x}); ids in the path must be percent-encoded UTF-8",
                param,
            ) from None


def _context(request: Request) -> tuple[str, str]:
    """(episode id, group id) of a call, from the path prefix or the headers; empty = untraced. Their length and
    characters are checked by the gateway core (its error names the field); the path must be valid UTF-8 and the
    headers printable ASCII (:func:`_check_path`, :func:`_header`)."""
    _check_path(request)
    out = []
    for key, header in (("episode_id", EPISODE_HEADER), ("group_id", GROUP_HEADER)):
        path, head = request.path_params.get(key, ""), _header(request, header)
        if path and head and path != head:
            raise request_error(f"the path names {key} {path!r} but header {header} names {head!r}", key)
        out.append(path or head)
    return out[0], out[1]


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


def _finite(x: float) -> float:
    return float(x) if math.isfinite(x) else NEG_INF_LOGPROB


#: GPT-2's byte-level BPE alphabet: the printable bytes stand for themselves, the others for 256 + i.
_PRINTABLE = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
_BYTE_OF_CHAR: dict[str, int] = {chr(b): b for b in _PRINTABLE} | {
    chr(256 + i): b for i, b in enumerate(b for b in range(256) if b not in _PRINTABLE)
}
_BYTE_LEVEL: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()  # tokenizer -> byte-level?
_BYTE_LEVEL_LOCK = threading.Lock()


def _is_byte_level(tokenizer: Any) -> bool:
    """Whether a Hugging Face (fast) tokenizer decodes with ``ByteLevel`` (its tokens spell bytes in GPT-2's
    alphabet); remembered per tokenizer."""
    try:
        with _BYTE_LEVEL_LOCK:
            hit = _BYTE_LEVEL.get(tokenizer)
    except TypeError:  # not weakly referenceable or not hashable: asked every time
        hit = None
    if hit is not None:
        return hit

    def has(spec: Any) -> bool:
        if not isinstance(spec, dict):
            return False
        return spec.get("type") == "ByteLevel" or any(has(d) for d in spec.get("decoders") or [])

    try:
        answer = has(json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder"))
    except Exception:  # noqa: BLE001 - not a fast tokenizer: no exact bytes
        answer = False
    try:
        with _BYTE_LEVEL_LOCK:
            _BYTE_LEVEL[tokenizer] = answer
    except TypeError:
        pass
    return answer


def _exact_bytes(backend: InferenceBackend, agent: str, ids: Sequence[int]) -> list[bytes | None] | None:
    """Each token's exact bytes from a byte-level BPE tokenizer of the backend (None for an added/special token,
    whose text is exact); None when the backend has no such tokenizer for ``agent``."""
    tokenizers = getattr(backend, "tokenizers", None)
    tok = tokenizers.get(agent) if isinstance(tokenizers, dict) else None
    if tok is None or not _is_byte_level(tok):
        return None
    try:
        added = set(getattr(tok, "added_tokens_decoder", None) or ())
        names = tok.convert_ids_to_tokens([int(t) for t in ids])
    except Exception:  # noqa: BLE001 - a tokenizer without the usual API: no exact bytes
        return None
    out: list[bytes | None] = []
    for t, name in zip(ids, names, strict=True):
        ok = t not in added and isinstance(name, str) and all(c in _BYTE_OF_CHAR for c in name)
        out.append(bytes(_BYTE_OF_CHAR[c] for c in name) if ok else None)
    return out


@dataclass
class _Tokens:
    """One completion's tokens as the responses show them (A of each).

    Attributes:
        texts: Each token's own decoded text (special tokens included; U+FFFD for part of a character).
        pieces: The text each token adds under incremental detokenization; they join to the completion's text.
        raw: Each token's bytes (see the module docstring).
    """

    texts: list[str]
    pieces: list[str]
    raw: list[bytes]

    @property
    def offsets(self) -> list[int]:
        """Where each token's piece starts in the text."""
        return list(itertools.accumulate((len(p) for p in self.pieces), initial=0))[: len(self.pieces)]


def _tokens(backend: InferenceBackend, agent: str, g: Generation) -> _Tokens:
    """A completion's :class:`_Tokens` (blocking: it decodes; run it in a worker thread)."""
    ids = list(g.response_token_ids)

    def decode(x: list[int]) -> str:
        return backend.decode(agent, x)

    texts = list(backend.token_texts(agent, ids))
    pieces = token_texts(ids, g.text, decode)
    exact = _exact_bytes(backend, agent, ids) or [None] * len(ids)
    raw = [
        b if b is not None else (t.encode() if "\ufffd" not in t else p.encode())
        for b, t, p in zip(exact, texts, pieces, strict=True)
    ]
    return _Tokens(texts, pieces, raw)


async def _all_tokens(gateway: Gateway, served: Served) -> list[_Tokens]:
    """Every choice's :class:`_Tokens`, decoded in a worker thread."""

    def work() -> list[_Tokens]:
        return [_tokens(gateway.backend, served.agent, g) for g in served.generations]

    return await asyncio.to_thread(work)


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


def _chat_logprobs(toks: _Tokens, logps: Sequence[float], at: slice = slice(None)) -> dict[str, Any]:
    """Chat ``logprobs``: one entry per token (those of ``at``) with its text, log-prob and bytes."""
    return {
        "content": [
            {"token": t, "logprob": _finite(x), "bytes": list(b), "top_logprobs": []}
            for t, x, b in zip(toks.texts[at], list(logps)[at], toks.raw[at], strict=True)
        ]
    }


def _text_logprobs(toks: _Tokens, logps: Sequence[float], at: slice = slice(None)) -> dict[str, Any]:
    """Completions ``logprobs``: the tokens' (those of ``at``) texts, log-probs, ``top_logprobs`` (per token a
    dict holding only the sampled token's text and log-prob: the engine records no alternatives) and character
    offsets into the text."""
    texts, values = toks.texts[at], [_finite(x) for x in list(logps)[at]]
    return {
        "tokens": texts,
        "token_logprobs": values,
        "top_logprobs": [{t: x} for t, x in zip(texts, values, strict=True)],
        "text_offset": toks.offsets[at],
    }


def _stream(
    served: Served, tokens: Sequence[_Tokens], head: dict[str, Any], body: _Sampled, logprobs: bool
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
                        _chat_logprobs(toks, g.response_logprobs, at)
                        if chat
                        else _text_logprobs(toks, g.response_logprobs, at)
                    )
                chunks.append(choice(piece, lp, None))
        chunks.append(choice(None, None, g.finish_reason))
        chunks[-1]["choices"][0].update(_marti_choice(served, i))
    chunks[0] = {**chunks[0], "prompt_token_ids": list(served.generations[0].prompt_token_ids)}
    if body.stream_options is not None and body.stream_options.include_usage:
        chunks.append({**head, "choices": [], "usage": _usage(served)})

    async def events() -> AsyncIterator[bytes]:
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
    """Resolve, tokenize, size ``max_tokens`` and generate (shared by both completion routes); an
    InvalidArgumentError of the core gets ``param`` when its message names the field."""
    prompt_param = (
        "messages" if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) else "prompt"
    )
    try:
        episode_id, group_id = _context(request)
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
                idempotency_key=_header(request, IDEMPOTENCY_HEADER),
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


def _model_object(card: ModelCard, created: int) -> dict[str, Any]:
    """OpenAI's Model object of a model card, with the ``agent`` and ``policy_version`` extensions."""
    return {
        "id": card.id,
        "object": "model",
        "created": created,
        "owned_by": "marti",
        "agent": card.agent,
        "policy_version": card.version,
    }


async def _disconnect(request: Request) -> None:
    """Return once the client of ``request`` disconnects (its body was read already, so the next ASGI message
    is ``http.disconnect``)."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # noqa: BLE001 - a transport that fails to receive has lost its client too
        return


async def _report(gateway: Gateway, request: Request, episode_id: str, body: RewardRequest) -> JSONResponse:
    """Report one episode (both reward routes): 200 ``{"episode_id", "released", "dropped"}``, 202 with
    ``"queued"`` when released episodes were not inserted within ``gateway.report_wait_s``; ``"stale"`` (see
    :class:`~marti.inference.StaleCalls`) when calls of the released episodes are already past
    their agent's staleness bound."""
    _check_path(request)
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
    # middleware added later runs first: errors (catch-all), then authentication, then the body size
    app.add_middleware(_BodyLimit, max_bytes=gateway.limits.max_request_bytes)
    if token is not None:
        app.add_middleware(_BearerAuth, token=token)
    install_error_handlers(app, _FIELDS)
    created = int(time.time())
    api = APIRouter()

    @api.get("/v1/models")
    async def list_models() -> JSONResponse:
        """Every servable model name with its agent and policy version."""
        return JSONResponse({"object": "list", "data": [_model_object(m, created) for m in gateway.models()]})

    @api.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> JSONResponse:
        """One servable model name (OpenAI's Model object, as in ``GET /v1/models``); 404 for a name that is
        not served now (an unknown agent, or a version that is not resident)."""
        _check_path(request)
        for m in gateway.models():
            if m.id == model_id:
                return JSONResponse(_model_object(m, created))
        gateway.resolve(model_id)  # raises NotFoundError naming what is served
        raise NotFoundError(f"model {model_id!r} does not exist")  # resolvable but not listed: not servable

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
        messages = [
            {"role": chat_role(m.role, f"messages[{i}].role"), "content": m.content}
            for i, m in enumerate(body.messages)
        ]
        served = await _serve(gateway, request, body, messages, max_tokens, param, DEFAULT_CHAT_MAX_TOKENS)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model}
        if body.stream:
            tokens = await _all_tokens(gateway, served)
            head["object"] = "chat.completion.chunk"
            return _stream(served, tokens, head, body, bool(body.logprobs))
        tokens = await _all_tokens(gateway, served) if body.logprobs else None
        choices = []
        for i, g in enumerate(served.generations):
            lp = _chat_logprobs(tokens[i], g.response_logprobs) if tokens is not None else None
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
            return _stream(served, await _all_tokens(gateway, served), head, body, want)
        tokens = await _all_tokens(gateway, served) if want else None
        choices = []
        for i, g in enumerate(served.generations):
            lp = _text_logprobs(tokens[i], g.response_logprobs) if tokens is not None else None
            choices.append({"index": i, "text": g.text, "logprobs": lp, "finish_reason": g.finish_reason})
            choices[-1].update(_marti_choice(served, i))
        return JSONResponse({**head, "choices": choices, "usage": _usage(served), **_marti_response(served)})

    @app.post("/v1/episodes/{episode_id}/reward")
    async def report_reward(episode_id: str, body: RewardRequest, request: Request) -> JSONResponse:
        """End an episode with its rewards (or as failed); returns how many episodes were released and dropped.
        The ids follow the rules of calls (valid UTF-8, ``gateway.max_id_chars``, no ``/``)."""
        return await _report(gateway, request, episode_id, body)

    @app.post("/episodes/{prefix_episode}/v1/episodes/{episode_id}/reward", include_in_schema=False)
    @app.post(
        "/episodes/{prefix_episode}/groups/{prefix_group}/v1/episodes/{episode_id}/reward",
        include_in_schema=False,
    )
    async def report_reward_under_prefix(
        prefix_episode: str, episode_id: str, body: RewardRequest, request: Request
    ) -> JSONResponse:
        """The reward route under a traced ``base_url``: the prefix's episode must be ``episode_id``; its group
        (when the prefix has one) is the report's ``group_id``."""
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
        return await _report(gateway, request, episode_id, body)

    @app.get("/v1/gateway/stats")
    async def stats() -> JSONResponse:
        """The gateway's counters (:meth:`Gateway.stats`)."""
        return JSONResponse(gateway.stats())

    app.include_router(api)
    app.include_router(api, prefix="/episodes/{episode_id}", include_in_schema=False)
    app.include_router(api, prefix="/episodes/{episode_id}/groups/{group_id}", include_in_schema=False)
    return app
