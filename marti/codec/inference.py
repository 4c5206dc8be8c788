"""Conversions between ``marti.api.inference.v1`` messages and the SDK's inference types (client side).

Both inference clients (:mod:`marti.clients.inference`, sync and ``grpc.aio``) build their requests and read
their responses here, so each conversion is written once:

* :func:`generate_request`: the ``GenerateRequest`` of a ``generate`` call, with the SDK's argument checks.
* :func:`report_request`: the ``ReportRewardRequest`` of a ``report_reward`` call.
* :func:`result_from_proto`, :func:`model_from_proto`, :func:`models_from_proto`, :func:`receipt_from_proto`,
  :data:`FINISH_REASON_NAMES`: responses to domain types.
* :func:`stale_to_proto`: a :class:`~marti.types.inference.StaleCalls` to its message (the gateway's answer to a
  report; :func:`receipt_from_proto` reads it back).
* :class:`StreamAssembler`: ``GenerateStream`` messages to :class:`~marti.types.inference.CompletionDelta` events
  and back into the result ``generate`` would return.

The gateway's side of the same protocol (requests to engine arguments) is ``services/gateway/convert.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from marti.api.inference.v1 import inference_pb2 as pb
from marti.errors import InternalError, InvalidArgumentError
from marti.plumbing.arguments import checked
from marti.types.chat_content import content_text, utf8_text
from marti.types.inference import (
    ChatMessages,
    Completion,
    CompletionDelta,
    InferenceResult,
    ModelInfo,
    RewardReceipt,
    StaleCalls,
)

__all__ = [
    "FINISH_REASON_NAMES",
    "StreamAssembler",
    "generate_request",
    "model_from_proto",
    "models_from_proto",
    "receipt_from_proto",
    "report_request",
    "result_from_proto",
    "stale_to_proto",
]

_INT32_MAX = 2**31 - 1
_INT64 = (-(2**63), 2**63 - 1)
_UINT32_MAX = 2**32 - 1


def _check_uint32(name: str, value: int | None) -> None:
    """Raises InvalidArgumentError when ``value`` does not fit the request's uint32 field ``name``."""
    if value is not None and value > _UINT32_MAX:
        raise InvalidArgumentError(
            f"{name} is {value}, above the largest value the request can carry (2**32 - 1)"
        )


def _check_text(name: str, value: str) -> None:
    """Raises InvalidArgumentError when ``value`` cannot be sent as UTF-8 (a lone surrogate), naming where."""
    utf8_text(value, name)


#: Keys of a chat message the gRPC ``Generate`` call carries; any other key with a value is refused, not dropped.
_MESSAGE_KEYS = ("role", "content")


def _chat_message(i: int, m: object) -> tuple[str, str]:
    """``(role, content)`` of ``messages[i]`` as the request carries them: ``content`` a string, a list of
    ``{"type": "text", "text": str}`` parts (joined with newlines, as the gateway's HTTP route and vLLM join them)
    or None in an assistant message (sent as ``""``).

    Raises:
        InvalidArgumentError: ``m`` is not a dict with ``role`` and ``content``; a content of another type, a
            part that is not a text part, None content outside an assistant message; or a key the call cannot
            carry with a value (``tool_calls``, ``tool_call_id``, ``name``: gRPC ``Generate`` has no tools; the
            gateway's HTTP ``/v1/chat/completions`` takes them), named as ``messages[i].KEY``, never dropped.
    """
    if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
        raise InvalidArgumentError(f"messages[{i}] must be a dict with 'role' and 'content', got {m!r:.100}")
    extra = [str(k) for k, v in m.items() if k not in _MESSAGE_KEYS and v is not None]
    if extra:
        raise InvalidArgumentError(
            f"messages[{i}].{extra[0]}: the gRPC Generate call carries only 'role' and 'content' (no tools); "
            "send tool calls through the gateway's HTTP /v1/chat/completions, which takes them"
        )
    role, content = m["role"], m["content"]
    if not isinstance(role, str):
        raise InvalidArgumentError(f"messages[{i}].role must be a string, got {role!r:.100}")
    _check_text(f"messages[{i}].role", role)
    if content is None:
        if role != "assistant":
            raise InvalidArgumentError(
                f"messages[{i}].content is None; content is required in a {role!r} message (only an "
                "assistant's may be None)"
            )
        return role, ""
    return role, content_text(content, f"messages[{i}].content")


#: Wire finish reason -> the name :class:`~marti.types.inference.Completion` carries (unknown values read ``stop``).
FINISH_REASON_NAMES: dict[int, str] = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length"}


@checked
def generate_request(
    model: str,
    messages: ChatMessages | None = None,
    *,
    text: str | None = None,
    token_ids: Sequence[int] | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int = 0,
    stop: str | Sequence[str] = (),
    seed: int | None = None,
    n: int = 1,
    episode_id: str = "",
    group_id: str = "",
    idempotency_key: str = "",
) -> pb.GenerateRequest:
    """Build a ``GenerateRequest`` (see :meth:`InferenceClient.generate` for the arguments).

    Raises:
        InvalidArgumentError: Not exactly one prompt kind, an empty model, a malformed message, a token id or
            seed out of range, ``n`` or ``max_tokens`` < 1, a negative ``top_k``, ``n``, ``max_tokens`` or
            ``top_k`` above 2**32 - 1, or text that UTF-8 cannot encode (a lone surrogate) (the argument is named;
            the gateway checks the rest).
    """
    if not model:
        raise InvalidArgumentError("model is required: an agent id or AGENT@VERSION (models() lists them)")
    given = [
        k for k, v in (("messages", messages), ("text", text), ("token_ids", token_ids)) if v is not None
    ]
    if len(given) != 1:
        raise InvalidArgumentError(
            f"pass exactly one prompt: messages, text or token_ids (got {', '.join(given) or 'none'})"
        )
    if n < 1:
        raise InvalidArgumentError(f"n must be >= 1, got {n}")
    if max_tokens is not None and max_tokens < 1:
        raise InvalidArgumentError(f"max_tokens must be >= 1, got {max_tokens}")
    if top_k < 0:
        raise InvalidArgumentError(f"top_k must be >= 0, got {top_k}")
    if seed is not None and not _INT64[0] <= seed <= _INT64[1]:
        raise InvalidArgumentError(f"seed must fit in int64, got {seed}")
    for name, value in (("n", n), ("max_tokens", max_tokens), ("top_k", top_k)):
        _check_uint32(name, value)
    stops = [stop] if isinstance(stop, str) else list(stop)
    for name, value in (
        ("model", model),
        ("episode_id", episode_id),
        ("group_id", group_id),
        ("idempotency_key", idempotency_key),
        *((f"stop[{i}]", s) for i, s in enumerate(stops) if isinstance(s, str)),
        *((("text", text),) if isinstance(text, str) else ()),
    ):
        _check_text(name, value)
    req = pb.GenerateRequest(
        model=model,
        top_k=top_k,
        stop=stops,
        episode_id=episode_id,
        group_id=group_id,
        idempotency_key=idempotency_key,
        n=n,
    )
    if messages is not None:
        if isinstance(messages, (str, bytes)) or not messages:
            raise InvalidArgumentError("messages must be a non-empty list of {'role', 'content'} dicts")
        for i, m in enumerate(messages):
            role, content = _chat_message(i, m)
            req.messages.messages.add(role=role, content=content)
    elif text is not None:
        req.text = text
    else:
        ids = [int(t) for t in token_ids]  # type: ignore[union-attr]
        bad = next((i for i, t in enumerate(ids) if not 0 <= t <= _INT32_MAX), None)
        if bad is not None:
            raise InvalidArgumentError(f"token_ids[{bad}] is {ids[bad]}, outside [0, 2**31)")
        req.token_ids.ids.extend(ids)
    if max_tokens is not None:
        req.max_tokens = max_tokens
    if temperature is not None:
        req.temperature = temperature
    if top_p is not None:
        req.top_p = top_p
    if seed is not None:
        req.seed = seed
    return req


def result_from_proto(resp: pb.GenerateResponse) -> InferenceResult:
    """The :class:`InferenceResult` of a ``GenerateResponse``."""
    return InferenceResult(
        choices=[
            Completion(
                call_id=c.call_id,
                text=c.text,
                token_ids=list(c.token_ids),
                logprobs=list(c.logprobs),
                finish_reason=FINISH_REASON_NAMES.get(c.finish_reason, "stop"),  # type: ignore[arg-type]
                policy_version=int(c.policy_version),
                index=int(c.index),
            )
            for c in resp.choices
        ],
        prompt_token_ids=list(resp.prompt_token_ids),
        agent=resp.agent,
    )


def model_from_proto(m: pb.ModelInfo) -> ModelInfo:
    """The :class:`ModelInfo` of a ``ModelInfo`` message."""
    return ModelInfo(m.id, m.agent, int(m.policy_version), bool(m.pinned), int(m.max_model_len))


def models_from_proto(resp: pb.ListModelsResponse) -> list[ModelInfo]:
    """The :class:`ModelInfo` of every model a ``ListModelsResponse`` lists, in its order."""
    return [model_from_proto(m) for m in resp.models]


def receipt_from_proto(resp: pb.ReportRewardResponse) -> RewardReceipt:
    """The :class:`RewardReceipt` of a ``ReportRewardResponse`` (``stale``: one :class:`StaleCalls` per message,
    in order)."""
    stale = tuple(
        StaleCalls(**{f.name: getattr(m, f.name) for f in dataclasses.fields(StaleCalls)}) for m in resp.stale
    )
    return RewardReceipt(int(resp.released), int(resp.dropped), int(resp.queued), stale)


def stale_to_proto(stale: StaleCalls) -> pb.StaleCalls:
    """The ``StaleCalls`` message of one :class:`StaleCalls` (same fields, same meaning)."""
    return pb.StaleCalls(**dataclasses.asdict(stale))


@checked
def report_request(
    episode_id: str,
    rewards: Mapping[str, float],
    call_rewards: Mapping[str, float] | None,
    group_id: str,
    group_size: int,
    failed: bool,
) -> pb.ReportRewardRequest:
    """Build a ``ReportRewardRequest`` (see :meth:`InferenceClient.report_reward` for the arguments).

    Raises:
        InvalidArgumentError: An empty ``episode_id``, a negative ``group_size`` or one above 2**32 - 1, or
            text that UTF-8 cannot encode (a lone surrogate), naming the argument.
    """
    if not episode_id:
        raise InvalidArgumentError("episode_id must be a non-empty string")
    if group_size < 0:
        raise InvalidArgumentError(f"group_size must be >= 0, got {group_size}")
    _check_uint32("group_size", group_size)
    _check_text("episode_id", episode_id)
    _check_text("group_id", group_id)
    for where, values in (("rewards", rewards), ("call_rewards", call_rewards or {})):
        for key in values:
            _check_text(f"{where} key", str(key))
    return pb.ReportRewardRequest(
        episode_id=episode_id,
        rewards={str(k): float(v) for k, v in rewards.items()},
        call_rewards={str(k): float(v) for k, v in (call_rewards or {}).items()},
        group_id=group_id,
        group_size=group_size,
        failed=failed,
    )


# ------------------------------------------------------------------------------------------------ streams


class StreamAssembler:
    """Turns GenerateStream messages into :class:`CompletionDelta` events and keeps what a result needs.

    Args:
        header: The stream's first message (its ``header`` event).

    Raises:
        InternalError: ``header`` is not a header event.
    """

    def __init__(self, header: pb.GenerateStreamResponse) -> None:
        if header.WhichOneof("event") != "header":
            raise InternalError("the GenerateStream stream did not start with its header")
        self.agent = header.header.agent
        self.prompt_token_ids = list(header.header.prompt_token_ids)
        self.n = int(header.header.n)

    @staticmethod
    def delta(msg: pb.GenerateStreamResponse) -> CompletionDelta:
        """The event of one message after the header (a token, or a completion's end)."""
        kind = msg.WhichOneof("event")
        if kind == "delta":
            d = msg.delta
            return CompletionDelta(int(d.index), int(d.token_id), float(d.logprob), d.text)
        if kind == "end":
            e = msg.end
            return CompletionDelta(
                int(e.index),
                finish_reason=FINISH_REASON_NAMES.get(e.finish_reason, "stop"),  # type: ignore[arg-type]
                call_id=e.call_id,
                policy_version=int(e.policy_version),
            )
        raise InternalError(f"unexpected GenerateStream message kind {kind!r} after the header")

    def result(self, deltas: Sequence[CompletionDelta]) -> InferenceResult:
        """Assemble every event of the stream into the result ``generate`` returns.

        Raises:
            InternalError: The events end before every completion's final event.
        """
        ids: dict[int, list[int]] = {}
        logps: dict[int, list[float]] = {}
        texts: dict[int, list[str]] = {}
        choices: list[Completion] = []
        for d in deltas:
            if d.done:
                choices.append(
                    Completion(
                        d.call_id, "".join(texts.get(d.index, [])), ids.get(d.index, []),
                        logps.get(d.index, []), d.finish_reason, d.policy_version or 0, d.index,  # type: ignore[arg-type]
                    )
                )  # fmt: skip
            else:
                ids.setdefault(d.index, []).append(d.token_id)  # type: ignore[arg-type]
                logps.setdefault(d.index, []).append(d.logprob)  # type: ignore[arg-type]
                texts.setdefault(d.index, []).append(d.text)
        if len(choices) != self.n:
            raise InternalError(f"the stream ended after {len(choices)} of {self.n} completions")
        return InferenceResult(sorted(choices, key=lambda c: c.index), self.prompt_token_ids, self.agent)
