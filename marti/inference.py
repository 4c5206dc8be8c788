"""Generation types shared by the rollout engines, the inference gateway and the SDK's inference clients.

:class:`SamplingParams` says how to sample; :class:`Generation` is one sampled response with the exact token ids
and the raw (temperature 1) log-probability of each generated token under the policy version that produced it
(see :mod:`services.trainer.rollout.base` for the log-probability semantics every engine follows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from marti.errors import InvalidArgumentError

__all__ = ["ChatMessages", "FinishReason", "Generation", "Prompt", "SamplingParams"]

#: A conversation in chat format: ``[{"role": "user", "content": "..."}, ...]``.
ChatMessages = list[dict[str, str]]
#: What ``generate`` accepts per prompt: token ids, a chat conversation, or raw text.
Prompt = list[int] | ChatMessages | str
FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one batch of responses.

    Attributes:
        max_new_tokens: Most tokens generated per response, > 0 (the engine's ``max_model_len`` bounds
            prompt plus response).
        temperature: Softmax temperature, >= 0; 0 means greedy decoding.
        top_p: Nucleus mass in (0, 1]; 1 disables it.
        top_k: Keep the k most likely tokens, >= 0; 0 disables it.
        stop: Stop strings; generation of a response ends after the token that completes one, and the text
            is cut before it (the token ids keep the completing token, as vLLM does).
        seed: When set, sampling is reproducible for equal inputs (the global RNG is not disturbed).
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        """Validate every field; raises InvalidArgumentError naming the field, value and limit."""
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise InvalidArgumentError(
                f"SamplingParams.max_new_tokens must be an int > 0, got {self.max_new_tokens!r}"
            )
        if not self.temperature >= 0.0:
            raise InvalidArgumentError(f"SamplingParams.temperature must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidArgumentError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidArgumentError(f"SamplingParams.top_k must be an int >= 0, got {self.top_k!r}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise InvalidArgumentError(
                    f"SamplingParams.stop entries must be non-empty strings, got {s!r}"
                )


@dataclass
class Generation:
    """One sampled response.

    Attributes:
        prompt_token_ids: The prompt as the model saw it (chat template applied), without padding.
        response_token_ids: Generated ids (A of them), ending with eos when ``finish_reason == "stop"`` by eos.
        response_logprobs: One float per response token: raw log-probability (see module docstring).
        text: Decoded response without special tokens, cut before a matched stop string.
        finish_reason: ``"stop"`` (eos or stop string) or ``"length"`` (hit ``max_new_tokens``).
        policy_version: Version of the agent's weights that produced it.
        agent_id: The agent that generated it.
    """

    prompt_token_ids: list[int]
    response_token_ids: list[int]
    response_logprobs: list[float]
    text: str
    finish_reason: FinishReason
    policy_version: int = 0
    agent_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
