"""The rollout-engine interface shared by the transformers and vLLM engines.

Dimension names (declared once for the trainer): B batch, T tokens, A response (action) tokens, G group size,
N agents.

Log-probability semantics (both engines): ``Generation.response_logprobs[i]`` is
``log softmax(logits_i)[token_i]`` of the **raw** model distribution, i.e. temperature 1 and no top-k / top-p
filtering, whatever sampling parameters produced the token. That is the quantity the learner recomputes with
``policy.logprobs``, so the PPO ratio ``exp(new - old)`` is exactly 1 for an unchanged policy, and off-policy
corrections need no knowledge of the sampler's settings. (vLLM's ``logprobs_mode="raw_logprobs"`` has the same
meaning.)

Policy versions: every agent's weights carry an integer version, 0 at construction. ``update_weights`` sets a
new one; each :class:`Generation` records the version that produced it, so a learner can measure staleness
(``current_version - generation.policy_version``) and drop or reweight stale samples.
"""

from __future__ import annotations

import abc
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from marti.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from marti.types.inference import ChatMessages, FinishReason, Generation, Prompt, SamplingParams

__all__ = [
    "ChatMessages",
    "FinishReason",
    "Generation",
    "Prompt",
    "RolloutEngine",
    "SamplingParams",
    "chat_to_ids",
    "chats_to_ids",
    "check_room",
    "normalise_prompts",
    "shifted",
    "special_texts",
    "too_long_prompt",
]


class RolloutEngine(abc.ABC):
    """Generates responses per agent and receives weight updates tagged with a policy version.

    Implementations: :class:`services.trainer.rollout.engines.hf.HFRolloutEngine` (transformers, CPU and GPU) and
    :class:`services.trainer.rollout.engines.vllm_engine.VLLMRolloutEngine` (GPU, only where vllm is installed).
    """

    def __init__(
        self, agent_ids: Sequence[str], default_sampling: Mapping[str, SamplingParams] | None = None
    ):
        """Args:
        agent_ids: Agents this engine serves (non-empty, unique).
        default_sampling: Per-agent sampling parameters used when ``generate`` gets none.
        """
        ids = list(agent_ids)
        if not ids:
            raise InvalidArgumentError("a rollout engine needs at least one agent id, got none")
        if len(set(ids)) != len(ids):
            raise InvalidArgumentError(f"agent ids must be unique, got {ids}")
        self._agent_ids = ids
        self._versions = dict.fromkeys(ids, 0)
        self._default_sampling: dict[str, SamplingParams] = {a: SamplingParams() for a in ids}
        for agent, params in (default_sampling or {}).items():
            self._check_agent(agent)
            self._default_sampling[agent] = params

    @property
    def agent_ids(self) -> list[str]:
        """The agents this engine serves, in construction order."""
        return list(self._agent_ids)

    def sampling_for(self, agent_id: str) -> SamplingParams:
        """Return the agent's default sampling parameters."""
        self._check_agent(agent_id)
        return self._default_sampling[agent_id]

    def set_sampling(self, agent_id: str, params: SamplingParams) -> None:
        """Set the agent's default sampling parameters."""
        self._check_agent(agent_id)
        self._default_sampling[agent_id] = params

    def policy_version(self, agent_id: str) -> int:
        """Return the version of the weights the agent currently samples with (0 before any update)."""
        self._check_agent(agent_id)
        return self._versions[agent_id]

    def _check_agent(self, agent_id: str) -> None:
        if agent_id not in self._versions:
            raise NotFoundError(f"unknown agent {agent_id!r}; this engine serves {self._agent_ids}")

    def _check_version(self, agent_id: str, policy_version: int) -> None:
        """Reject a version older than the current one (an out-of-order sync would serve stale weights)."""
        self._check_agent(agent_id)
        if not isinstance(policy_version, int) or policy_version < 0:
            raise InvalidArgumentError(f"policy_version must be an int >= 0, got {policy_version!r}")
        if policy_version < self._versions[agent_id]:
            raise FailedPreconditionError(
                f"agent {agent_id!r}: policy_version {policy_version} is older than the engine's "
                f"{self._versions[agent_id]}"
            )

    @abc.abstractmethod
    def generate(
        self, agent_id: str, prompts: Sequence[Prompt], sampling: SamplingParams | None = None
    ) -> list[Generation]:
        """Generate one response per prompt with the agent's current weights.

        Args:
            agent_id: Which agent's policy samples.
            prompts: B prompts, each token ids, a chat conversation (the chat template is applied with a
                generation prompt), or raw text.
            sampling: Overrides the agent's default sampling parameters.

        Returns:
            B generations in prompt order.

        Raises:
            NotFoundError: Unknown agent.
            InvalidArgumentError: Empty prompt, or prompt plus ``max_new_tokens`` beyond ``max_model_len``.
        """

    @abc.abstractmethod
    def update_weights(self, agent_id: str, weights: Mapping[str, torch.Tensor], policy_version: int) -> None:
        """Load new weights for an agent and tag them with ``policy_version``.

        Args:
            agent_id: Agent to update (agents sharing one model are all updated and all get the version).
            weights: Full or partial state dict of the agent's model, or the agent's LoRA adapter weights
                (``peft.get_peft_model_state_dict`` keys) for adapter agents.
            policy_version: New version, >= the current one.

        Raises:
            NotFoundError: Unknown agent.
            InvalidArgumentError: A key the model lacks, or a shape mismatch (named).
            FailedPreconditionError: ``policy_version`` is older than the current one.
        """


def special_texts(tokenizer: Any) -> list[str]:
    """The texts of the tokenizer's special added tokens (``<|im_start|>``, ``<|endoftext|>``, ...); ``[]`` for a
    tokenizer without ``added_tokens_decoder``. Used where user text must not be read as chat markup (here and
    :mod:`services.trainer.rollout.serving.chat_tail`)."""
    added = getattr(tokenizer, "added_tokens_decoder", None)
    if not isinstance(added, Mapping):
        return []
    return [t.content for t in added.values() if getattr(t, "special", False) and getattr(t, "content", "")]


def _encode(tokenizer: Any, text: str, *, as_text: bool) -> list[int]:
    """Token ids of ``text`` without BOS/EOS; ``as_text``: special-token texts in it are split like plain text."""
    if not text:
        return []
    kwargs = {"split_special_tokens": True} if as_text else {}
    return [int(t) for t in tokenizer(text, add_special_tokens=False, **kwargs)["input_ids"]]


def _chat_ids_with_plain_contents(
    tokenizer: Any, messages: ChatMessages, risky: set[int], extra: Mapping[str, Any]
) -> list[int]:
    """The chat template's token ids where the contents of messages ``risky`` are tokenised as plain text.

    The template is rendered once with a unique placeholder for each of those contents; the text between
    placeholders (the template's own markup) is tokenised as usual, so its control tokens stay, and each
    content with special tokens split (``split_special_tokens``). The pieces must rebuild the template's real
    rendering exactly, or the template does something with the content itself and the prompt is refused.
    """
    tag = uuid.uuid4().hex
    marks = {f"\ue000{tag}:{i}\ue001": i for i in risky}
    shaped = [
        {**m, "content": next(k for k, i in marks.items() if i == j)} if j in risky else m
        for j, m in enumerate(messages)
    ]
    real = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **extra)
    skeleton = tokenizer.apply_chat_template(shaped, add_generation_prompt=True, tokenize=False, **extra)
    pieces = re.split("(" + "|".join(re.escape(k) for k in marks) + ")", skeleton)
    ids: list[int] = []
    rebuilt = []
    for k, piece in enumerate(pieces):
        if k % 2:  # a placeholder: the message's content, as text
            content = messages[marks[piece]]["content"]
            ids += _encode(tokenizer, content, as_text=True)
            rebuilt.append(content)
        else:
            ids += _encode(tokenizer, piece, as_text=False)
            rebuilt.append(piece)
    if "".join(rebuilt) != real:
        raise InvalidArgumentError(
            "a message's content contains the text of a special token (e.g. '<|im_start|>'), which is tokenised "
            "as plain text, never as the control token; but this model's chat template changes such content "
            "while rendering it, so the content cannot be kept apart: remove the special-token text"
        )
    return ids


def chat_to_ids(
    tokenizer: Any, messages: ChatMessages, tools: Sequence[dict[str, Any]] | None = None
) -> list[int]:
    """Apply the tokenizer's chat template with a generation prompt (and ``tools``, OpenAI function tool specs,
    when given) and return token ids.

    Message contents are text, never control tokens: a content holding the text of a special token
    (``<|im_start|>`` typed by a user) is tokenised with special tokens split (``split_special_tokens``), while
    the template's own markup keeps its control tokens. Prompts without such text are tokenised exactly as
    ``apply_chat_template`` does.

    Raises:
        InvalidArgumentError: ``messages`` is not a non-empty list of ``{"role", "content"}`` dicts; or a
            content holds special-token text and the chat template alters it while rendering (it cannot be
            tokenised safely).
    """
    if not messages or not all(isinstance(m, dict) and "role" in m and "content" in m for m in messages):
        raise InvalidArgumentError(
            f"chat messages must be dicts with 'role' and 'content', got {messages!r:.200}"
        )
    specials = special_texts(tokenizer)
    risky = {
        i
        for i, m in enumerate(messages)
        if isinstance(m["content"], str) and any(s in m["content"] for s in specials)
    }
    extra = {"tools": list(tools)} if tools else {}
    if risky:
        return _chat_ids_with_plain_contents(tokenizer, messages, risky, extra)
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **extra
    )
    if isinstance(out, Mapping):
        out = out["input_ids"]
    return [int(t) for t in out]


def chats_to_ids(tokenizer: Any, chats: Sequence[ChatMessages]) -> list[list[int]]:
    """:func:`chat_to_ids` of each chat (no tools), the chats without special-token text in one batched
    ``apply_chat_template`` call (the same ids: the template rendered, then tokenised), the others one by one.

    Raises:
        InvalidArgumentError: As :func:`chat_to_ids`, for the first chat it refuses.
    """
    specials = special_texts(tokenizer)

    def is_plain(chat: ChatMessages) -> bool:  # what chat_to_ids tokenises with apply_chat_template as it is
        return bool(chat) and all(
            isinstance(m, dict)
            and "role" in m
            and "content" in m
            and not (isinstance(m["content"], str) and any(s in m["content"] for s in specials))
            for m in chat
        )

    plain = [i for i, chat in enumerate(chats) if is_plain(chat)]
    out: list[list[int] | None] = [None] * len(chats)
    if plain:
        batch = tokenizer.apply_chat_template(
            [list(chats[i]) for i in plain], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(batch, Mapping):
            batch = batch["input_ids"]
        for i, ids in zip(plain, batch, strict=True):
            out[i] = [int(t) for t in ids]
    return [ids if ids is not None else chat_to_ids(tokenizer, chats[i]) for i, ids in enumerate(out)]


#: The ``metadata`` keys of :func:`check_room`'s error: they travel with it (a Ray actor's error too, whose
#: message also holds the actor's traceback), so the caller reads the prompt's position from them.
TOO_LONG_KEYS = ("prompt_index", "prompt_tokens", "max_new_tokens", "max_model_len")


def check_room(ids: Sequence[Sequence[int]], max_new_tokens: int, max_model_len: int) -> None:
    """Refuse a generate call with a prompt whose tokens plus ``max_new_tokens`` exceed ``max_model_len`` (every
    engine's check).

    Raises:
        InvalidArgumentError: ``prompt I: N tokens + max_new_tokens M exceeds max_model_len L`` for the first
            such prompt, ``I`` its position in the call, the four numbers also in its ``metadata``
            (:data:`TOO_LONG_KEYS`; :func:`too_long_prompt` reads them).
    """
    for i, p in enumerate(ids):
        if len(p) + max_new_tokens > max_model_len:
            raise _too_long(i, len(p), max_new_tokens, max_model_len)


def _too_long(position: int, tokens: int, max_new_tokens: int, max_model_len: int) -> InvalidArgumentError:
    """The error :func:`check_room` raises."""
    return InvalidArgumentError(
        f"prompt {position}: {tokens} tokens + max_new_tokens {max_new_tokens} exceeds max_model_len {max_model_len}",
        metadata=dict(zip(TOO_LONG_KEYS, (position, tokens, max_new_tokens, max_model_len), strict=True)),
    )


def _too_long_numbers(exc: BaseException) -> list[int] | None:
    """The :data:`TOO_LONG_KEYS` numbers of a :func:`check_room` error (also one re-raised from a Ray actor),
    else None."""
    meta = getattr(exc, "metadata", None) if isinstance(exc, InvalidArgumentError) else None
    if not meta or any(k not in meta for k in TOO_LONG_KEYS):
        return None
    return [int(meta[k]) for k in TOO_LONG_KEYS]


def too_long_prompt(exc: BaseException) -> int | None:
    """The position in its call of the prompt a :func:`check_room` error names (also when the error was raised
    in a Ray actor), or None for any other exception."""
    numbers = _too_long_numbers(exc)
    return numbers[0] if numbers else None


def shifted(exc: BaseException, offset: int) -> BaseException:
    """A :func:`check_room` error of a call on a chunk of prompts that starts at ``offset`` of the whole call,
    as the whole call's (the position plus ``offset``, without a wrapping Ray traceback); any other exception
    unchanged. (The prompts of one call are split among engines and rollout actors.)"""
    numbers = _too_long_numbers(exc)
    if numbers is None:
        return exc
    i, n, m, limit = numbers
    return _too_long(i + offset, n, m, limit)


def normalise_prompts(tokenizer: Any, prompts: Sequence[Prompt], vocab_size: int) -> list[list[int]]:
    """Turn every prompt into a non-empty list of valid token ids.

    Args:
        tokenizer: Used for chat conversations and raw text.
        prompts: See :meth:`RolloutEngine.generate`.
        vocab_size: Ids must lie in ``[0, vocab_size)``.

    Raises:
        InvalidArgumentError: No prompts, an empty prompt, or an id out of range (index and value named).
    """
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise InvalidArgumentError(f"prompts must be a non-empty list, got {type(prompts).__name__}")
    out: list[list[int]] = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            ids = list(tokenizer(p, add_special_tokens=False)["input_ids"])
        elif isinstance(p, Sequence) and p and isinstance(p[0], dict):
            ids = chat_to_ids(tokenizer, list(p))  # type: ignore[arg-type]
        else:
            ids = [int(t) for t in p]
        if not ids:
            raise InvalidArgumentError(f"prompt {i} is empty")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise InvalidArgumentError(f"prompt {i} has token id {bad[0]} outside [0, {vocab_size})")
        out.append(ids)
    return out
