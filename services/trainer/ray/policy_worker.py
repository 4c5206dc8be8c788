"""The policy worker: one team's policies, rollout engine and optimizers in one process (a Ray actor).

A worker holds a :class:`~services.trainer.models.policy.MultiAgentPolicy` (per-agent models, one shared model, or
LoRA adapters on one base), a rollout engine that samples from it, and one training strategy per trainable
weight set. The training loop drives it through four calls: :meth:`generate`, :meth:`train`, :meth:`save`,
:meth:`load`; the inference gateway calls :meth:`PolicyWorker.serve` (the caller's sampling parameters, the
current or a resident older version). With the transformers engine the engine samples from the policy's live
modules, so weight sync after an update is a version bump (unless asynchronous rollouts or the gateway make it
keep a copy); with vLLM the new weights are pushed to the engine
(:meth:`services.trainer.rollout.engines.base.RolloutEngine.update_weights`).

By default (``ray.colocate_models: true``) the worker also holds each trainable agent's reference policy (KL)
and critic (GAE). With ``false`` it holds neither: :meth:`PolicyWorker.train` takes the reference
log-probabilities and old values computed by the actors of :mod:`services.trainer.ray.model_workers` and reports
the returns their critic is fitted to. The builders both layouts share (:func:`build_strategy`,
:func:`build_agent_critic`, :func:`base_model_seed`) live here; the start every actor shares in
:mod:`services.trainer.ray.actor_setup`. The worker gets only its
part of the config, built on the driver: :class:`PolicyActorConfig` (:func:`policy_actor_config`).
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from marti.config import TrainConfig
from marti.errors import InvalidArgumentError
from marti.types.inference import SamplingParams
from marti.types.trajectory import Trajectory
from services.trainer.learn.algo.running_moments import RunningMoments
from services.trainer.learn.ema import EmaWeights
from services.trainer.learn.experience import collate
from services.trainer.learn.learner import (
    LearnerConfig,
    TrainableCritic,
    normalize_credit,
    pad_id_of,
    update_agent,
)
from services.trainer.models.policy import AgentSpec, LoraSettings, MultiAgentPolicy, PolicyLayout
from services.trainer.ray.actor_setup import ActorConfig, actor_setup
from services.trainer.ray.table_access import TableTaking
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
from services.trainer.strategy.base import OptimConfig


def learner_config(cfg: TrainConfig) -> LearnerConfig:
    """The learner's part of the config for one agent's updates: the ``algorithm`` section with
    ``micro_train_batch_size``, ``gradient_accumulation_steps``, ``algorithm.ppo_epochs`` and ``rollout.tis_cap``.

    Raises:
        InvalidArgumentError: a value :class:`~services.trainer.learn.learner.LearnerConfig` refuses.
    """
    return LearnerConfig(
        cfg.algorithm,
        micro_batch_size=cfg.micro_train_batch_size,
        grad_accum_steps=cfg.gradient_accumulation_steps,
        ppo_epochs=cfg.algorithm.ppo_epochs,
        tis_cap=cfg.rollout.tis_cap,
    )


def policy_layout(cfg: TrainConfig, agents: list[str] | None = None) -> PolicyLayout:
    """Build the policy layout from a training config (mode, agents, LoRA shape, seed).

    Args:
        cfg: The training config.
        agents: The subset of agents this policy holds (a per-agent Ray actor); ``None`` = every agent. The
            seed is offset by the first agent's position so each agent initialises as in a whole-team policy.
    """
    p = cfg.policy
    names = [a.name for a in cfg.agents] if agents is None else list(agents)
    first = [a.name for a in cfg.agents].index(names[0])
    return PolicyLayout(
        mode=cfg.policy_mode,
        agents=tuple(
            AgentSpec(a.name, a.pretrain_model, a.is_tuning, ref_model=a.ref_model)
            for a in cfg.agents
            if a.name in names
        ),
        lora=LoraSettings(
            r=p.lora_r,
            alpha=p.lora_alpha,
            dropout=p.lora_dropout,
            target_modules=tuple(p.lora_target_modules),
        ),
        seed=cfg.seed + first,
        gradient_checkpointing=p.gradient_checkpointing,
        keep_reference=cfg.algorithm.kl_coef > 0 and cfg.ray.colocate_models,
        share_prompt_prefix=p.share_prompt_prefix,
        attn_implementation=p.attn_implementation,
        disable_dropout=p.disable_dropout,
        init_on_gpu=cfg.strategy.init_on_gpu,
        offload_reference=cfg.strategy.offload_reference_model,
    )


def base_model_seed(cfg: TrainConfig, agent: str, group: list[str] | None = None) -> int:
    """The seed the policy of ``group`` loads ``agent``'s base model with (it sets tiny models' weights).

    Mirrors :class:`~services.trainer.models.policy.MultiAgentPolicy`: ``per_agent`` loads model ``i`` of the policy
    with ``seed + i``, ``shared`` and ``lora`` load the one base with the policy's seed. A reference actor
    loads its agent's base with this seed, so it holds exactly the policy's initial weights.

    Args:
        cfg: The training config.
        agent: The agent.
        group: The agents of the policy actor holding ``agent``; ``None`` = the whole team.
    """
    pc = policy_layout(cfg, group)
    names = [a.name for a in pc.agents]
    return pc.seed + names.index(agent) if pc.mode == "per_agent" else pc.seed


def steps_per_batch(cfg: TrainConfig) -> int:
    """Optimizer steps per agent per training step (for the LR schedule's length), >= 1."""
    turns_per_agent = -(-cfg.environment.max_turns // len(cfg.agents))
    samples = cfg.items_per_step * turns_per_agent
    micro = -(-samples // cfg.micro_train_batch_size)
    return max(1, -(-micro // cfg.gradient_accumulation_steps))


def critic_zero_stage(cfg: TrainConfig) -> int:
    """The critics' DeepSpeed ZeRO stage: ``strategy.critic_zero_stage``, or the policies' ``zero_stage`` when
    it is null (OpenRLHF's ``--critic_zero_stage`` beside ``--zero_stage``)."""
    sc = cfg.strategy
    return sc.zero_stage if sc.critic_zero_stage is None else sc.critic_zero_stage


def train_strategy(cfg: TrainConfig, zero_stage: int | None = None) -> Any:
    """The training strategy ``strategy.name`` names, not yet set up on a model (:func:`strategy_named`).

    Args:
        cfg: The training config (``strategy``, ``micro_train_batch_size``).
        zero_stage: DeepSpeed ZeRO stage; None: ``strategy.zero_stage`` (the policies'). Ignored by ``torch``.
    """
    sc = cfg.strategy
    stage = sc.zero_stage if zero_stage is None else zero_stage
    return strategy_named(sc.name, stage, cfg.micro_train_batch_size)


def strategy_named(name: str, zero_stage: int, micro_batch_size: int) -> Any:
    """A :class:`~services.trainer.strategy.torch_strategy.TorchStrategy` (``torch``) or a
    :class:`~services.trainer.strategy.deepspeed_strategy.DeepSpeedStrategy` (``deepspeed``) with ZeRO stage
    ``zero_stage`` and ``micro_batch_size`` rows per micro-batch, not yet set up on a model."""
    if name == "deepspeed":
        from services.trainer.strategy.deepspeed_strategy import DeepSpeedStrategy

        return DeepSpeedStrategy(zero_stage, micro_batch_size=micro_batch_size)
    from services.trainer.strategy.torch_strategy import TorchStrategy

    return TorchStrategy()


#: ``lr_scheduler`` (config) -> (the optimizer's schedule, floor as a fraction of the peak LR). The names and
#: ``cosine_with_min_lr``'s floor of 0.1 follow OpenRLHF (``lr_scheduler_kwargs={"min_lr": lr * 0.1}``); the
#: others decay to 0 as transformers' ``get_*_schedule_with_warmup`` do.
SCHEDULES: dict[str, tuple[str, float]] = {
    "cosine": ("cosine", 0.0),
    "cosine_with_min_lr": ("cosine", 0.1),
    "linear": ("linear", 0.0),
    "constant": ("constant", 0.0),
    "constant_with_warmup": ("constant", 0.0),
}


def optim_config(cfg: TrainConfig, agent: str, lr: float | None = None) -> OptimConfig:
    """The optimizer settings of one trainable weight set: ``strategy``, the LR schedule over
    ``total_steps * ppo_epochs * steps_per_batch`` optimizer steps (``total_steps``: ``max_steps``, or fewer when
    ``max_epochs`` passes over a finite problem set end the job first), and the agent's learning rate unless
    ``lr`` is given (the critic's ``algorithm.critic_learning_rate``)."""
    sc = cfg.strategy
    total = max(1, cfg.total_steps * cfg.algorithm.ppo_epochs * steps_per_batch(cfg))
    return OptimConfig(
        lr=lr or cfg.learning_rate_for(agent),
        weight_decay=sc.weight_decay,
        max_grad_norm=sc.grad_clip or None,
        grad_accum_steps=1,  # update_agent groups micro-batches (gradient_accumulation_steps) itself
        total_steps=total,
        warmup_steps=min(cfg.warmup_steps, total),
        lr_scheduler=SCHEDULES[cfg.lr_scheduler][0],
        min_lr_ratio=SCHEDULES[cfg.lr_scheduler][1],
        bf16=sc.bf16,
    )


def build_strategy(
    cfg: TrainConfig,
    agent: str,
    model: Any,
    params: Any,
    lr: float | None = None,
    zero_stage: int | None = None,
) -> Any:
    """Set up the train engine (torch or DeepSpeed, from ``strategy``) of one trainable weight set.

    Args:
        cfg: The training config (``strategy``, schedule, ``total_steps``, ``ppo_epochs``).
        agent: The agent whose learning rate applies when ``lr`` is None.
        model: The module trained.
        params: Its trainable parameters.
        lr: Learning rate override (the critic's ``algorithm.critic_learning_rate``).
        zero_stage: DeepSpeed ZeRO stage override (the critic's :func:`critic_zero_stage`); None: the policies'
            ``strategy.zero_stage``.

    Returns:
        A :class:`~services.trainer.strategy.base.TrainEngine` with the settings of :func:`optim_config`.

    Raises:
        InvalidArgumentError: no trainable parameters, or an invalid optimizer setting.
    """
    return train_strategy(cfg, zero_stage).setup(model, params, optim_config(cfg, agent, lr))


@dataclass(frozen=True)
class CriticSettings:
    """What building one agent's critic and its train engine takes (:func:`critic_settings` builds it from the
    config, on the driver for a critic actor).

    Attributes:
        model: ``critic_model``, else the agent's base model.
        seed: ``seed + 100 + i``, ``i`` the agent's position among the trainable agents of its policy actor.
        attn_implementation: ``policy.attn_implementation``.
        init_on_gpu: ``strategy.init_on_gpu``.
        disable_dropout: ``policy.disable_dropout``.
        optim: The critic's optimizer settings (:func:`optim_config` at ``algorithm.critic_learning_rate``).
        strategy: ``strategy.name``.
        zero_stage: :func:`critic_zero_stage`.
        micro_batch_size: ``micro_train_batch_size`` (DeepSpeed's micro-batch).
    """

    model: str
    seed: int
    attn_implementation: str | None
    init_on_gpu: bool
    disable_dropout: bool
    optim: OptimConfig
    strategy: str
    zero_stage: int
    micro_batch_size: int


def critic_settings(cfg: TrainConfig, agent: str, trainable: list[str]) -> CriticSettings:
    """The critic settings of ``agent``, a trainable agent of a policy actor whose trainable agents are
    ``trainable`` (they seed the critic)."""
    a = cfg.agent(agent)
    return CriticSettings(
        model=a.critic_model or a.pretrain_model,
        seed=cfg.seed + 100 + trainable.index(agent),
        attn_implementation=cfg.policy.attn_implementation,
        init_on_gpu=cfg.strategy.init_on_gpu,
        disable_dropout=cfg.policy.disable_dropout,
        optim=optim_config(cfg, agent, lr=cfg.algorithm.critic_learning_rate),
        strategy=cfg.strategy.name,
        zero_stage=critic_zero_stage(cfg),
        micro_batch_size=cfg.micro_train_batch_size,
    )


def build_agent_critic(settings: CriticSettings, device: str) -> tuple[Any, Any]:
    """The critic of one trainable agent (PPO with GAE) and its train engine.

    The critic loads ``settings.model`` (:func:`services.trainer.learn.critic.build_critic`) with ``settings.seed``
    (created on the device with ``strategy.init_on_gpu``, without dropout with ``policy.disable_dropout``), and
    trains with ``settings.optim`` under ZeRO stage ``settings.zero_stage`` (DeepSpeed).

    Args:
        settings: From :func:`critic_settings`.
        device: ``cpu`` or ``cuda``.

    Returns:
        ``(critic, engine)``: a :class:`~services.trainer.learn.critic.ValueModel` in train mode and its engine.

    Raises:
        NotFoundError: the critic's model is not available locally.
    """
    from services.trainer.learn.critic import build_critic
    from services.trainer.models.loading import construction_device

    critic = build_critic(
        settings.model,
        seed=settings.seed,
        device=device,
        attn_implementation=settings.attn_implementation,
        init_device=construction_device(settings.init_on_gpu, device),
        disable_dropout=settings.disable_dropout,
    )
    strategy = strategy_named(settings.strategy, settings.zero_stage, settings.micro_batch_size)
    engine = strategy.setup(critic, list(critic.parameters()), settings.optim)
    return critic, engine


@dataclass(frozen=True)
class PolicyActorConfig(ActorConfig):
    """A policy actor's part of the training config, built on the driver by :func:`policy_actor_config`.

    Attributes:
        agents: The agents this actor serves (one per actor in ``per_agent`` mode, else the team).
        layout: Their policy layout (:func:`policy_layout`).
        generation: Its rollout engine and the agents' sampling (:func:`generation_config`).
        engine: The engine it builds: ``hf`` with rollout actors (``ray.num_rollout_workers``: they generate, this
            engine samples with the live modules and costs no memory), else None (``rollout.engine``).
        engine_owns_weights: The engine samples from its own copy of the weights, synced after each update
            (asynchronous rollouts or the inference gateway, without rollout actors: it generates while an update
            runs in another thread).
        learner: The updates' settings (:func:`learner_config`; its ``algo`` is the ``algorithm`` section).
        optim: Per trainable agent, its optimizer settings (:func:`optim_config`).
        strategy: ``strategy.name``; ``zero_stage``: ``strategy.zero_stage``; ``micro_batch_size``:
            ``micro_train_batch_size`` (DeepSpeed's micro-batch).
        critics: Per trainable agent, its colocated critic's settings (GAE with ``ray.colocate_models``), else
            empty.
        ema_beta: ``policy.ema_beta`` with ``policy.ema``, else None (no moving average).
        resident_versions: Weight versions per agent kept servable for the inference gateway (when this actor
            serves it: gateway on, no rollout actors), else 1.
    """

    agents: tuple[str, ...]
    layout: PolicyLayout
    generation: GenerationConfig
    engine: str | None
    engine_owns_weights: bool
    learner: LearnerConfig
    optim: dict[str, OptimConfig]
    strategy: str
    zero_stage: int
    micro_batch_size: int
    critics: dict[str, CriticSettings]
    ema_beta: float | None
    resident_versions: int


def policy_actor_config(cfg: TrainConfig, agents: list[str] | None = None) -> PolicyActorConfig:
    """The :class:`PolicyActorConfig` of the actor serving ``agents`` (None: the team)."""
    names = tuple(a.name for a in cfg.agents) if agents is None else tuple(agents)
    trainable = [n for n in names if cfg.agent(n).is_tuning]
    rollout_actors = bool(cfg.ray.num_rollout_workers)
    gae = cfg.algorithm.advantage_estimator == "gae" and cfg.ray.colocate_models
    return PolicyActorConfig(
        cfg.seed,
        cfg.device,
        agents=names,
        layout=policy_layout(cfg, list(names)),
        generation=generation_config(cfg),
        engine="hf" if rollout_actors else None,
        engine_owns_weights=(cfg.rollout.max_staleness > 0 or cfg.gateway.enabled) and not rollout_actors,
        learner=learner_config(cfg),
        optim={a: optim_config(cfg, a) for a in trainable},
        strategy=cfg.strategy.name,
        zero_stage=cfg.strategy.zero_stage,
        micro_batch_size=cfg.micro_train_batch_size,
        critics={a: critic_settings(cfg, a, trainable) for a in trainable} if gae else {},
        ema_beta=cfg.policy.ema_beta if cfg.policy.ema else None,
        resident_versions=cfg.gateway_resident_versions if cfg.gateway.enabled and not rollout_actors else 1,
    )


class PolicyWorker(TableTaking):
    """Policies, rollout engine and strategies of a team; it takes its agents' batches from their tables itself
    (:class:`~services.trainer.ray.table_access.TableTaking`).

    Args:
        config: Its part of the training config (:func:`policy_actor_config`, built on the driver).
        num_threads: torch intra-op threads; ``None`` keeps torch's default.

    Raises:
        InvalidArgumentError: ``config`` is not a :class:`PolicyActorConfig` (a whole training config, say).
        NotFoundError: a model is not available locally (named, with the places looked).
    """

    def __init__(self, config: PolicyActorConfig, num_threads: int | None = None) -> None:
        if not isinstance(config, PolicyActorConfig):
            raise InvalidArgumentError(
                f"config must be a PolicyActorConfig (policy_actor_config(cfg)), got {type(config).__name__}"
            )
        self.cfg, self.device = actor_setup(config, num_threads)
        self.algo = self.cfg.learner.algo
        self.agents = list(self.cfg.agents)
        self.policy = MultiAgentPolicy(self.cfg.layout, device=self.device)
        # Asynchronous rollouts (rollout.max_staleness > 0) and inference-gateway calls (gateway.enabled) generate
        # while an update runs in another thread of this actor: the engine then samples from its own copy of the
        # weights, synced after each update. The lock keeps a sync from landing in the middle of a generate call
        # (engines are not thread-safe). With rollout actors, they generate and serve instead.
        self.engine_owns_weights = self.cfg.engine_owns_weights
        self._engine_lock = threading.Lock()
        self.generation = self.cfg.generation
        self.engine = build_rollout_engine(
            self.generation,
            self.policy,
            self.agents,
            self.device,
            copy_weights=self.engine_owns_weights,
            engine=self.cfg.engine,
        )
        # rollout.dtype other than the policy's (bf16 on the CPU): the engine samples with converted copies,
        # synced after each update, so it owns its weights whatever the colocation says
        self.engine_owns_weights = self.engine_owns_weights or getattr(
            self.engine, "samples_with_copies", False
        )
        self.strategies: dict[str, Any] = {}
        # policy.ema: an exponential moving average of each trained weight set, updated after every optimizer
        # step, evaluated with (generate(greedy=True)) and saved with checkpoints.
        self.ema: dict[str, EmaWeights] = {}
        if self.cfg.ema_beta is not None and not callable(getattr(self.engine, "pinned", None)):
            raise InvalidArgumentError(
                "policy.ema evaluates with the averaged weights through a transformers rollout engine; the "
                f"{type(self.engine).__name__} cannot load them for a call (set rollout.engine: hf or hf_static)"
            )
        for agent in self.policy.trainable_agents:
            unit = self.policy.unit_of(agent)
            if unit not in self.strategies:
                self.strategies[unit] = self._build_strategy(agent)
                if self.cfg.ema_beta is not None:
                    self.ema[unit] = self._build_ema(agent, self.strategies[unit])
        self.critics: dict[str, Any] = {}
        self.critic_engines: dict[str, Any] = {}
        for agent, settings in self.cfg.critics.items():
            critic, engine = build_agent_critic(settings, self.device)
            self.critics[agent], self.critic_engines[agent] = critic, engine
        self.data_position: dict[str, Any] = {"step": 0}
        # algorithm.normalize_reward: each agent's running reward moments (saved with the checkpoint).
        self.reward_moments: dict[str, RunningMoments] = {
            a: RunningMoments() for a in self.policy.trainable_agents
        }
        # The inference gateway's agent@VERSION calls: the last gateway.resident_versions synced weights of every
        # agent (CPU copies), when this actor serves (no rollout actors).
        self.resident: ResidentWeights | None = None
        pinnable = callable(getattr(self.engine, "pinned", None))  # the transformers engine, not vLLM
        keep = self.cfg.resident_versions  # 1: only the current version, which needs no copy
        if pinnable and keep > 1:
            self.resident = ResidentWeights(keep)
            with self._whole_weights():
                for agent in self.agents:
                    self.resident.remember(
                        [agent], self.policy.version(agent), self.policy.state_for_sync(agent)
                    )

    def _build_ema(self, agent: str, strategy: Any) -> EmaWeights:
        """The EMA of the weight set ``agent`` trains, updated after each optimizer step of ``strategy`` (whole
        weights: gathered first under ZeRO-3)."""
        with strategy.gathered():
            ema = EmaWeights(self.policy.named_parameters(agent), self.cfg.ema_beta)

        def update() -> None:
            with strategy.gathered():
                ema.update()

        strategy.add_step_hook(update)
        return ema

    def _build_strategy(self, agent: str) -> Any:
        """The train engine of the weight set ``agent`` trains (its model, adapter or the shared model)."""
        c = self.cfg
        strategy = strategy_named(c.strategy, c.zero_stage, c.micro_batch_size)
        return strategy.setup(self.policy.model(agent), self.policy.parameters(agent), c.optim[agent])

    # ------------------------------------------------------------------------------------------ rollouts
    def versions(self) -> dict[str, int]:
        """Policy version per agent (0 before any update)."""
        return {a: self.policy.version(a) for a in self.policy.agent_ids}

    def generate(
        self,
        agent_id: str,
        chats: list[list[dict[str, str]]],
        greedy: bool = False,
        reply_starts: list[str] | None = None,
    ) -> list[Any]:
        """Generate one response per chat prompt with the agent's current policy.

        A row's reply is prefilled with the agent's ``response_prefix`` and its reply start: the prompt is the
        chat template's output followed by their tokens, and each generation's ``text`` starts with them (their
        token ids stay in the prompt, so they are never trained; see
        :func:`~services.trainer.rollout.engines.generation.generate_turns`).

        Args:
            agent_id: The agent.
            chats: B chat conversations (system + user messages).
            greedy: Decode greedily (evaluation) instead of sampling.
            reply_starts: B texts each reply starts with after the ``response_prefix`` (``""``: none); None: none.

        Returns:
            B :class:`~services.trainer.rollout.engines.base.Generation` objects (token ids, logprobs, text).
        """
        if not self.engine_owns_weights:  # the engine samples with the live modules: no dropout
            self.policy.train(False)
        if greedy and agent_id in self.policy.trainable_agents and self.ema:
            return self._generate_with_ema(agent_id, chats, reply_starts)
        return generate_turns(
            self.generation,
            self.policy,
            self.engine,
            self._engine_lock,
            agent_id,
            chats,
            greedy,
            reply_starts,
        )

    def ema_weights_for_sync(self, agent_id: str) -> dict[str, torch.Tensor]:
        """The agent's weights as :meth:`MultiAgentPolicy.state_for_sync` gives them, with its trained parameters
        replaced by their exponential moving average (``policy.ema``); detached CPU copies.

        Raises:
            InvalidArgumentError: ``policy.ema`` is off, or the agent is not trained.
        """
        unit = self.policy.unit_of(agent_id)
        if unit not in self.ema or agent_id not in self.policy.trainable_agents:
            raise InvalidArgumentError(
                f"no EMA weights for agent {agent_id!r} (policy.ema off or a frozen agent)"
            )
        with self._whole_weights(), self.ema[unit].applied():
            return {k: v.detach().cpu().clone() for k, v in self.policy.state_for_sync(agent_id).items()}

    def _generate_with_ema(
        self, agent_id: str, chats: list[list[dict[str, str]]], reply_starts: list[str] | None = None
    ) -> list[Any]:
        """Evaluation turns (greedy) sampled with the agent's EMA weights for the call, tagged with the current
        version: written into the live modules (restored after) when the engine samples with them, else loaded
        into the engine's own copy (``engine.pinned``, which restores the trained weights on exit)."""

        def greedy() -> list[Any]:
            return generate_turns(
                self.generation,
                self.policy,
                self.engine,
                contextlib.nullcontext(),
                agent_id,
                chats,
                True,
                reply_starts,
            )

        if not self.engine_owns_weights:  # the engine samples with the live modules: put the averages in them
            ema = self.ema[self.policy.unit_of(agent_id)]
            with self._engine_lock:
                with self._whole_weights(modify=True):  # ZeRO-3: written whole, scattered back on exit
                    saved = ema.swap_in()
                try:
                    return greedy()
                finally:
                    with self._whole_weights(modify=True):
                        ema.restore(saved)
        weights = self.ema_weights_for_sync(agent_id)
        version = self.policy.version(agent_id)
        with self._engine_lock, self.engine.pinned(agent_id, weights, version):
            return greedy()

    def serve(
        self, agent_id: str, prompts: list[list[int]], sampling: SamplingParams, version: int | None = None
    ) -> list[Any]:
        """An inference-gateway call (see :func:`~services.trainer.rollout.engines.generation.serve_generations`): one response
        per prompt of token ids with the caller's sampling parameters, on the current or a resident version. Its
        version is fixed under the engine lock before it samples; :meth:`train`'s weight sync waits for it.

        Raises:
            NotFoundError: Unknown agent, or ``version`` is not resident.
            InvalidArgumentError: A prompt plus ``max_new_tokens`` beyond the model's length.
            AbortedError: The engine's version moved while the call sampled (a sync that skipped the lock).
        """
        return serve_generations(
            self.engine, self._engine_lock, self.resident, agent_id, prompts, sampling, version
        )

    def serving_state(self) -> dict[str, dict[str, Any]]:
        """What the gateway's backend mirrors, per agent of this actor: ``versions`` (current), ``resident``
        (servable versions, ascending) and ``max_model_len`` (prompt plus response tokens)."""
        with self._engine_lock:
            return {
                "versions": {a: self.engine.policy_version(a) for a in self.agents},
                "resident": {a: resident_versions(self.engine, self.resident, a) for a in self.agents},
                "max_model_len": {a: engine_max_model_len(self.engine, a) for a in self.agents},
            }

    # ------------------------------------------------------------------------------------------ training
    def train(
        self,
        agent_id: str,
        trajectories: list[Trajectory],
        ref_logprobs: torch.Tensor | None = None,
        old_values: torch.Tensor | None = None,
        return_returns: bool = False,
    ) -> dict[str, float] | tuple[dict[str, float], torch.Tensor]:
        """One RL step for an agent, then weight sync to the rollout engine under a new policy version.

        The trajectories are collated into one :class:`~services.trainer.learn.experience.Experience`
        (:func:`~services.trainer.learn.experience.collate`, padded with the agent's tokenizer's pad id). With
        ``ray.colocate_models: false`` the reference and the critic are separate actors
        (:mod:`services.trainer.ray.model_workers`): the caller passes their outputs on the same trajectories (they
        join the batch as its ``ref_logprobs`` and ``old_values``) and fits the critic on the returned GAE
        returns.

        Args:
            agent_id: A trainable agent.
            trajectories: Its trajectories as taken from its table (outcome rewards and groups).
            ref_logprobs: (B, A) float32 reference log-probabilities of the batch (a reference actor's
                :meth:`~services.trainer.ray.model_workers.ReferenceWorker.ref_logprobs`); None = this worker's own
                reference.
            old_values: (B, A) float32 critic values of the batch (a critic actor's
                :meth:`~services.trainer.ray.model_workers.CriticWorker.values`); None = this worker's critic.
            return_returns: Also return the (B, A) float32 returns (CPU), the critic's targets.

        Returns:
            Training statistics (see :func:`services.trainer.learn.learner.update_agent`) plus ``policy_version``
            and ``train_time_s``; with ``return_returns`` the pair ``(stats, returns)``.

        Raises:
            FailedPreconditionError: no trajectory has a turn with a prompt and a response.
            FloatingPointError: a non-finite loss.
            InvalidArgumentError: a precomputed tensor is not (B, A).
        """
        start = time.perf_counter()
        exp = collate(trajectories, agent_id, pad_id_of(self.policy.tokenizer(agent_id)))
        exp = exp.to(self.device).attach(
            ref_logprobs=None if ref_logprobs is None else ref_logprobs.to(self.device),
            old_values=None if old_values is None else old_values.to(self.device),
        )
        if self.algo.normalize_reward:  # the credited rewards: outcome or dense per-turn returns
            exp = normalize_credit(self.algo, exp, self.reward_moments[agent_id])
        critic = self.critics.get(agent_id)
        self.policy.train(True)
        result = update_agent(
            self.policy,
            self.strategies[self.policy.unit_of(agent_id)],
            exp,
            self.cfg.learner,
            critic=None if critic is None else TrainableCritic(critic, self.critic_engines[agent_id]),
        )
        self.policy.train(False)
        stats = result.stats
        version = self.policy.bump_version(agent_id)
        self._sync_engine(agent_id, version)
        stats["policy_version"] = float(version)
        if self.algo.normalize_reward:
            stats["reward_running_mean"] = self.reward_moments[agent_id].mean
            stats["reward_running_std"] = self.reward_moments[agent_id].std
        stats["train_time_s"] = time.perf_counter() - start
        if return_returns:
            return stats, result.returns.detach().cpu()
        return stats

    # ------------------------------------------------------------------------------------------ checkpoints
    def save(self, path: str, data_position: dict[str, Any]) -> str:
        """Save policies, optimizer/scheduler states, RNG states and the data position under ``path``."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        with self._whole_weights():
            self.policy.save(root / "policy")
        for unit, strategy in self.strategies.items():
            strategy.save_checkpoint(root / f"strategy_{unit}")
        for agent, engine in self.critic_engines.items():
            engine.save_checkpoint(root / f"critic_{agent}")
        for unit, ema in self.ema.items():
            torch.save(
                {"beta": ema.beta, "updates": ema.updates, "weights": ema.state_dict()},
                root / f"ema_{unit}.pt",
            )
        torch.save(
            {
                "data_position": data_position,
                "versions": self.versions(),
                "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(),
                "reward_moments": {a: m.state() for a, m in self.reward_moments.items()},
            },
            root / "worker_state.pt",
        )
        return str(root)

    def load(self, path: str) -> dict[str, Any]:
        """Restore a :meth:`save` checkpoint; returns the saved data position."""
        root = Path(path)
        with self._whole_weights(modify=True):  # ZeRO-3: load whole tensors, scattered back to the partitions
            self.policy.load(root / "policy")
        for unit, strategy in self.strategies.items():
            strategy.load_checkpoint(root / f"strategy_{unit}")
        for agent, engine in self.critic_engines.items():
            engine.load_checkpoint(root / f"critic_{agent}")
        for unit, ema in self.ema.items():
            saved = torch.load(root / f"ema_{unit}.pt", weights_only=True)
            ema.load_state_dict(saved["weights"])
            ema.updates = int(saved["updates"])
        state = torch.load(root / "worker_state.pt", weights_only=True)
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        for agent, moments in state.get("reward_moments", {}).items():
            self.reward_moments[agent] = RunningMoments.from_state(moments)
        for agent, version in state["versions"].items():
            self._sync_engine(agent, version)
        return state["data_position"]

    def weights_for_sync(self, agent_id: str) -> tuple[dict[str, torch.Tensor], int]:
        """The agent's current weights for a rollout actor, and their version.

        Returns:
            ``(weights, version)``: the agent's adapter (``lora``) or whole state dict, detached on the CPU
            (gathered first under ZeRO-3), and its policy version.
        """
        with self._whole_weights():
            weights = {k: v.detach().cpu().clone() for k, v in self.policy.state_for_sync(agent_id).items()}
        return weights, self.policy.version(agent_id)

    @contextlib.contextmanager
    def _whole_weights(self, modify: bool = False) -> Iterator[None]:
        """Gather every model this worker trains (DeepSpeed ZeRO-3 partitions them; a no-op otherwise), once per
        model: LoRA units share one base, and a frozen agent's adapter lives in a model others train. With
        ``modify``, weights written inside the block are kept (a checkpoint load)."""
        with contextlib.ExitStack() as stack:
            gathered: set[int] = set()
            for strategy in self.strategies.values():
                if id(strategy.model) not in gathered:
                    gathered.add(id(strategy.model))
                    stack.enter_context(strategy.gathered(modify=modify))
            yield

    def _sync_engine(self, agent_id: str, version: int) -> None:
        """Load the agent's current (whole) weights into this worker's rollout engine under ``version``."""
        with self._whole_weights():
            weights = self.policy.state_for_sync(agent_id)
            with self._engine_lock:
                self.engine.update_weights(agent_id, weights, version)
                if self.resident is not None:
                    unit = self.policy.unit_of(agent_id)
                    sharers = [a for a in self.agents if self.policy.unit_of(a) == unit]
                    self.resident.remember(sharers, version, weights)

    def ping(self) -> dict[str, Any]:
        """Liveness and placement info: pid, device, torch's intra-op threads and versions."""
        return {
            "pid": os.getpid(),
            "device": self.device,
            "torch_threads": torch.get_num_threads(),
            "versions": self.versions(),
        }
