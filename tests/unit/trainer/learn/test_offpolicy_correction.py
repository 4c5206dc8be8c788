"""The off-policy correction is real: the PPO ratio is taken against the behaviour log-probs carried in the
experience record, and truncated importance sampling (``tis_cap``) weights tokens by ``min(pi_prox / mu, C)``.

A tiny real model (2 layers) with two LoRA agents on one base, no Ray, no gRPC.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from marti.config import load_config
from marti.types.trajectory import Trajectory, Turn
from services.trainer.learn.experience import collate
from services.trainer.learn.learner import LearnerConfig, update_agent
from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config
from tests.trainer_data import one_turn

ROOT = Path(__file__).resolve().parents[4]
CHATS = [[{"role": "user", "content": f"Split {n} units between task_1 and task_2."}] for n in (3, 5, 7, 9)]


@pytest.fixture
def worker():
    cfg = load_config(ROOT / "examples" / "tiny.yaml", ["rollout.max_new_tokens=6", "seed=3"])
    return PolicyWorker(policy_actor_config(cfg), num_threads=1)


def _samples(worker: PolicyWorker, agent: str, rewards=(1.0, 0.0, 1.0, 0.0)) -> list[Trajectory]:
    gens = worker.generate(agent, CHATS)
    return [
        one_turn(
            list(g.prompt_token_ids),
            list(g.response_token_ids),
            r,
            "g",
            list(g.response_logprobs),
            policy_version=worker.versions()[agent],
        )  # fmt: skip
        for g, r in zip(gens, rewards, strict=True)
    ]


def _recompute(worker: PolicyWorker, agent: str, batch) -> torch.Tensor:
    worker.policy.train(False)
    with torch.no_grad():
        return worker.policy.logprobs(agent, batch.input_ids, batch.attention_mask, batch.action_mask)


def _update(worker: PolicyWorker, agent: str, samples: list[Trajectory], tis_cap=None):
    batch = collate(samples, agent, pad_id=0)
    worker.policy.train(True)
    result = update_agent(
        worker.policy, worker.strategies[worker.policy.unit_of(agent)], batch,
        LearnerConfig(worker.algo, micro_batch_size=len(samples), tis_cap=tis_cap),
    )  # fmt: skip
    worker.policy.train(False)
    worker.policy.bump_version(agent)
    return batch, result, result.stats


def test_carried_logprobs_equal_the_learners_while_the_weights_are_unchanged(worker):
    samples = _samples(worker, "agent_1")
    batch = collate(samples, "agent_1", pad_id=0)
    mask = batch.action_mask
    recomputed = _recompute(worker, "agent_1", batch)
    diff = (recomputed - batch.behaviour_logprobs).abs()[mask]
    assert diff.max().item() <= 2e-6, diff.max().item()
    _, outputs, stats = _update(worker, "agent_1", samples)
    assert torch.allclose(outputs.ratio[mask], torch.ones(int(mask.sum())), atol=1e-5)
    assert stats["behaviour_rows"] == 1.0
    assert stats["behaviour_kl"] < 1e-9


def test_after_an_update_the_ratio_corrects_exactly_where_the_weights_changed(worker):
    stale_1 = _samples(worker, "agent_1")  # behaviour: version 0 of both agents
    stale_2 = _samples(worker, "agent_2")
    _update(worker, "agent_1", _samples(worker, "agent_1", rewards=(0.0, 1.0, 0.0, 1.0)))  # agent_1 moves

    batch_1 = collate(stale_1, "agent_1", pad_id=0)
    now_1 = _recompute(worker, "agent_1", batch_1)
    _, out_1, stats_1 = _update(worker, "agent_1", stale_1)  # one step off-policy
    mask = batch_1.action_mask
    hand = torch.exp(now_1 - batch_1.behaviour_logprobs)[mask]
    assert torch.allclose(out_1.ratio[mask], hand, rtol=1e-4, atol=1e-6)
    assert (hand - 1).abs().max().item() > 1e-3, "the update did not change agent_1's log-probs"
    assert stats_1["behaviour_kl"] > 1e-7
    assert stats_1["ratio_mean"] != pytest.approx(1.0, abs=1e-6)

    batch_2 = collate(stale_2, "agent_2", pad_id=0)
    _, out_2, stats_2 = _update(worker, "agent_2", stale_2)  # agent_2's weights never changed
    mask_2 = batch_2.action_mask
    assert torch.allclose(out_2.ratio[mask_2], torch.ones(int(mask_2.sum())), atol=1e-5)
    assert stats_2["behaviour_kl"] < 1e-9


def test_truncated_importance_sampling_caps_the_behaviour_weight(worker):
    stale = _samples(worker, "agent_1")
    _update(worker, "agent_1", _samples(worker, "agent_1", rewards=(0.0, 1.0, 0.0, 1.0)))
    batch = collate(stale, "agent_1", pad_id=0)
    prox = _recompute(worker, "agent_1", batch)
    cap = 1.0
    _, outputs, stats = _update(worker, "agent_1", stale, tis_cap=cap)
    mask = batch.action_mask
    raw = torch.exp(prox - batch.behaviour_logprobs)[mask]
    # the ratio is now against the learner's own log-probs before the update: 1 on the first window
    assert torch.allclose(outputs.ratio[mask], torch.ones(int(mask.sum())), atol=1e-5)
    assert stats["tis_truncated_frac"] == pytest.approx((raw > cap).float().mean().item(), abs=1e-6)
    assert stats["tis_weight_mean"] == pytest.approx(raw.clamp(max=cap).mean().item(), rel=1e-5)
    assert 0 < stats["tis_truncated_frac"] < 1


def test_tis_cap_must_be_positive(worker):
    from marti.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="tis_cap"):
        _update(worker, "agent_1", _samples(worker, "agent_1"), tis_cap=0.0)


def test_rows_without_behaviour_logprobs_fall_back_to_the_learners():
    rows = [one_turn([1, 2], [3, 4], 1.0, "g", [-0.5, -0.25]), one_turn([1], [5], 0.0, "g")]
    batch = collate(rows, "agent_1", pad_id=0)
    assert batch.has_behaviour.tolist() == [True, False]
    assert batch.behaviour_logprobs.tolist() == [[-0.5, -0.25], [0.0, 0.0]]


def test_samples_come_from_the_experience_record():
    traj = Trajectory(
        episode_id="e", agent_id="a", policy_version=2, group_id="7", episode_return=0.5,
        turns=[
            Turn(step=0, prompt_token_ids=[1], response_token_ids=[2, 3], response_logprobs=[-1.0, -2.0],
                 response_mask=[1, 0], reward=0.1),
            Turn(step=1, prompt_token_ids=[1], response_token_ids=[], reward=0.2),
            Turn(step=2, prompt_token_ids=[4], response_token_ids=[5], policy_version=3),
        ],
    )  # fmt: skip
    batch = collate([traj], "a", pad_id=0)
    assert batch.rewards.tolist() == [0.5, 0.5] and batch.turn_ids.tolist() == [
        0,
        2,
    ]  # turn 1 has no response
    assert batch.behaviour_logprobs.tolist() == [[-1.0, -2.0], [0.0, 0.0]]
    assert batch.has_behaviour.tolist() == [True, False]
    assert batch.action_mask.tolist() == [[True, False], [True, False]]  # the mask's 0 is not trained


def test_max_statistics_are_maxima_over_micro_batches(worker):
    samples = _samples(worker, "agent_1")
    batch = collate(samples, "agent_1", pad_id=0)
    worker.policy.train(True)
    stats = update_agent(
        worker.policy, worker.strategies[worker.policy.unit_of("agent_1")], batch,
        LearnerConfig(worker.algo, micro_batch_size=1, grad_accum_steps=None),
    ).stats  # fmt: skip
    # one optimizer window of 4 micro-batches: the behaviour statistics come from each micro-batch's forward
    assert stats["ratio_max"] >= stats["ratio_mean"]
    assert stats["behaviour_logprob_diff_max"] <= 2e-6
