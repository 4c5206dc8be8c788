"""What the gateway's chat APIs share in their request bodies (pydantic) and answers: UTF-8-checked strings,
strict floats, the sampling fields of :class:`SampledRequest`, and the ``marti`` extensions of a response and of
its choices (see :mod:`services.gateway.http`, "Extensions").

Strings must be encodable as UTF-8 (a lone surrogate escape is refused, naming the field); unknown keys are ignored
(a body that refuses them sets ``extra="forbid"``, as :class:`~services.gateway.http.app.reward.RewardRequest`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AllowInfNan,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
)

from marti.errors import InvalidArgumentError
from marti.types.chat_content import utf8_text
from marti.types.inference import SamplingParams
from services.gateway.core.gateway import Served
from services.gateway.http.common.errors import request_error

_Float = Annotated[float, Strict(), AllowInfNan(False)]
_Seed = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
#: OpenAI's ranges: ``temperature`` in [0, 2] and ``top_p`` in [0, 1]; a value outside is a 400 naming the field and
#: the value, as OpenAI's API answers (Anthropic's ``temperature`` is [0, 1]: the Messages route's own field).
_Temperature = Annotated[_Float, Field(ge=0, le=2)]
_TopP = Annotated[_Float, Field(ge=0, le=1)]


def _utf8(v: str) -> str:
    """``v`` unchanged; ValueError when it cannot be encoded as UTF-8 (JSON's lone surrogate escapes)."""
    try:
        return utf8_text(v, "the text")
    except InvalidArgumentError as exc:
        raise ValueError(exc.message) from None


#: A string that is valid Unicode (encodable as UTF-8).
_Str = Annotated[StrictStr, AfterValidator(_utf8)]


def unapplied(neutral: tuple[Any, ...], why: str) -> Any:
    """The type of a request field this gateway accepts only when it changes nothing: absent, null or one of the
    ``neutral`` values (``0`` for a penalty, ``{}`` for ``logit_bias``) pass, as None; any other value is a 400
    naming the field and the value, its message ``why`` (never accepted and dropped: the tokens sampled, and
    trained on, would not be what the client asked for)."""

    def check(v: Any) -> None:
        if v is None or (not isinstance(v, bool) and v in neutral):
            return None
        raise ValueError(why)

    return Annotated[Any, BeforeValidator(check)]


#: Why a sampling field of OpenAI's or vLLM's APIs that the engine does not apply is refused.
NOT_SAMPLED = (
    "the engine does not apply this sampling setting (it samples with temperature, top_p, top_k, stop and seed "
    "only), so the tokens would not be sampled as asked; leave it out"
)
#: A penalty or bias field the engine does not apply: only its neutral value passes.
_Penalty = unapplied((0,), NOT_SAMPLED)


def checked_text(value: Any, param: str) -> str:
    """``value`` when it is a string UTF-8 can encode (for fields read by hand: content blocks, input items).

    Raises:
        InvalidArgumentError: Not a string, or a lone surrogate escape in it (naming ``param``).
    """
    if not isinstance(value, str):
        raise request_error(f"{param} must be a string, got {type(value).__name__}", param)
    return utf8_text(value, param)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    """``stream_options``: ``include_usage`` adds a final chunk with the usage and no choices."""

    include_usage: StrictBool | None = False


class SampledRequest(_Body):
    """The fields both completion routes share: the model, sampling, ``n``, ``seed`` and streaming. The sampling
    settings the engine does not apply (OpenAI's ``presence_penalty``, ``frequency_penalty``, ``logit_bias``;
    vLLM's ``min_p``, ``repetition_penalty``) pass only at their neutral value (:func:`unapplied`)."""

    model: _Str
    temperature: _Temperature | None = None
    top_p: _TopP | None = None
    top_k: StrictInt | None = None
    stop: Any = Field(default=None, validate_default=True)
    n: StrictInt | None = None
    seed: _Seed | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: _Penalty = None
    frequency_penalty: _Penalty = None
    logit_bias: unapplied(({},), NOT_SAMPLED) = None  # type: ignore[valid-type]
    min_p: _Penalty = None  # vLLM's
    repetition_penalty: unapplied((1,), NOT_SAMPLED) = None  # type: ignore[valid-type]  # vLLM's

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


# ---------------------------------------------------------------------------------------------- response objects
def marti_choice(served: Served, i: int) -> dict[str, Any]:
    """The extensions of choice ``i``: its ``token_ids``, ``call_id`` and ``policy_version``."""
    g = served.generations[i]
    return {
        "token_ids": list(g.response_token_ids),
        "call_id": served.call_ids[i],
        "policy_version": g.policy_version,
    }


def marti_response(served: Served) -> dict[str, Any]:
    """The extensions of a response: ``prompt_token_ids``, the oldest ``policy_version``, ``call_ids``, ``agent``."""
    return {
        "prompt_token_ids": list(served.generations[0].prompt_token_ids),
        "policy_version": min(g.policy_version for g in served.generations),
        "call_ids": list(served.call_ids),
        "agent": served.agent,
    }
