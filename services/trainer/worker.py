"""The policy worker: one team's policies, rollout engine and optimizers in one process (a Ray actor).

A worker holds a :class:`~services.trainer.policy.MultiAgentPolicy` (per-agent models, one shared model, or
LoRA adapters on one base), a rollout engine that samples from it, and one training strategy per trainable
weight set. The training loop drives it through four calls: :meth:`generate`, :meth:`train`, :meth:`save`,
:meth:`load`. With the transformers engine the engine samples from the policy's live modules, so weight sync
after an update is a version bump; with vLLM the new weights are pushed to the engine
(:meth:`services.trainer.rollout.base.RolloutEngine.update_weights`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import time
from pathlib import Path
from typing import Any

import torch

from marti.config import TrainConfig, config_from_dict
from services.trainer.algo import AlgoConfig
from services.trainer.learner import Sample, collate, update_agent
from services.trainer.policy import AgentSpec, LoraSettings, MultiAgentPolicy, PolicyConfig
from services.trainer.rollout.base import SamplingParams, chat_to_ids


def algo_config(cfg: TrainConfig) -> AlgoConfig:
    """Build the pure-algorithm config from the ``algorithm`` section of a training config."""
    a = cfg.algorithm
    return AlgoConfig(
        advantage_estimator=a.advantage_estimator,
        gamma=a.gamma,
        lambd=a.lambd,
        kl_coef=a.kl_coef,
        kl_estimator=a.kl_estimator,
        use_kl_loss=a.use_kl_loss,
        clip_eps_low=a.clip_eps_low,
        clip_eps_high=a.clip_eps_high,
        dual_clip=a.dual_clip,
        value_clip=a.value_clip,
        entropy_coef=a.entropy_coef,
        loss_agg_mode=a.loss_agg_mode,
        normalize_advantages=a.normalize_advantages,
    )


def policy_config(cfg: TrainConfig, agents: list[str] | None = None) -> PolicyConfig:
    """Build the policy layout from a training config (mode, agents, LoRA shape, seed).

    Args:
        cfg: The training config.
        agents: The subset of agents this policy holds (a per-agent Ray actor); ``None`` = every agent. The
            seed is offset by the first agent's position so each agent initialises as in a whole-team policy.
    """
    p = cfg.policy
    names = [a.name for a in cfg.agents] if agents is None else list(agents)
    first = [a.name for a in cfg.agents].index(names[0])
    return PolicyConfig(
        mode=cfg.policy_mode,
        agents=tuple(AgentSpec(a.name, a.pretrain_model, a.is_tuning) for a in cfg.agents if a.name in names),
        lora=LoraSettings(
            r=p.lora_r,
            alpha=int(p.lora_alpha),
            dropout=p.lora_dropout,
            target_modules=tuple(p.lora_target_modules),
        ),
        seed=cfg.seed + first,
        gradient_checkpointing=p.gradient_checkpointing,
        keep_reference=cfg.algorithm.kl_coef > 0,
    )


def resolve_device(cfg: TrainConfig) -> str:
    """``cpu`` or ``cuda`` from ``config.device`` (``auto`` picks CUDA when available)."""
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


class PolicyWorker:
    """Policies, rollout engine and strategies of a team.

    Args:
        config: The training config as a plain dict (Ray passes it by value).
        num_threads: torch intra-op threads; ``None`` keeps torch's default.
        agents: The agents this worker serves (one per actor in ``per_agent`` mode); ``None`` = the team.

    Raises:
        NotFoundError: a model is not available locally (named, with the places looked).
    """

    def __init__(
        self, config: dict[str, Any], num_threads: int | None = None, agents: list[str] | None = None
    ) -> None:
        self.cfg = config_from_dict(config)
        if num_threads:
            torch.set_num_threads(num_threads)
        random.seed(self.cfg.seed)
        torch.manual_seed(self.cfg.seed)
        self.device = resolve_device(self.cfg)
        self.algo = algo_config(self.cfg)
        self.agents = [a.name for a in self.cfg.agents] if agents is None else list(agents)
        self.policy = MultiAgentPolicy(policy_config(self.cfg, self.agents), device=self.device)
        self.engine = self._build_engine()
        self.strategies: dict[str, Any] = {}
        for agent in self.policy.trainable_agents:
            unit = self.policy.unit_of(agent)
            if unit not in self.strategies:
                self.strategies[unit] = self._build_strategy(agent)
        self.critics: dict[str, Any] = {}
        self.critic_engines: dict[str, Any] = {}
        if self.algo.advantage_estimator == "gae":
            self._build_critics()
        self.data_position: dict[str, Any] = {"step": 0}

    def _sampling(self, agent: str) -> SamplingParams:
        s = self.cfg.sampling_for(agent)
        return SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p)

    def _build_engine(self) -> Any:
        sampling = {a: self._sampling(a) for a in self.agents}
        engine = self.cfg.rollout.engine
        if engine == "auto":
            engine = "vllm" if self.device == "cuda" and _vllm_available() else "hf"
        if engine == "vllm":
            from services.trainer.rollout.vllm_engine import VLLMRolloutEngine

            return VLLMRolloutEngine.from_policy(self.policy, vllm=self.cfg.vllm, default_sampling=sampling)
        from services.trainer.rollout.hf import HFRolloutEngine

        return HFRolloutEngine.from_policy(self.policy, copy_weights=False, default_sampling=sampling)

    def _steps_per_batch(self) -> int:
        """Optimizer steps per agent per training step (for the LR schedule's length)."""
        turns_per_agent = -(-self.cfg.environment.max_turns // len(self.cfg.agents))
        samples = self.cfg.rollout.episodes_per_step * turns_per_agent
        micro = -(-samples // self.cfg.micro_train_batch_size)
        return max(1, -(-micro // self.cfg.gradient_accumulation_steps))

    def _build_critics(self) -> None:
        """One critic per trainable agent (PPO with GAE), from ``critic_model`` or the agent's base model."""
        from services.trainer.critic import build_critic

        lr = self.cfg.algorithm.critic_learning_rate
        for i, agent in enumerate(self.policy.trainable_agents):
            a = self.cfg.agent(agent)
            critic = build_critic(
                a.critic_model or a.pretrain_model, seed=self.cfg.seed + 100 + i, device=self.device
            )
            self.critics[agent] = critic
            self.critic_engines[agent] = self._build_strategy(
                agent, model=critic, params=list(critic.parameters()), lr=lr
            )

    def _build_strategy(
        self, agent: str, model: Any = None, params: Any = None, lr: float | None = None
    ) -> Any:
        from services.trainer.strategy.base import OptimConfig

        sc = self.cfg.strategy
        total = max(1, self.cfg.max_steps * self.cfg.algorithm.ppo_epochs * self._steps_per_batch())
        optim = OptimConfig(
            lr=lr or self.cfg.learning_rate_for(agent),
            weight_decay=sc.weight_decay,
            max_grad_norm=sc.grad_clip or None,
            grad_accum_steps=1,  # update_agent groups micro-batches (gradient_accumulation_steps) itself
            total_steps=total,
            warmup_steps=min(self.cfg.warmup_steps, total),
            lr_scheduler="constant" if self.cfg.lr_scheduler.startswith("constant") else "cosine",
            bf16=sc.bf16,
        )
        if sc.name == "deepspeed":
            from services.trainer.strategy.deepspeed_strategy import DeepSpeedStrategy

            strategy = DeepSpeedStrategy(sc.zero_stage, micro_batch_size=self.cfg.micro_train_batch_size)
        else:
            from services.trainer.strategy.torch_strategy import TorchStrategy

            strategy = TorchStrategy()
        if model is None:
            model, params = self.policy.model(agent), self.policy.parameters(agent)
        return strategy.setup(model, params, optim)

    # ------------------------------------------------------------------------------------------ rollouts
    def versions(self) -> dict[str, int]:
        """Policy version per agent (0 before any update)."""
        return {a: self.policy.version(a) for a in self.policy.agent_ids}

    def generate(self, agent_id: str, chats: list[list[dict[str, str]]], greedy: bool = False) -> list[Any]:
        """Generate one response per chat prompt with the agent's current policy.

        When the agent has a ``response_prefix``, the prompt is the chat template's output followed by the
        prefix tokens, and each generation's ``text`` starts with the prefix (its token ids stay in the prompt,
        so the prefix is never trained).

        Args:
            agent_id: The agent.
            chats: B chat conversations (system + user messages).
            greedy: Decode greedily (evaluation) instead of sampling.

        Returns:
            B :class:`~services.trainer.rollout.base.Generation` objects (token ids, logprobs, text).
        """
        sampling = self._sampling(agent_id)
        if greedy:
            sampling = SamplingParams(max_new_tokens=sampling.max_new_tokens, temperature=0.0)
        prefix = self.cfg.agent(agent_id).response_prefix
        prompts: list[Any] = chats
        if prefix:
            tok = self.policy.tokenizer(agent_id)
            prefix_ids = tok(prefix, add_special_tokens=False)["input_ids"]
            prompts = [chat_to_ids(tok, chat) + list(prefix_ids) for chat in chats]
        self.policy.train(False)
        with torch.no_grad():
            gens = self.engine.generate(agent_id, prompts, sampling)
        if prefix:
            gens = [dataclasses.replace(g, text=prefix + g.text) for g in gens]
        return gens

    # ------------------------------------------------------------------------------------------ training
    def train(self, agent_id: str, samples: list[Sample]) -> dict[str, float]:
        """One RL step for an agent, then weight sync to the rollout engine under a new policy version.

        Args:
            agent_id: A trainable agent.
            samples: Its turns with outcome rewards and groups.

        Returns:
            Training statistics (see :func:`services.trainer.learner.update_agent`) plus ``policy_version``
            and ``train_time_s``.
        """
        start = time.perf_counter()
        tok = self.policy.tokenizer(agent_id)
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        batch = collate(samples, pad)
        self.policy.train(True)
        stats = update_agent(
            self.policy,
            self.strategies[self.policy.unit_of(agent_id)],
            agent_id,
            batch,
            self.algo,
            micro_batch_size=self.cfg.micro_train_batch_size,
            grad_accum_steps=self.cfg.gradient_accumulation_steps,
            ppo_epochs=self.cfg.algorithm.ppo_epochs,
            critic=self.critics.get(agent_id),
            critic_engine=self.critic_engines.get(agent_id),
        )
        self.policy.train(False)
        version = self.policy.bump_version(agent_id)
        with self.strategies[self.policy.unit_of(agent_id)].gathered():  # ZeRO-3: whole weights for the sync
            self.engine.update_weights(agent_id, self.policy.state_for_sync(agent_id), version)
        stats["policy_version"] = float(version)
        stats["train_time_s"] = time.perf_counter() - start
        return stats

    # ------------------------------------------------------------------------------------------ checkpoints
    def save(self, path: str, data_position: dict[str, Any]) -> str:
        """Save policies, optimizer/scheduler states, RNG states and the data position under ``path``."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:  # ZeRO-3 partitions weights: gather them to save whole tensors
            gathered: set[int] = set()
            for strategy in self.strategies.values():  # once per model: LoRA units share one base model
                if id(strategy.model) not in gathered:
                    gathered.add(id(strategy.model))
                    stack.enter_context(strategy.gathered())
            self.policy.save(root / "policy")
        for unit, strategy in self.strategies.items():
            strategy.save_checkpoint(root / f"strategy_{unit}")
        for agent, engine in self.critic_engines.items():
            engine.save_checkpoint(root / f"critic_{agent}")
        torch.save(
            {
                "data_position": data_position,
                "versions": self.versions(),
                "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(),
            },
            root / "worker_state.pt",
        )
        return str(root)

    def load(self, path: str) -> dict[str, Any]:
        """Restore a :meth:`save` checkpoint; returns the saved data position."""
        root = Path(path)
        self.policy.load(root / "policy")
        for unit, strategy in self.strategies.items():
            strategy.load_checkpoint(root / f"strategy_{unit}")
        for agent, engine in self.critic_engines.items():
            engine.load_checkpoint(root / f"critic_{agent}")
        state = torch.load(root / "worker_state.pt", weights_only=True)
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        for agent, version in state["versions"].items():
            self.engine.update_weights(agent, self.policy.state_for_sync(agent), version)
        return state["data_position"]

    def ping(self) -> dict[str, Any]:
        """Liveness and placement info: pid, device, agents and versions."""
        return {"pid": os.getpid(), "device": self.device, "versions": self.versions()}


def _vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None
