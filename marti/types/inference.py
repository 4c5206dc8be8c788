"""Generation types shared by the rollout engines, the inference gateway and the SDK's inference clients.

:class:`SamplingParams` says how to sample; :class:`Generation` is one sampled response with the exact token ids
and the raw (temperature 1) log-probability of each generated token under the policy version that produced it
(see :mod:`services.trainer.rollout.engines.base` for the log-probability semantics every engine follows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from marti.errors import InvalidArgumentError
from marti.types.tools import ChatReply, ToolCall

__all__ = [
    "ChatMessages",
    "ChatReply",
    "FinishReason",
    "Generation",
    "Prompt",
    "SamplingParams",
    "ToolCall",
]

#: A conversation in chat format: ``[{"role": "user", "content": "..."}, ...]`` (Hugging Face chat-template
#: messages: an assistant message may also carry ``tool_calls``, a ``tool`` message ``tool_call_id``).
ChatMessages = list[dict[str, Any]]
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


# ------------------------------------------------------------------------------------------------------------
# Results of the SDK's inference clients (marti.clients.inference): what the inference gateway returns.


@dataclass(frozen=True)
class Completion:
    """One completion served by the inference gateway.

    Attributes:
        call_id: Id of the call; :meth:`InferenceClient.report_reward` ``call_rewards`` names it.
        text: Decoded completion without special tokens, cut before a matched stop string.
        token_ids: Generated token ids (A of them), exactly as sampled (and as recorded for training).
        logprobs: A floats: raw (temperature 1) natural-log probability of each token under the sampling policy.
        finish_reason: ``"stop"`` (end of sequence or stop string) or ``"length"`` (hit ``max_tokens``).
        policy_version: Version of the agent's weights that sampled it.
        index: Position among the request's ``n`` completions, from 0.
    """

    call_id: str
    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_version: int
    index: int = 0


@dataclass(frozen=True)
class InferenceResult:
    """What one ``generate`` call returned.

    Attributes:
        choices: The ``n`` completions, in index order.
        prompt_token_ids: The prompt as the model saw it (chat template applied), token ids.
        agent: The agent that served it.
    """

    choices: list[Completion]
    prompt_token_ids: list[int]
    agent: str

    @property
    def text(self) -> str:
        """The first completion's text."""
        return self.choices[0].text


@dataclass(frozen=True)
class CompletionDelta:
    """One event of a streamed completion.

    A token event has ``token_id`` and ``logprob`` set and the ``text`` the token adds (possibly ``""``); the
    last event of each completion has ``token_id`` None and ``finish_reason``, ``call_id`` and
    ``policy_version`` set (``done`` is True). The ``text`` of a completion's events, joined, equals its
    :attr:`Completion.text`.

    Attributes:
        index: Which completion, from 0.
        token_id: The generated token, or None on the final event.
        logprob: Its raw log-probability, or None on the final event.
        text: Text the token adds; ``""`` on the final event.
        finish_reason: ``"stop"`` or ``"length"`` on the final event, else None.
        call_id: The completion's call id on the final event, else ``""``.
        policy_version: The sampling policy's version on the final event, else None.
    """

    index: int
    token_id: int | None = None
    logprob: float | None = None
    text: str = ""
    finish_reason: FinishReason | None = None
    call_id: str = ""
    policy_version: int | None = None

    @property
    def done(self) -> bool:
        """True on the final event of a completion."""
        return self.finish_reason is not None


@dataclass(frozen=True)
class ModelInfo:
    """A model name the inference gateway serves.

    Attributes:
        id: The name to pass as ``model``: an agent id or ``agent@VERSION``.
        agent: The agent it serves.
        policy_version: Current version (agent ids) or the pinned one (``agent@VERSION``).
        pinned: True for ``agent@VERSION`` names.
        max_model_len: Most prompt-plus-completion tokens the agent's model accepts.
    """

    id: str
    agent: str
    policy_version: int
    pinned: bool
    max_model_len: int


@dataclass(frozen=True)
class StaleCalls:
    """One agent's calls in one reported episode that are already past the agent's staleness bound when the
    report is answered: training drops the agent's item (with its group) instead of training on it. The gateway
    builds these; the HTTP report's ``"stale"`` entries and :attr:`RewardReceipt.stale` carry them.

    Attributes:
        episode_id: The episode.
        agent: The agent whose calls are past the bound.
        policy_version: The oldest policy version that sampled one of its calls in the episode.
        current_version: The agent's policy version when the report was answered.
        max_staleness: The agent's bound, in policy versions (``rollout.max_staleness`` or its own
            ``max_staleness``): an item is trained only while ``current_version - policy_version <=
            max_staleness``.
        stale_calls: How many of its recorded calls in the episode were sampled by a version past the bound.
    """

    episode_id: str
    agent: str
    policy_version: int
    current_version: int
    max_staleness: int
    stale_calls: int


@dataclass(frozen=True)
class RewardReceipt:
    """What one reward report did.

    Attributes:
        released: Episodes it made final and handed to training (0 while its group is incomplete).
        dropped: Episodes it dropped (a failed episode with its group's held members, or a member of a dropped
            group).
        queued: Released episodes not yet inserted into training when the gateway answered (it waited
            ``gateway.report_wait_s``); the gateway inserts them in the background. 0: all were inserted.
        stale: Per agent of a released episode (and of the reported one while it waits for its group), the
            calls already past the agent's staleness bound (:class:`StaleCalls`): training will drop them.
            Empty when none is, or when the gateway knows no bound (one not run by a training job).
    """

    released: int
    dropped: int
    queued: int = 0
    stale: tuple[StaleCalls, ...] = ()


__all__ += ["Completion", "CompletionDelta", "InferenceResult", "ModelInfo", "RewardReceipt", "StaleCalls"]
