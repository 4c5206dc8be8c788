"""Detokenization for the HTTP answers: each generated token's own text, the piece it adds to the completion's
text (incremental detokenization), its exact bytes, and the log-probability objects of chat and completions (see
:mod:`services.gateway.http`, "Log-probabilities")."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from marti.types.inference import Generation
from services.gateway.convert import token_texts
from services.gateway.core.backend import InferenceBackend
from services.gateway.core.gateway import Gateway, Served

#: What a log-probability of -inf is reported as (JSON has no infinities; vLLM does the same).
NEG_INF_LOGPROB = -9999.0


def _finite(x: float) -> float:
    """``x``, or :data:`NEG_INF_LOGPROB` when it is not finite (JSON has no infinities)."""
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
class Tokens:
    """One completion's tokens as the responses show them (A of each).

    Attributes:
        texts: Each token's own decoded text (special tokens included; U+FFFD for part of a character).
        pieces: The text each token adds under incremental detokenization; they join to the completion's text.
        raw: Each token's bytes (see :mod:`services.gateway.http`, "Log-probabilities").
    """

    texts: list[str]
    pieces: list[str]
    raw: list[bytes]

    @property
    def offsets(self) -> list[int]:
        """Where each token's piece starts in the text."""
        return list(itertools.accumulate((len(p) for p in self.pieces), initial=0))[: len(self.pieces)]


def _tokens(backend: InferenceBackend, agent: str, g: Generation) -> Tokens:
    """A completion's :class:`Tokens` (blocking: it decodes; run it in a worker thread)."""
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
    return Tokens(texts, pieces, raw)


async def all_tokens(gateway: Gateway, served: Served) -> list[Tokens]:
    """Every choice's :class:`Tokens`, decoded in a worker thread."""

    def work() -> list[Tokens]:
        return [_tokens(gateway.backend, served.agent, g) for g in served.generations]

    return await asyncio.to_thread(work)


def chat_logprobs(toks: Tokens, logps: Sequence[float], at: slice = slice(None)) -> dict[str, Any]:
    """Chat ``logprobs``: one entry per token (those of ``at``) with its text, log-prob and bytes."""
    return {
        "content": [
            {"token": t, "logprob": _finite(x), "bytes": list(b), "top_logprobs": []}
            for t, x, b in zip(toks.texts[at], list(logps)[at], toks.raw[at], strict=True)
        ]
    }


def text_logprobs(toks: Tokens, logps: Sequence[float], at: slice = slice(None)) -> dict[str, Any]:
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
