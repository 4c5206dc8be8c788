"""The episode runner and the learner on a real in-process env and a tiny real model (no gRPC, no Ray)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import marti
from marti.config import load_config
from services.trainer.learn.experience import collate
from services.trainer.observe.episode_metrics import episode_metrics
from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config
from services.trainer.rollout.episodes.env_config import env_config
from services.trainer.rollout.episodes.runner import EpisodeRunner
from tests.trainer_data import one_turn

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def cfg():
    return load_config(
        ROOT / "examples" / "tiny.yaml", ["environment.max_turns=2", "rollout.max_new_tokens=6"]
    )


@pytest.fixture(scope="module")
def worker(cfg):
    return PolicyWorker(policy_actor_config(cfg), num_threads=1)


def _runner(cfg, worker, greedy=False):
    return EpisodeRunner(
        make_env=lambda seed: marti.make(cfg.environment.env_name, seed=seed, **env_config(cfg)),
        generate=lambda agent, chats: worker.generate(agent, chats, greedy=greedy),
        comm_factory=None,
        agents=[a.name for a in cfg.agents],
        roles={a.name: a.role for a in cfg.agents},
        system_prompts={a.name: f"You are {a.name}." for a in cfg.agents},
        policy_version=lambda a: worker.versions()[a],
        run_id="t",
    )


def test_episodes_record_each_acting_agents_turns(cfg, worker):
    results = _runner(cfg, worker).play([5, 5, 6])
    assert [r.seed for r in results] == [5, 5, 6]
    for r in results:
        assert r.metrics["num_turns"] == 2  # planner then executor, max_turns=2
        assert set(r.trajectories) == {"agent_1", "agent_2"}
        for agent, traj in r.trajectories.items():
            assert traj.agent_id == agent and traj.metadata["seed"] == r.seed
            for turn in traj.turns:
                assert turn.prompt_token_ids and turn.response_token_ids
                assert len(turn.response_logprobs) == len(turn.response_token_ids)
                assert all(lp <= 0 for lp in turn.response_logprobs)
        # Returns add every step's reward (dense rewards reach agents that did not act), turns only their own.
        assert all(math.isfinite(v) for v in r.returns.values())
        assert r.trajectories["agent_2"].turns[0].step == 1
    m = episode_metrics(results)
    assert {"team/reward", "agent_1/reward", "team/format_valid", "team/num_turns"} <= set(m)


def test_eval_episode_log_holds_each_turns_text_in_order(cfg, worker, tmp_path):
    import json

    from services.trainer.observe.episodes_log import append_eval_episodes

    results = _runner(cfg, worker, greedy=True).play([3, 4])
    path = append_eval_episodes(tmp_path, 2, results)
    append_eval_episodes(tmp_path, 4, results[:1])
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["seed"]) for r in records] == [(2, 3), (2, 4), (4, 3)]
    first = records[0]
    assert [(t["turn"], t["agent"]) for t in first["turns"]] == [(0, "agent_1"), (1, "agent_2")]
    assert first["turns"][1]["text"] == results[0].trajectories["agent_2"].turns[0].response_text
    assert first["returns"] == pytest.approx(results[0].returns)
    assert first["metrics"]["num_turns"] == 2


def test_train_updates_adapter_and_bumps_version(cfg, worker):
    results = _runner(cfg, worker).play([1, 1, 2, 2])
    samples = [
        one_turn(t.prompt_token_ids, t.response_token_ids, r.returns["agent_1"] + i, r.seed)
        for i, r in enumerate(results)
        for t in r.trajectories["agent_1"].turns
    ]
    before = {k: v.clone() for k, v in worker.policy.state_for_sync("agent_1").items()}
    other_before = {k: v.clone() for k, v in worker.policy.state_for_sync("agent_2").items()}
    v0 = worker.versions()["agent_1"]
    stats = worker.train("agent_1", samples)
    assert worker.versions()["agent_1"] == v0 + 1
    assert stats["policy_version"] == v0 + 1
    for key in ("policy_loss", "clip_frac", "entropy", "grad_norm", "kl"):
        assert math.isfinite(stats[key]), key
    after = worker.policy.state_for_sync("agent_1")
    assert any(not torch.equal(before[k], after[k]) for k in before), "agent_1's adapter did not change"
    other_after = worker.policy.state_for_sync("agent_2")
    assert all(torch.equal(other_before[k], other_after[k]) for k in other_before), "agent_2 must not move"


def test_gradient_accumulation_windows_step_the_optimizer(cfg, worker):
    from services.trainer.learn.learner import LearnerConfig, update_agent

    results = _runner(cfg, worker).play([3, 3, 4, 4, 5])
    samples = [
        one_turn(t.prompt_token_ids, t.response_token_ids, float(i % 2), r.seed)
        for i, r in enumerate(results)
        for t in r.trajectories["agent_2"].turns
    ]
    batch = collate(samples, "agent_2", pad_id=0)
    engine = worker.strategies[worker.policy.unit_of("agent_2")]
    before = engine.global_step
    config = LearnerConfig(worker.algo, micro_batch_size=1, grad_accum_steps=2)
    stats = update_agent(worker.policy, engine, batch, config).stats
    assert stats["optimizer_steps"] == math.ceil(len(samples) / 2) == engine.global_step - before
    assert math.isfinite(stats["policy_loss"]) and stats["num_samples"] == len(samples)


def test_ppo_with_gae_trains_a_critic(cfg, tmp_path):
    """advantage_estimator=gae builds a critic per trainable agent and fits it to the returns."""
    from marti.config import load_config

    gae_cfg = load_config(
        ROOT / "examples" / "tiny.yaml",
        ["environment.max_turns=2", "rollout.max_new_tokens=6", "algorithm.advantage_estimator=gae"],
    )
    w = PolicyWorker(policy_actor_config(gae_cfg), num_threads=1)
    assert set(w.critics) == {"agent_1", "agent_2"}
    results = _runner(gae_cfg, w).play([1, 2, 3])
    samples = [
        one_turn(t.prompt_token_ids, t.response_token_ids, float(i), r.seed)
        for i, r in enumerate(results)
        for t in r.trajectories["agent_1"].turns
    ]
    head = w.critics["agent_1"].value_head.weight.detach().clone()
    stats = w.train("agent_1", samples)
    for key in ("value_loss", "vf_clip_frac", "value_mean", "policy_loss"):
        assert math.isfinite(stats[key]), key
    assert stats["value_loss"] > 0  # zero-initialised values against non-zero returns
    assert not torch.equal(head, w.critics["agent_1"].value_head.weight), "the critic must be updated"
    path = w.save(str(tmp_path / "ckpt"), {"step": 1})
    assert (tmp_path / "ckpt" / "critic_agent_1").exists()
    w.load(path)


def test_nan_weights_stop_the_update_with_a_diagnostic(cfg):
    w = PolicyWorker(policy_actor_config(cfg), num_threads=1)
    results = _runner(cfg, w).play([7, 7])
    samples = [
        one_turn(t.prompt_token_ids, t.response_token_ids, float(i), r.seed)
        for i, r in enumerate(results)
        for t in r.trajectories["agent_1"].turns
    ]
    with torch.no_grad():
        next(p for p in w.policy.parameters("agent_1")).fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="agent 'agent_1': non-finite loss"):
        w.train("agent_1", samples)
    assert w.versions()["agent_1"] == 0, "a failed update must not publish a new policy version"
