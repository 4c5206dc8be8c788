"""Our side of ``marti bench trainer`` (:mod:`benchmarks.trainer`): the one-agent training config equivalent to
the TRL settings, and its run on :class:`~services.trainer.ray.policy_worker.PolicyWorker` in this process (the
child ``python -m benchmarks.trainer --_ours SPEC OUT`` runs it)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.trainer import sum_task


def worker_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The training config of our side (a one-agent team), equivalent to the TRL settings in the spec."""
    B = spec["prompts_per_step"] * spec["group_size"]
    policy: dict[str, Any] = {"mode": "lora" if spec["lora"] else "per_agent"}
    if spec["lora"]:
        policy.update(
            lora_r=spec["lora_r"],
            lora_alpha=spec["lora_alpha"],
            lora_target_modules=spec["lora_target_modules"],
        )
    return {
        "training_name": "bench_trainer",
        "num_agents": 1,
        "max_steps": spec["steps"],
        "micro_train_batch_size": B,
        "gradient_accumulation_steps": 1,
        "learning_rate": spec["lr"],
        "lr_scheduler": "constant",
        "seed": spec["seed"],
        "device": "cpu",
        "agents": [{"name": "solver", "pretrain_model": spec["model_dir"], "role": "solver"}],
        "algorithm": {
            "advantage_estimator": "grpo",
            "kl_coef": 0.0,
            "clip_eps_low": spec["clip_eps"],
            "clip_eps_high": spec["clip_eps"],
            "entropy_coef": 0.0,
            "loss_agg_mode": "token-mean",
            "ppo_epochs": 1,
        },
        "rollout": {
            "engine": spec.get("rollout_engine", "hf"),
            "dtype": spec.get("rollout_dtype", "float32"),
            "episodes_per_step": B,
            "group_size": spec["group_size"],
            "max_new_tokens": spec["max_new_tokens"],
            "temperature": spec["temperature"],
            "top_p": 1.0,
        },
        "policy": policy,
        "strategy": {
            "name": "torch",
            "grad_clip": spec["grad_clip"],
            "weight_decay": 0.0,
            "bf16": spec.get("train_dtype", "float32") == "bfloat16",
        },
        "output": {"log_with": []},
    }


def run_ours(spec: dict[str, Any]) -> dict[str, Any]:
    """Train with our GRPO (PolicyWorker) as the spec says; same result keys as the TRL runner.

    The first step runs under a :class:`~benchmarks.trainer.dtype_probe.DtypeProbe`: the result says which dtypes
    the generation and the update really computed in, and which engine class the worker built. Every step runs
    under a :class:`~benchmarks.trainer.thread_probe.ThreadProbe`: generation is ``worker.generate``, the update
    the rest of the step (scoring the samples, ``worker.train``), as on the TRL side.

    Returns:
        ``train_time_s``, ``step_times_s``, ``generation_s`` (per step), ``step_rewards``,
        ``completion_tokens``, ``prompt_tokens``, ``samples``, ``eval`` (see
        :func:`benchmarks.trainer.sum_task.evaluate`),
        ``observed`` (:meth:`DtypeProbe.report` of step 1), ``threads`` (:meth:`ThreadProbe.report` of every
        step: ``generation`` and ``update``), ``rollout`` (``{"engine": class name, "dtype": the
        dtype it samples in, or None for the policy's}``).
    """
    import torch

    from benchmarks.trainer.dtype_probe import DtypeProbe
    from benchmarks.trainer.thread_probe import ThreadProbe
    from marti.config import config_from_dict
    from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config

    worker = PolicyWorker(
        policy_actor_config(config_from_dict(worker_config(spec))), num_threads=spec["threads"]
    )
    step_times, gen_times, step_rewards = [], [], []
    counts = {"completion_tokens": 0, "prompt_tokens": 0, "samples": 0}
    probe = DtypeProbe()
    threads = ThreadProbe()
    t_start = time.perf_counter()
    for step in range(spec["steps"]):
        t0 = time.perf_counter()
        batch, chats = step_prompts(spec, step)
        with probe.phase("generation"), threads.phase("generation"):
            gens = worker.generate("solver", chats)
        gen_times.append(time.perf_counter() - t0)
        # the update: the rest of the step, as on the TRL side (reward, loss, backward, optimizer step)
        with threads.phase("update"):
            samples = _our_samples(step, gens, batch, spec["group_size"], counts)
            with probe.phase("update"):
                worker.train("solver", samples)
                # the lean training forward multiplies copies of the weights: name them
                probe.record_weights(worker.policy.model("solver"))
            probe.stop()  # step 1 only: the hook costs a little on every module call
            counts["samples"] += len(samples)
            step_rewards.append(statistics.mean(t.outcome_reward for t in samples))
        step_times.append(time.perf_counter() - t0)
    train_time = time.perf_counter() - t_start
    model = worker.policy.model("solver")
    with torch.no_grad():
        ev = sum_task.evaluate(
            model, worker.policy.tokenizer("solver"), spec["eval_problems"], spec["max_new_tokens"]
        )
    dtype = worker.engine.dtype
    return {
        "train_time_s": train_time,
        "step_times_s": step_times,
        "generation_s": gen_times,
        "step_rewards": step_rewards,
        **counts,
        "eval": ev,
        "observed": probe.report(),
        "threads": threads.report(),
        "rollout": {
            "engine": type(worker.engine).__name__,
            "dtype": None if dtype is None else str(dtype).removeprefix("torch."),
        },
    }


def step_prompts(spec: dict[str, Any], step: int) -> tuple[list[dict[str, Any]], list[Any]]:
    """Step ``step``'s problems (the spec's ``train_problems`` ``step * P`` to ``(step + 1) * P``) and its chats, each
    problem's repeated G times in a row (row ``i`` asks ``batch[i // G]``)."""
    P = spec["prompts_per_step"]
    batch = spec["train_problems"][step * P : (step + 1) * P]
    return batch, [sum_task.chat(p["question"]) for p in batch for _ in range(spec["group_size"])]


def _our_samples(
    step: int, gens: list[Any], batch: list[dict[str, Any]], G: int, counts: dict[str, int]
) -> list[Any]:
    """The trajectories of one step's generations (row ``i`` answers ``batch[i // G]``), scored by the task's
    reward; adds their token counts to ``counts``."""
    from marti.types.trajectory import Trajectory, Turn

    samples = []
    for i, g in enumerate(gens):
        turn = Turn(0, list(g.prompt_token_ids), list(g.response_token_ids))
        reward = sum_task.reward(g.text, batch[i // G]["answer"])
        samples.append(
            Trajectory(f"{step}-{i}", "solver", group_id=str(i // G), episode_return=reward, turns=[turn])
        )
        counts["completion_tokens"] += len(g.response_token_ids)
        counts["prompt_tokens"] += len(g.prompt_token_ids)
    return samples
