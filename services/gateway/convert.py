"""The only bridge between ``marti.api.inference.v1`` protos and the gateway's domain types (server side).

Requests become ``(model, prompt, SamplingParams, n, episode_id, group_id)`` with every field checked and named
in the error; :class:`~services.gateway.core.gateway.Served` results, model cards and released episodes become
responses. :func:`token_texts` splits a completion's text into one piece per generated token for the stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from marti.api.inference.v1 import inference_pb2 as pb
from marti.codec.inference import FINISH_REASON_NAMES, stale_to_proto
from marti.errors import InvalidArgumentError
from marti.types.inference import ChatMessages, SamplingParams
from services.gateway.core.gateway import ModelCard, Reported, Served

#: ``max_tokens`` when a request leaves it unset (the SDK's :class:`SamplingParams` default), or less when the
#: model's context has less room left after the prompt.
DEFAULT_MAX_TOKENS = SamplingParams.max_new_tokens

#: Finish reason name -> wire value (the inverse of the SDK codec's table).
FINISH_REASONS: dict[str, int] = {name: value for value, name in FINISH_REASON_NAMES.items()}

#: Decodes token ids of one agent to text without special tokens.
Decode = Callable[[list[int]], str]

#: The chat roles the OpenAI API defines (``function`` is deprecated there and refused here).
CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")


def chat_role(role: str, param: str) -> str:
    """The role a chat message is rendered with: ``role`` itself, except ``developer`` (OpenAI's successor of
    ``system`` for newer models), which chat templates do not know and is rendered as ``system``.

    Args:
        role: The message's role as sent.
        param: The request field, named in the error (``messages[0].role``).

    Raises:
        InvalidArgumentError: ``role`` is not one of :data:`CHAT_ROLES`.
    """
    if role not in CHAT_ROLES:
        raise InvalidArgumentError(
            f"{param} is {role!r}; a chat message's role must be one of {list(CHAT_ROLES)}"
        )
    return "system" if role == "developer" else role


@dataclass(frozen=True)
class GenerateArgs:
    """A validated generate request, in the gateway's terms.

    Attributes:
        model: ``agent`` or ``agent@VERSION`` (non-empty; resolved by the gateway).
        prompt: Chat messages, raw text, or token ids (non-empty).
        sampling: Sampling parameters (``max_new_tokens`` is :data:`DEFAULT_MAX_TOKENS` when the request left
            ``max_tokens`` unset; see :func:`default_max_tokens`).
        max_tokens: The request's ``max_tokens``, or None when unset.
        n: Completions wanted, >= 1 (the gateway checks its ``max_n``).
        episode_id: The caller's episode, or ``""``.  group_id: Its group, or ``""``.
        idempotency_key: The caller's key of this call within the episode, or ``""``.
    """

    model: str
    prompt: ChatMessages | str | list[int]
    sampling: SamplingParams
    max_tokens: int | None
    n: int
    episode_id: str
    group_id: str
    idempotency_key: str = ""


def prompt_from_proto(req: pb.GenerateRequest) -> ChatMessages | str | list[int]:
    """The request's prompt as the gateway takes it.

    Raises:
        InvalidArgumentError: No prompt set, no messages, a message whose role is not one of
            :data:`CHAT_ROLES`, empty text, no token ids or a negative token id (the field is named).
    """
    kind = req.WhichOneof("prompt")
    if kind is None:
        raise InvalidArgumentError("prompt is required: set one of messages, text or token_ids")
    if kind == "messages":
        if not req.messages.messages:
            raise InvalidArgumentError("messages.messages must hold at least one message")
        out: ChatMessages = []
        for i, m in enumerate(req.messages.messages):
            out.append({"role": chat_role(m.role, f"messages.messages[{i}].role"), "content": m.content})
        return out
    if kind == "text":
        if not req.text:
            raise InvalidArgumentError("text must be non-empty")
        return req.text
    ids = list(req.token_ids.ids)
    if not ids:
        raise InvalidArgumentError("token_ids.ids must hold at least one token id")
    bad = next((i for i, t in enumerate(ids) if t < 0), None)
    if bad is not None:
        raise InvalidArgumentError(f"token_ids.ids[{bad}] is {ids[bad]}, token ids must be >= 0")
    return ids


def sampling_from_proto(req: pb.GenerateRequest, max_tokens: int) -> SamplingParams:
    """The request's sampling fields as :class:`SamplingParams` (unset fields take the documented defaults).

    Args:
        req: The request.
        max_tokens: ``max_new_tokens`` to use (the request's ``max_tokens`` when set; the caller's default
            otherwise).

    Raises:
        InvalidArgumentError: ``max_tokens`` < 1, a non-finite or negative temperature, ``top_p`` outside (0, 1],
            an empty stop string (the field is named).
    """
    if max_tokens <= 0:
        raise InvalidArgumentError(f"max_tokens must be > 0, got {max_tokens}")
    temperature = req.temperature if req.HasField("temperature") else 1.0
    if not math.isfinite(temperature):
        raise InvalidArgumentError(f"temperature must be finite and >= 0, got {temperature}")
    top_p = req.top_p if req.HasField("top_p") else 1.0
    for i, s in enumerate(req.stop):
        if not s:
            raise InvalidArgumentError(f"stop[{i}] must be a non-empty string")
    return SamplingParams(
        max_new_tokens=int(max_tokens),
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=int(req.top_k),
        stop=tuple(req.stop),
        seed=int(req.seed) if req.HasField("seed") else None,
    )


def generate_args(req: pb.GenerateRequest) -> GenerateArgs:
    """Validate a :class:`GenerateRequest` and return it in the gateway's terms.

    Raises:
        InvalidArgumentError: An empty model, a bad prompt or sampling field, or ``n`` of 0 (the field is named).
    """
    if not req.model:
        raise InvalidArgumentError("model is required: an agent id or AGENT@VERSION (ListModels lists them)")
    prompt = prompt_from_proto(req)
    max_tokens = int(req.max_tokens) if req.HasField("max_tokens") else None
    sampling = sampling_from_proto(req, DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens)
    n = req.n if req.HasField("n") else 1
    if n < 1:
        raise InvalidArgumentError(f"n must be >= 1, got {n}")
    return GenerateArgs(
        req.model, prompt, sampling, max_tokens, int(n), req.episode_id, req.group_id, req.idempotency_key
    )


def default_max_tokens(prompt_tokens: int, max_model_len: int) -> int:
    """``max_tokens`` of a request that leaves it unset: :data:`DEFAULT_MAX_TOKENS`, or the room the model's
    context has left after the prompt when that is less.

    Raises:
        InvalidArgumentError: The prompt leaves no room (its length and the context are named).
    """
    room = max_model_len - prompt_tokens
    if room <= 0:
        raise InvalidArgumentError(
            f"the prompt has {prompt_tokens} tokens, which fills the model's context of {max_model_len} tokens"
        )
    return min(DEFAULT_MAX_TOKENS, room)


def choice_to_proto(index: int, call_id: str, gen) -> pb.Choice:
    """One generation (a :class:`marti.types.inference.Generation`) as a :class:`Choice`."""
    return pb.Choice(
        index=index,
        call_id=call_id,
        text=gen.text,
        token_ids=list(gen.response_token_ids),
        logprobs=list(gen.response_logprobs),
        finish_reason=FINISH_REASONS.get(gen.finish_reason, pb.FINISH_REASON_UNSPECIFIED),
        policy_version=int(gen.policy_version),
    )


def generate_response(served: Served) -> pb.GenerateResponse:
    """What a Generate call returns for what the gateway served (``prompt_token_ids`` from the first choice;
    all ``n`` share the prompt)."""
    gens = served.generations
    return pb.GenerateResponse(
        choices=[
            choice_to_proto(i, c, g) for i, (c, g) in enumerate(zip(served.call_ids, gens, strict=True))
        ],
        prompt_token_ids=list(gens[0].prompt_token_ids) if gens else [],
        agent=served.agent,
    )


def token_texts(ids: Sequence[int], text: str, decode: Decode | None) -> list[str]:
    """Split ``text`` into one piece per token of ``ids``; the pieces joined equal ``text`` exactly.

    Each token's piece is the text it adds under incremental detokenization (the window method of vLLM's
    detokenizer: a piece is emitted once it decodes to complete characters), aligned with ``text``: once a piece
    differs from what ``text`` holds next (``text`` was cut before a stop string, or the decoder spells it
    differently), later tokens get ``""`` and the rest of ``text`` goes to the last token.

    Args:
        ids: The completion's token ids (A of them).
        text: The completion's text.
        decode: Decodes ids of the completion's agent without special tokens; None puts all of ``text`` on the
            last token.

    Returns:
        A pieces (``[]`` when ``ids`` is empty).
    """
    n = len(ids)
    out = [""] * n
    if n == 0:
        return out
    matched = 0
    if decode is not None:
        ids = list(ids)
        prefix_offset = read_offset = 0
        for i in range(n):
            prefix_text = decode(ids[prefix_offset:read_offset]) if read_offset > prefix_offset else ""
            new_text = decode(ids[prefix_offset : i + 1])
            if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
                continue  # nothing complete yet (a partial character or a special token)
            delta = new_text[len(prefix_text) :]
            prefix_offset, read_offset = read_offset, i + 1
            if text.startswith(delta, matched):
                out[i] = delta
                matched += len(delta)
                continue
            k = 0  # the decoder disagrees with the text from here on: keep the common part and stop
            while k < len(delta) and matched + k < len(text) and delta[k] == text[matched + k]:
                k += 1
            out[i] = delta[:k]
            matched += k
            break
    out[-1] += text[matched:]
    return out


def stream_responses(served: Served, pieces: Sequence[Sequence[str]]) -> Iterator[pb.GenerateStreamResponse]:
    """The messages of a GenerateStream call: a header, then per choice its token deltas and its end.

    Args:
        served: What the gateway served.
        pieces: Per choice, one text piece per token (see :func:`token_texts`).
    """
    gens = served.generations
    yield pb.GenerateStreamResponse(
        header=pb.StreamHeader(
            prompt_token_ids=list(gens[0].prompt_token_ids) if gens else [],
            agent=served.agent,
            n=len(gens),
        )
    )
    for i, (call_id, g) in enumerate(zip(served.call_ids, gens, strict=True)):
        logps = list(g.response_logprobs) or [0.0] * len(g.response_token_ids)
        for tok, lp, piece in zip(g.response_token_ids, logps, pieces[i], strict=True):
            yield pb.GenerateStreamResponse(
                delta=pb.TokenDelta(index=i, token_id=int(tok), logprob=float(lp), text=piece)
            )
        yield pb.GenerateStreamResponse(
            end=pb.ChoiceEnd(
                index=i,
                call_id=call_id,
                finish_reason=FINISH_REASONS.get(g.finish_reason, pb.FINISH_REASON_UNSPECIFIED),
                policy_version=int(g.policy_version),
            )
        )


def model_info(card: ModelCard, max_model_len: int) -> pb.ModelInfo:
    """A model card with its agent's context length as :class:`ModelInfo`."""
    return pb.ModelInfo(
        id=card.id,
        agent=card.agent,
        policy_version=int(card.version),
        pinned=card.pinned,
        max_model_len=int(max_model_len),
    )


def report_args(req: pb.ReportRewardRequest) -> dict:
    """Keyword arguments of :meth:`Gateway.report` for a request (episode id first).

    Raises:
        InvalidArgumentError: An empty ``episode_id`` or a non-finite reward (the key is named).
    """
    if not req.episode_id:
        raise InvalidArgumentError("episode_id must be a non-empty string")
    for field in ("rewards", "call_rewards"):
        for k, v in getattr(req, field).items():
            if not math.isfinite(v):
                raise InvalidArgumentError(f"{field}[{k!r}] must be finite, got {v}")
    return {
        "episode_id": req.episode_id,
        "rewards": dict(req.rewards),
        "call_rewards": dict(req.call_rewards) or None,
        "group_id": req.group_id,
        "group_size": int(req.group_size),
        "failed": bool(req.failed),
    }


def reported_to_proto(reported: Reported) -> pb.ReportRewardResponse:
    """What a report released, dropped and left queued, and which of its calls are already stale (the same
    :attr:`Reported.stale` the HTTP route answers with)."""
    return pb.ReportRewardResponse(
        released=len(reported.episodes),
        dropped=int(reported.dropped),
        queued=int(reported.queued),
        stale=[stale_to_proto(s) for s in reported.stale],
    )
