"""The inference gateway's backends: what :class:`services.gateway.core.gateway.Gateway` serves from.

- :class:`TrainerBackend` serves the policies of a running training job: each call goes to the agent's policy
  actor (or, with ``ray.num_rollout_workers``, a rollout actor) through
  :meth:`~services.trainer.ray.runtime.RayRuntime.serve`, which samples under the actor's engine lock with the
  caller's sampling parameters; an ``agent@VERSION`` call loads a resident older version for its duration. The
  agents' versions and resident versions are mirrored in this process (:meth:`TrainerBackend.refresh`, called by
  the training loop after every step's updates), so resolving a model name never waits for an actor that is busy
  training.
- :class:`EngineBackend` serves a :class:`~services.trainer.rollout.engines.base.RolloutEngine` in this process (tests,
  single-process serving).

Both use each agent's own tokenizer for chat templates, so agents on different base models each get theirs.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from marti.errors import NotFoundError
from marti.types.inference import ChatMessages, Generation, SamplingParams
from services.gateway.core.backend import InferenceBackend
from services.gateway.core.tools.render import template_supports_tools
from services.trainer.rollout.engines.base import RolloutEngine, chat_to_ids
from services.trainer.rollout.engines.generation import (
    ResidentWeights,
    engine_max_model_len,
    resident_versions,
    serve_generations,
)
from services.trainer.rollout.serving.chat_tail import chat_tail_ids


class _Tokenizers:
    """The text side both backends share: each agent's own tokenizer in ``self.tokenizers``."""

    tokenizers: dict[str, Any]

    def _tokenizer(self, agent: str) -> Any:
        tok = self.tokenizers.get(agent)
        if tok is None:
            raise NotFoundError(f"unknown agent {agent!r}; served: {sorted(self.tokenizers)}")
        return tok

    def chat_prompt(
        self, agent: str, messages: ChatMessages, tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """The agent's own chat template over ``messages`` (and ``tools``), with the generation prompt.

        Raises:
            NotFoundError: Unknown agent.
            InvalidArgumentError: Malformed messages.
        """
        return chat_to_ids(self._tokenizer(agent), messages, tools)

    def renders_tools(self, agent: str) -> bool:
        """Whether the agent's tokenizer's chat template reads ``tools``.

        Raises:
            NotFoundError: Unknown agent.
        """
        return template_supports_tools(getattr(self._tokenizer(agent), "chat_template", None))

    def chat_tail(
        self,
        agent: str,
        messages: ChatMessages,
        k: int,
        end_id: int,
        tools: Sequence[dict[str, Any]] | None = None,
    ) -> list[int] | None:
        """The template's ids after assistant message ``k`` (:func:`~services.trainer.rollout.serving.chat_tail.chat_tail_ids`)."""
        return chat_tail_ids(self._tokenizer(agent), messages, k, end_id, tools)

    def encode(self, agent: str, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return list(self._tokenizer(agent)(text, add_special_tokens=False)["input_ids"])

    def token_texts(self, agent: str, ids: Sequence[int]) -> list[str]:
        """Each token's own text (special tokens included)."""
        return list(self._tokenizer(agent).batch_decode([[int(i)] for i in ids]))

    def decode(self, agent: str, ids: Sequence[int]) -> str:
        """The text of ``ids`` without special tokens."""
        return str(self._tokenizer(agent).decode(list(ids), skip_special_tokens=True))

    def vocab_size(self, agent: str) -> int:
        """``len(tokenizer)``: ids the agent's tokenizer knows."""
        return len(self._tokenizer(agent))


class EngineBackend(_Tokenizers, InferenceBackend):
    """Serves an engine's agents in this process.

    Every engine call takes ``lock``, which the owner's weight syncs must take too, so a call in flight when an
    update lands finishes on the version it started with.

    Args:
        engine: The rollout engine (it owns the weights and their versions).
        tokenizers: agent -> its tokenizer (chat template and text encoding).
        lock: Held around every engine call; the owner's weight syncs must take it too. None = a new lock.
        resident: Older versions servable as ``agent@VERSION`` (the owner remembers each synced payload in it
            under ``lock``); None = only the current version.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizers: Mapping[str, Any],
        lock: threading.Lock | None = None,
        resident: ResidentWeights | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizers = dict(tokenizers)
        self.lock = lock or threading.Lock()
        self.resident = resident

    def agents(self) -> list[str]:
        """The engine's agents, in its order."""
        return self.engine.agent_ids

    def versions(self) -> dict[str, int]:
        """Each agent's current policy version."""
        return {a: self.engine.policy_version(a) for a in self.engine.agent_ids}

    def resident_versions(self, agent: str) -> list[int]:
        """The current version plus the resident older ones, ascending.

        Raises:
            NotFoundError: Unknown agent.
        """
        return resident_versions(self.engine, self.resident, agent)

    def max_model_len(self, agent: str) -> int:
        """The engine's prompt-plus-response limit for the agent, in tokens."""
        return engine_max_model_len(self.engine, agent)

    def generate(
        self, agent: str, prompts: Sequence[list[int]], sampling: SamplingParams, version: int | None
    ) -> list[Generation]:
        """One engine call under the lock (see :meth:`InferenceBackend.generate` and
        :func:`~services.trainer.rollout.engines.generation.serve_generations`).

        Raises:
            NotFoundError: Unknown agent, or ``version`` is not resident.
            InvalidArgumentError: A prompt plus ``max_new_tokens`` beyond the model's length.
        """
        return serve_generations(self.engine, self.lock, self.resident, agent, prompts, sampling, version)


class TrainerBackend(_Tokenizers, InferenceBackend):
    """Serves the policies of a running job (its :class:`~services.trainer.ray.runtime.RayRuntime`).

    Args:
        runtime: The job's started runtime (``serve`` and ``serving_state``).
        agents: The served agents, in config order.
        tokenizers: agent -> its tokenizer (the agent's ``pretrain_model``'s, as its policy loads it).

    Raises:
        Whatever :meth:`refresh` raises (the actors are asked for their state once here).
    """

    def __init__(self, runtime: Any, agents: Sequence[str], tokenizers: Mapping[str, Any]) -> None:
        missing = [a for a in agents if a not in tokenizers]
        if missing:
            raise NotFoundError(f"no tokenizer for agent {missing[0]!r}")
        self.runtime = runtime
        self._agents = list(agents)
        self.tokenizers = dict(tokenizers)
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}
        self._resident: dict[str, list[int]] = {}
        self._max_len: dict[str, int] = {}
        self.refresh()

    @classmethod
    def for_job(cls, runtime: Any, cfg: Any) -> TrainerBackend:
        """The backend of a job: every agent of ``cfg`` (a :class:`~marti.config.TrainConfig`), each with the
        tokenizer of its own ``pretrain_model`` (loaded once per distinct model, offline).

        Raises:
            NotFoundError: A model's tokenizer is not available locally.
        """
        from services.trainer.models.loading import load_tokenizer

        by_model: dict[str, Any] = {}
        tokenizers = {}
        for a in cfg.agents:
            if a.pretrain_model not in by_model:
                by_model[a.pretrain_model] = load_tokenizer(a.pretrain_model)
            tokenizers[a.name] = by_model[a.pretrain_model]
        return cls(runtime, [a.name for a in cfg.agents], tokenizers)

    def refresh(self) -> dict[str, int]:
        """Mirror the serving actors' current and resident versions (call after weight syncs); returns the
        current versions. Blocks while an actor finishes a call in progress."""
        state = self.runtime.serving_state()
        with self._lock:
            self._versions = {a: int(state["versions"][a]) for a in self._agents}
            self._resident = {a: [int(v) for v in state["resident"][a]] for a in self._agents}
            self._max_len = {a: int(state["max_model_len"][a]) for a in self._agents}
            return dict(self._versions)

    def _check(self, agent: str) -> None:
        if agent not in self.tokenizers:
            raise NotFoundError(f"unknown agent {agent!r}; agents are {self._agents}")

    def agents(self) -> list[str]:
        """The job's agents, in config order."""
        return list(self._agents)

    def versions(self) -> dict[str, int]:
        """Each agent's current policy version (as of the last :meth:`refresh`)."""
        with self._lock:
            return dict(self._versions)

    def resident_versions(self, agent: str) -> list[int]:
        """Versions servable as ``agent@VERSION``, ascending (as of the last :meth:`refresh`; a version evicted
        since is refused by the actor with NotFoundError).

        Raises:
            NotFoundError: Unknown agent.
        """
        self._check(agent)
        with self._lock:
            return list(self._resident[agent])

    def max_model_len(self, agent: str) -> int:
        """The serving engine's prompt-plus-response limit for the agent, in tokens."""
        self._check(agent)
        with self._lock:
            return self._max_len[agent]

    def generate(
        self, agent: str, prompts: Sequence[list[int]], sampling: SamplingParams, version: int | None
    ) -> list[Generation]:
        """One call on the agent's serving actor (see :meth:`InferenceBackend.generate`); blocking.

        Raises:
            NotFoundError: Unknown agent, or ``version`` not resident (any more).
            InvalidArgumentError: A prompt plus ``max_new_tokens`` beyond the model's length.
        """
        self._check(agent)
        return self.runtime.serve(agent, [list(p) for p in prompts], sampling, version)
