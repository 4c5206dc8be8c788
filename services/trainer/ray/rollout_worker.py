"""Rollout actors: Ray actors that only generate, each with its own copy of the team's models.

With ``ray.num_rollout_workers: N >= 1`` the trainer starts N :class:`RolloutWorker` actors (one bundle each,
``ray.num_cpus_per_worker`` CPUs and ``ray.num_gpus_per_worker`` GPUs) next to the policy actors. Every
generate call of the loop is split across them in contiguous chunks and the answers are joined in order
(:meth:`~services.trainer.ray.runtime.RayRuntime.generate`); the policy actors then only train. After each
update the policy actor's new weights (the adapter in ``lora`` mode, else the whole state dict) go to every
rollout actor under the new policy version, and at start and after a checkpoint load every agent is synced, so
rollout actors always sample the learner's current weights (or, with asynchronous rollouts, weights at most
``rollout.max_staleness`` versions old).

A rollout actor holds the same policy layout as the team (``per_agent``, ``shared`` or ``lora``) without
references or optimizers, and its engine is the one ``rollout.engine`` names (vLLM on GPU when installed).
Each actor seeds its sampler with ``seed + 1000 * (index + 1)``, so the samples of a group split across actors
are not copies of each other. Each gets only its part of the config, built on the driver:
:class:`RolloutActorConfig` (:func:`rollout_actor_config`).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from marti.config import TrainConfig
from marti.errors import InvalidArgumentError
from services.trainer.job.run.checkpoint import load_rng_state, save_rng_state
from services.trainer.models.policy import MultiAgentPolicy, PolicyLayout
from services.trainer.ray.actor_setup import ActorConfig, actor_setup
from services.trainer.ray.policy_worker import policy_layout
from services.trainer.rollout.engines.base import Generation, SamplingParams
from services.trainer.rollout.engines.generation import (
    GenerationConfig,
    ResidentWeights,
    build_rollout_engine,
    engine_max_model_len,
    generate_turns,
    generation_config,
    resident_versions,
    serve_generations,
)

#: Offset between the sampling seeds of consecutive rollout actors.
SEED_STRIDE = 1000


@dataclasses.dataclass(frozen=True)
class RolloutActorConfig(ActorConfig):
    """A rollout actor's part of the training config, built on the driver by :func:`rollout_actor_config`.

    Attributes:
        layout: The team's policy layout without references or gradient checkpointing (it would turn off the
            shared-prompt prefill).
        generation: Its engine and every agent's sampling (:class:`~services.trainer.rollout.engines.generation.GenerationConfig`).
        resident_versions: Weight versions per agent kept servable for the inference gateway's
            ``agent@VERSION`` calls (``gateway.resident_versions``); 1 (only the current one) without the gateway.
    """

    layout: PolicyLayout
    generation: GenerationConfig
    resident_versions: int


def rollout_actor_config(cfg: TrainConfig) -> RolloutActorConfig:
    """The :class:`RolloutActorConfig` of a training config."""
    layout = dataclasses.replace(policy_layout(cfg), keep_reference=False, gradient_checkpointing=False)
    keep = cfg.gateway_resident_versions if cfg.gateway.enabled else 1
    return RolloutActorConfig(cfg.seed, cfg.device, layout, generation_config(cfg), keep)


class RolloutWorker:
    """Generates the team's turns with a synced copy of its policies (a Ray actor).

    Args:
        config: Its part of the training config (:func:`rollout_actor_config`, built on the driver).
        index: This actor's position among the rollout actors (seeds its sampler).
        num_threads: torch intra-op threads; ``None`` keeps torch's default.

    Raises:
        InvalidArgumentError: ``config`` is not a :class:`RolloutActorConfig` (a whole training config, say).
        NotFoundError: a model is not available locally (named, with the places looked).
    """

    def __init__(self, config: RolloutActorConfig, index: int = 0, num_threads: int | None = None) -> None:
        if not isinstance(config, RolloutActorConfig):
            raise InvalidArgumentError(
                f"config must be a RolloutActorConfig (rollout_actor_config(cfg)), got {type(config).__name__}"
            )
        self.cfg, self.device = actor_setup(config, num_threads)
        self.index = index
        torch.manual_seed(self.cfg.seed + SEED_STRIDE * (index + 1))
        self.policy = MultiAgentPolicy(self.cfg.layout, device=self.device)
        self.policy.train(False)
        self.agents = self.policy.agent_ids
        self._lock = threading.Lock()
        self.engine = build_rollout_engine(
            self.cfg.generation, self.policy, self.agents, self.device, copy_weights=False
        )
        # With the inference gateway, rollout actors serve its calls: the last gateway.resident_versions synced
        # weights of every agent are kept (CPU copies) for agent@VERSION calls.
        self.resident: ResidentWeights | None = None
        keep = self.cfg.resident_versions  # 1: only the current version, which needs no copy
        if callable(getattr(self.engine, "pinned", None)) and keep > 1:  # not vLLM
            self.resident = ResidentWeights(keep)
            for agent in self.agents:
                self.resident.remember([agent], self.policy.version(agent), self.policy.state_for_sync(agent))

    def generate(
        self,
        agent_id: str,
        chats: list[list[dict[str, str]]],
        greedy: bool = False,
        reply_starts: list[str] | None = None,
    ) -> list[Generation]:
        """Generate one response per chat prompt, each reply prefilled with the agent's ``response_prefix`` and
        its reply start (see :func:`~services.trainer.rollout.engines.generation.generate_turns`)."""
        return generate_turns(
            self.cfg.generation, self.policy, self.engine, self._lock, agent_id, chats, greedy, reply_starts
        )

    def update_weights(self, agent_id: str, weights: Mapping[str, torch.Tensor], policy_version: int) -> int:
        """Load an agent's new weights (adapter or state dict, as the policy actor's ``weights_for_sync``
        returns them) under ``policy_version``; returns the version.

        Raises:
            InvalidArgumentError: a key or shape the model lacks (named).
            FailedPreconditionError: ``policy_version`` is older than the one served.
        """
        with self._lock:
            self.engine.update_weights(agent_id, weights, policy_version)
            if self.resident is not None:
                unit = self.policy.unit_of(agent_id)
                sharers = [a for a in self.agents if self.policy.unit_of(a) == unit]
                self.resident.remember(sharers, policy_version, weights)
        return policy_version

    def serve(
        self, agent_id: str, prompts: list[list[int]], sampling: SamplingParams, version: int | None = None
    ) -> list[Generation]:
        """The inference-gateway call of :meth:`~services.trainer.ray.policy_worker.PolicyWorker.serve` (same
        arguments, result and errors), on this rollout actor's engine and resident versions."""
        return serve_generations(self.engine, self._lock, self.resident, agent_id, prompts, sampling, version)

    def serving_state(self) -> dict[str, dict[str, Any]]:
        """What the gateway's backend mirrors, per agent: ``versions`` (current), ``resident`` (servable
        versions, ascending) and ``max_model_len`` (prompt plus response tokens)."""
        with self._lock:
            return {
                "versions": {a: self.engine.policy_version(a) for a in self.agents},
                "resident": {a: resident_versions(self.engine, self.resident, a) for a in self.agents},
                "max_model_len": {a: engine_max_model_len(self.engine, a) for a in self.agents},
            }

    def versions(self) -> dict[str, int]:
        """The policy version each agent samples with."""
        return {a: self.engine.policy_version(a) for a in self.agents}

    def save(self, path: str) -> str:
        """Save this actor's sampler state (Python, numpy, torch and CUDA RNG: :func:`~services.trainer.
        checkpoint.save_rng_state`) to the file ``path``; returns it. Its weights are the policy actors' and are
        not saved again."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_rng_state(path)
        return path

    def load(self, path: str) -> bool:
        """Restore the sampler state :meth:`save` wrote (the weights come from the next sync).

        Returns:
            True if restored; False if ``path`` does not exist (a checkpoint from a run with fewer rollout
            actors): the sampler keeps its seeded state.
        """
        if not Path(path).exists():
            return False
        load_rng_state(path)
        return True

    def ping(self) -> dict[str, Any]:
        """Liveness and placement info: pid, device, torch's intra-op threads, index and versions."""
        return {
            "pid": os.getpid(),
            "device": self.device,
            "torch_threads": torch.get_num_threads(),
            "index": self.index,
            "versions": self.versions(),
        }
