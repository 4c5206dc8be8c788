"""The inference gateway's backend over a rollout engine in this process.

:class:`EngineBackend` serves a :class:`~services.trainer.rollout.base.RolloutEngine` (transformers or vLLM) and
the agents' tokenizers to :class:`services.gateway.core.gateway.Gateway`: chat prompts use each agent's own
tokenizer's chat template, and every engine call takes the lock that weight syncs take, so a call in flight when
an update lands finishes on the version it started with.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from marti.inference import ChatMessages, Generation, SamplingParams
from services.gateway.core.backend import InferenceBackend
from services.trainer.rollout.base import RolloutEngine, chat_to_ids


class EngineBackend(InferenceBackend):
    """Serves an engine's agents.

    Args:
        engine: The rollout engine (it owns the weights and their versions).
        tokenizers: agent -> its tokenizer (chat template and text encoding).
        lock: Held around every engine call; the owner's weight syncs must take it too. None = a new lock.
    """

    def __init__(
        self, engine: RolloutEngine, tokenizers: Mapping[str, Any], lock: threading.Lock | None = None
    ) -> None:
        self.engine = engine
        self.tokenizers = dict(tokenizers)
        self.lock = lock or threading.Lock()

    def agents(self) -> list[str]:
        """The engine's agents, in its order."""
        return self.engine.agent_ids

    def versions(self) -> dict[str, int]:
        """Each agent's current policy version."""
        return {a: self.engine.policy_version(a) for a in self.engine.agent_ids}

    def resident_versions(self, agent: str) -> list[int]:
        """Only the current version is resident in a plain engine."""
        return [self.engine.policy_version(agent)]

    def chat_prompt(self, agent: str, messages: ChatMessages) -> list[int]:
        """The agent's chat template over ``messages``, with the generation prompt."""
        return chat_to_ids(self.tokenizers[agent], messages)

    def encode(self, agent: str, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return list(self.tokenizers[agent](text, add_special_tokens=False)["input_ids"])

    def max_model_len(self, agent: str) -> int:
        """The engine's prompt-plus-response limit for the agent."""
        return int(self.engine.max_model_len(agent))  # type: ignore[attr-defined]

    def generate(
        self, agent: str, prompts: Sequence[list[int]], sampling: SamplingParams, version: int | None
    ) -> list[Generation]:
        """One engine call under the lock (see :meth:`InferenceBackend.generate`).

        Raises:
            NotFoundError: ``version`` is not the current one (a plain engine keeps no older versions).
        """
        from marti.errors import NotFoundError

        with self.lock, torch.no_grad():
            current = self.engine.policy_version(agent)
            if version is not None and version != current:
                raise NotFoundError(f"version {version} of {agent!r} is not resident (current: {current})")
            return self.engine.generate(agent, list(prompts), sampling)
