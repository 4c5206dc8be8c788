"""What the gateway serves from: the policies of a running job, behind one small interface."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

from marti.types.inference import ChatMessages, Generation, SamplingParams


class InferenceBackend(abc.ABC):
    """The agents' policies as the gateway sees them (the trainer implements it over its rollout engines).

    ``generate`` is blocking and may be slow; the gateway calls it from a worker thread, one batch at a time.
    """

    @abc.abstractmethod
    def agents(self) -> list[str]:
        """The agent ids served, in config order (each is a model name of the OpenAI API)."""

    @abc.abstractmethod
    def versions(self) -> dict[str, int]:
        """Per agent, the policy version new requests are served with."""

    @abc.abstractmethod
    def resident_versions(self, agent: str) -> list[int]:
        """Versions of ``agent`` that can be requested as ``agent@VERSION``, ascending (the current included).

        Raises:
            NotFoundError: Unknown agent.
        """

    @abc.abstractmethod
    def chat_prompt(
        self, agent: str, messages: ChatMessages, tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """Token ids of a conversation under the agent's own chat template, with the generation prompt.

        Args:
            agent: The agent.
            messages: Hugging Face chat-template messages (assistant ``tool_calls`` and ``tool`` results included).
            tools: OpenAI function tool specs, passed to the template as ``tools``; only given when
                :meth:`renders_tools` is True (the gateway renders them into ``messages`` otherwise).

        Raises:
            InvalidArgumentError: Malformed messages.
        """

    def renders_tools(self, agent: str) -> bool:
        """Whether the agent's chat template renders tools, tool calls and tool results itself (it reads the
        ``tools`` variable). False here: a backend without a template that does gets the gateway's fallback
        format (:func:`services.gateway.core.tools.render.fallback_messages`)."""
        return False

    def chat_tail(
        self,
        agent: str,
        messages: ChatMessages,
        k: int,
        end_id: int,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int] | None:
        """The token ids the agent's chat template renders after assistant message ``k``, whose reply ended with
        token ``end_id``, through the generation prompt after the last message: what the gateway appends to that
        reply's exact ids (:mod:`services.gateway.core.transcript`). ``messages`` and ``tools`` are as for
        :meth:`chat_prompt`.

        Returns:
            The ids, or None when the tail cannot be cut exactly (``end_id`` did not end a turn, the template
            rewrites earlier turns, ...): the gateway then renders the whole prompt. None here: a backend without
            a text-level chat template always renders whole prompts.
        """
        return None

    @abc.abstractmethod
    def encode(self, agent: str, text: str) -> list[int]:
        """Token ids of raw text with the agent's tokenizer (no special tokens added)."""

    @abc.abstractmethod
    def token_texts(self, agent: str, ids: Sequence[int]) -> list[str]:
        """Each token's own text (special tokens included), one string per id, for log-probs and streams."""

    @abc.abstractmethod
    def decode(self, agent: str, ids: Sequence[int]) -> str:
        """The text of ``ids`` without special tokens (what a response's ``text`` is)."""

    @abc.abstractmethod
    def vocab_size(self, agent: str) -> int:
        """Token ids the agent's tokenizer knows: valid ids are ``[0, vocab_size)``."""

    @abc.abstractmethod
    def max_model_len(self, agent: str) -> int:
        """Most prompt-plus-response tokens the agent's model accepts."""

    @abc.abstractmethod
    def generate(
        self, agent: str, prompts: Sequence[list[int]], sampling: SamplingParams, version: int | None
    ) -> list[Generation]:
        """Sample one response per prompt (B prompts of token ids) with the agent's policy.

        The batch's version is fixed when it starts on the engine, before sampling (``None``: the version current
        then), and the weights that sample it are that version's until it ends (a weight sync waits for it).

        Args:
            agent: The agent.
            prompts: B prompts, token ids.
            sampling: Sampling parameters of the whole batch.
            version: A resident version to sample with, or None for the current one.

        Returns:
            B generations in order, each recording the version that produced it.

        Raises:
            NotFoundError: Unknown agent, or ``version`` not resident (any more).
            InvalidArgumentError: A prompt plus ``max_new_tokens`` beyond the model's length.
            AbortedError: The weights changed while the batch sampled (a sync that skipped the engine's lock).
        """
