"""Reference and critic actors of one agent, for ``ray.colocate_models: false``.

By default (``ray.colocate_models: true``) an agent's reference model (KL) and critic (GAE) live in its
:class:`~services.trainer.ray.policy_worker.PolicyWorker`. With the switch off, :class:`~services.trainer.ray.runtime.RayRuntime`
starts them as actors of their own, each on its own placement-group bundle:

- :class:`ReferenceWorker`: the agent's ``ref_model``, or its base model (``pretrain_model``, loaded with the seed
  the policy loads it with, so the very weights the policy started from), frozen and in eval mode; it serves the
  reference log-probabilities of a batch (kept on the CPU between batches with
  ``strategy.offload_reference_model``).
- :class:`CriticWorker`: the agent's critic (:func:`services.trainer.ray.policy_worker.build_agent_critic`) and its train
  engine; it serves the values of a batch and fits them to the GAE returns the policy's update computed
  (:func:`services.trainer.learn.learner.fit_values`, the same windows and clipped loss as the colocated critic).

Both collate the trajectories exactly as the policy worker does (:func:`services.trainer.learn.experience.collate`,
same padding), so row ``b``, column ``j`` of their outputs is response token ``j`` of row ``b`` there too.
Outputs leave the actor on the CPU.

Each actor gets only its part of the config, built on the driver: :class:`ReferenceActorConfig` (its frozen model
layout, the seed, the device, offloading; :func:`reference_actor_config`) and :class:`CriticActorConfig` (the
critic's model, seed and engine settings and the update's settings; :func:`critic_actor_config`).

Shapes: B rows (trained turns), A = the longest response (the batch's action width).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from marti.config import TrainConfig
from marti.errors import InvalidArgumentError
from marti.types.trajectory import Trajectory
from services.trainer.learn.experience import Experience, collate
from services.trainer.learn.learner import LearnerConfig, TrainableCritic, fit_values, pad_id_of
from services.trainer.models.loading import load_tokenizer
from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout
from services.trainer.ray.actor_setup import ActorConfig, actor_setup
from services.trainer.ray.policy_worker import (
    CriticSettings,
    base_model_seed,
    build_agent_critic,
    critic_settings,
    learner_config,
)


@dataclass(frozen=True)
class ReferenceActorConfig(ActorConfig):
    """A reference actor's part of the training config, built on the driver by :func:`reference_actor_config`.

    Attributes:
        agent: The agent whose reference model this is.
        pretrain_model: The agent's policy model: its tokenizer pads the batch, and the reference must share its
            vocabulary.
        layout: The one-agent, frozen layout of the reference model (``ref_model``, else the base model, seeded
            as the policy's base: :func:`~services.trainer.ray.policy_worker.base_model_seed`).
        offload: ``strategy.offload_reference_model``: the model lives on the CPU between calls.
    """

    agent: str
    pretrain_model: str
    layout: PolicyLayout
    offload: bool


def reference_actor_config(
    cfg: TrainConfig, agent: str, group: list[str] | None = None
) -> ReferenceActorConfig:
    """The narrow config of ``agent``'s reference actor.

    Args:
        cfg: The training config.
        agent: A trainable agent (a frozen agent's policy is its own reference).
        group: The agents of the policy actor that holds ``agent`` (their layout decides the base model's seed);
            ``None`` = the whole team.

    Raises:
        InvalidArgumentError: unknown agent.
    """
    a = cfg.agent(agent)
    offload = cfg.strategy.offload_reference_model
    layout = PolicyLayout(
        mode="per_agent",
        agents=(AgentSpec(agent, a.ref_model or a.pretrain_model, is_tuning=False),),
        seed=base_model_seed(cfg, agent, None if group is None else list(group)),
        keep_reference=False,
        attn_implementation=cfg.policy.attn_implementation,
        disable_dropout=cfg.policy.disable_dropout,
        init_on_gpu=cfg.strategy.init_on_gpu and not offload,
    )
    return ReferenceActorConfig(cfg.seed, cfg.device, agent, a.pretrain_model, layout, offload)


@dataclass(frozen=True)
class CriticActorConfig(ActorConfig):
    """A critic actor's part of the training config, built on the driver by :func:`critic_actor_config`.

    Attributes:
        agent: The trainable agent whose critic this is.
        pretrain_model: The agent's policy model (its tokenizer pads the batch).
        critic: The critic's model, seed and train engine settings
            (:class:`~services.trainer.ray.policy_worker.CriticSettings`).
        learner: The update's settings the critic is fitted with (micro-batches, accumulation, PPO epochs,
            value clipping: :func:`~services.trainer.ray.policy_worker.learner_config`).
    """

    agent: str
    pretrain_model: str
    critic: CriticSettings
    learner: LearnerConfig


def critic_actor_config(cfg: TrainConfig, agent: str, group: list[str] | None = None) -> CriticActorConfig:
    """The narrow config of ``agent``'s critic actor.

    Args:
        cfg: The training config.
        agent: A trainable agent.
        group: The agents of the policy actor that holds ``agent`` (their trainable agents seed the critic as the
            colocated layout would); ``None`` = the whole team.

    Raises:
        InvalidArgumentError: unknown agent, or an agent that does not train.
    """
    names = [a.name for a in cfg.agents] if group is None else list(group)
    trainable = [n for n in names if cfg.agent(n).is_tuning]
    if agent not in trainable:
        raise InvalidArgumentError(f"agent {agent!r} does not train (is_tuning: false) and has no critic")
    settings = critic_settings(cfg, agent, trainable)
    return CriticActorConfig(
        cfg.seed, cfg.device, agent, cfg.agent(agent).pretrain_model, settings, learner_config(cfg)
    )


class _AgentModelWorker:
    """What both actors share: the config, the device, the agent and its tokenizer (for padding); subclasses
    load their model in ``_load``."""

    kind = "model"

    def _start(self, config: Any, agent: str, pretrain_model: str, num_threads: int | None) -> None:
        self.cfg, self.device = actor_setup(config, num_threads)
        self.agent = agent
        self.tokenizer = load_tokenizer(pretrain_model)
        self._load()

    def _load(self) -> None:
        raise NotImplementedError

    def _batch(self, trajectories: list[Trajectory]) -> Experience:
        return collate(trajectories, self.agent, pad_id_of(self.tokenizer))

    def ping(self) -> dict[str, Any]:
        """Liveness and placement info: ``pid``, ``device``, ``torch_threads`` (torch's intra-op threads),
        ``agent`` and ``kind`` (reference / critic)."""
        return {
            "pid": os.getpid(),
            "device": self.device,
            "torch_threads": torch.get_num_threads(),
            "agent": self.agent,
            "kind": self.kind,
        }


class ReferenceWorker(_AgentModelWorker):
    """The frozen reference policy of one agent: its ``ref_model`` or base model, no gradients, eval mode.

    With ``strategy.offload_reference_model`` the model lives on the CPU and is moved to the actor's device
    only for each :meth:`ref_logprobs` call (:func:`~services.trainer.models.loading.offloaded`).

    Args:
        config: Its narrow config, built on the driver (:func:`reference_actor_config`).
        num_threads: torch intra-op threads; ``None`` keeps torch's default.

    Raises:
        NotFoundError: the agent's model is not available locally.
        InvalidArgumentError: ``config`` is not an actor config; the reference's vocabulary differs from the
            policy's.
    """

    kind = "reference"

    def __init__(self, config: ReferenceActorConfig, num_threads: int | None = None) -> None:
        self._start(config, config.agent, config.pretrain_model, num_threads)

    def _load(self) -> None:
        from services.trainer.models.loading import same_vocabulary

        same_vocabulary(self.cfg.pretrain_model, self.cfg.layout.agents[0].pretrain_model)
        self.offload = self.cfg.offload
        # a frozen agent: no grad, no copy; offloaded: kept on the CPU between calls
        self.model = MultiAgentPolicy(self.cfg.layout, device="cpu" if self.offload else self.device)
        self.model.train(False)

    def ref_logprobs(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """Log-probabilities of the batch's responses under the reference model.

        Args:
            trajectories: The agent's trajectories, as the policy worker receives them.

        Returns:
            (B, A) float32 on the CPU: entry ``[b, j]`` is the log-probability (nats) of response token ``j``
            of row ``b`` (0-padded past its length, where the action mask is False), aligned with the
            :attr:`~services.trainer.learn.experience.Experience.ref_logprobs` of the policy worker's batch.

        Raises:
            FailedPreconditionError: no trajectory has a turn with a prompt and a response.
        """
        from services.trainer.models.loading import offloaded

        batch = self._batch(trajectories)
        module = self.model.model(self.agent)
        place = offloaded(module, self.device, "cpu") if self.offload else contextlib.nullcontext()
        with torch.no_grad(), place:
            lp = self.model.ref_logprobs(self.agent, batch.input_ids, batch.attention_mask, batch.action_mask)
        return lp.cpu()


class CriticWorker(_AgentModelWorker):
    """The critic (value model) of one trainable agent and its train engine (PPO with GAE).

    Args:
        config: Its narrow config, built on the driver (:func:`critic_actor_config`).
        num_threads: torch intra-op threads; ``None`` keeps torch's default.

    Raises:
        NotFoundError: the critic's model is not available locally.
        InvalidArgumentError: ``config`` is not an actor config.
    """

    kind = "critic"

    def __init__(self, config: CriticActorConfig, num_threads: int | None = None) -> None:
        self._start(config, config.agent, config.pretrain_model, num_threads)

    def _load(self) -> None:
        self.critic, self.engine = build_agent_critic(self.cfg.critic, self.device)

    def values(self, trajectories: list[Trajectory]) -> torch.Tensor:
        """The critic's values of the batch's response tokens before the update (GAE's baseline).

        Args:
            trajectories: The agent's trajectories, as the policy worker receives them.

        Returns:
            (B, A) float32 on the CPU, in reward units (the batch's
            :attr:`~services.trainer.learn.experience.Experience.old_values`).

        Raises:
            FailedPreconditionError: no trajectory has a turn with a prompt and a response.
        """
        batch = self._batch(trajectories)
        with torch.no_grad():
            values = self.critic(batch.input_ids, batch.attention_mask, batch.action_mask.shape[1])
        return values.cpu()

    def fit(
        self, trajectories: list[Trajectory], old_values: torch.Tensor, returns: torch.Tensor
    ) -> dict[str, float]:
        """Fit the critic to the returns of the policy's update on the same trajectories.

        Runs :func:`services.trainer.learn.learner.fit_values` with the job's micro-batch size, gradient
        accumulation and PPO epochs (:func:`~services.trainer.ray.policy_worker.learner_config`): the windows and clipped
        value loss of the colocated critic.

        Args:
            trajectories: The trajectories the policy was updated on (B rows once collated).
            old_values: (B, A) float32, what :meth:`values` returned for them.
            returns: (B, A) float32 GAE returns from the policy's update.

        Returns:
            Means over the micro-batches: ``value_loss``, ``vf_clip_frac``, ``value_mean``.

        Raises:
            FloatingPointError: the value loss became NaN or infinite.
            InvalidArgumentError: ``old_values`` or ``returns`` is not (B, A).
        """
        batch = self._batch(trajectories).attach(old_values=old_values.to(self.device))
        self.critic.train(True)
        return fit_values(
            TrainableCritic(self.critic, self.engine),
            batch,
            self.cfg.learner,
            returns.to(self.device),
        )

    def save(self, path: str) -> str:
        """Checkpoint the critic's weights, optimizer, scheduler, counters and RNG under ``path``."""
        self.engine.save_checkpoint(Path(path))
        return path

    def load(self, path: str) -> None:
        """Restore a :meth:`save` checkpoint (exact resume).

        Raises:
            NotFoundError: a checkpoint file is missing.
            InvalidArgumentError: the saved weights do not match this critic.
        """
        self.engine.load_checkpoint(Path(path))
