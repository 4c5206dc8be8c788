"""``policy.ema``: an exponential moving average of the trained weights, used for evaluation, checkpointed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from marti.config import config_from_dict, load_config
from marti.errors import InvalidArgumentError
from services.trainer.learn.ema import EmaWeights
from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config
from tests.trainer_data import one_turn

ROOT = Path(__file__).resolve().parents[4]
CHATS = [[{"role": "user", "content": "Say hi"}], [{"role": "user", "content": "Count to three"}]]


def test_ema_update_hand_computed_and_applied_restores():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    ema = EmaWeights([("w", p)], beta=0.5)
    with torch.no_grad():
        p.copy_(torch.tensor([3.0, 2.0]))
    ema.update()  # 0.5 * [1, -2] + 0.5 * [3, 2] = [2, 0]
    assert ema.shadow["w"].tolist() == [2.0, 0.0]
    with torch.no_grad():
        p.copy_(torch.tensor([5.0, 4.0]))
    ema.update()  # 0.5 * [2, 0] + 0.5 * [5, 4] = [3.5, 2]
    assert ema.shadow["w"].tolist() == [3.5, 2.0] and ema.updates == 2
    with ema.applied():
        assert p.tolist() == [3.5, 2.0]
    assert p.tolist() == [5.0, 4.0]


def test_ema_refuses_bad_input():
    p = torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(InvalidArgumentError, match="ema_beta"):
        EmaWeights([("w", p)], beta=1.0)
    with pytest.raises(InvalidArgumentError, match="at least one"):
        EmaWeights([], beta=0.9)
    ema = EmaWeights([("w", p)], beta=0.9)
    with pytest.raises(InvalidArgumentError, match="shape"):
        ema.load_state_dict({"w": torch.zeros(3)})


def _worker(*extra: str) -> PolicyWorker:
    cfg = load_config(
        ROOT / "examples" / "tiny.yaml",
        ["policy.ema=true", "policy.ema_beta=0.5", "rollout.max_new_tokens=4", "learning_rate=0.05", *extra],
    )
    return PolicyWorker(policy_actor_config(cfg), num_threads=1)


@pytest.fixture(scope="module")
def trained():
    worker = _worker("micro_train_batch_size=1")
    agent = "agent_1"
    unit = worker.policy.unit_of(agent)
    ema = worker.ema[unit]
    params = dict(worker.policy.named_parameters(agent))
    expected = {n: p.detach().clone() for n, p in params.items()}  # the average starts at the initial weights

    def record() -> None:  # runs after the EMA's own hook: the hand-computed average of the same step
        for n, p in params.items():
            expected[n] = 0.5 * expected[n] + 0.5 * p.detach()

    worker.strategies[unit].add_step_hook(record)
    gens = worker.generate(agent, CHATS)
    samples = [one_turn(g.prompt_token_ids, g.response_token_ids, float(i), 0) for i, g in enumerate(gens)]
    worker.train(agent, samples)
    return worker, agent, unit, ema, expected


def test_ema_equals_the_hand_computed_average_after_each_optimizer_step(trained):
    worker, _agent, unit, ema, expected = trained
    assert worker.strategies[unit].global_step == ema.updates == 2  # two micro batches of one sample
    for name, value in expected.items():
        assert torch.allclose(ema.shadow[name], value, atol=1e-7), name
    trained_b = [p for n, p in worker.policy.named_parameters("agent_1") if "lora_B" in n]
    assert any(p.abs().sum() > 0 for p in trained_b)  # the update moved the adapter away from its average


def test_evaluation_uses_the_ema_weights_and_rollouts_the_trained_ones(trained):
    worker, agent, unit, ema, _ = trained
    before = {n: p.detach().clone() for n, p in worker.policy.named_parameters(agent)}
    with_ema = worker.generate(agent, CHATS, greedy=True)
    after = dict(worker.policy.named_parameters(agent))
    assert all(torch.equal(before[n], after[n]) for n in before)  # the trained weights are back
    saved, worker.ema = worker.ema, {}
    try:
        plain = worker.generate(agent, CHATS, greedy=True)  # the trained weights
        with ema.applied():
            by_hand = worker.generate(agent, CHATS, greedy=True)  # the averages put in by hand
    finally:
        worker.ema = saved
    lp = lambda gens: torch.tensor([x for g in gens for x in g.response_logprobs[:1]])  # noqa: E731
    assert torch.allclose(lp(with_ema), lp(by_hand), atol=1e-5)
    assert not torch.allclose(lp(with_ema), lp(plain), atol=1e-4)


def test_the_checkpoint_holds_the_averages_and_a_resume_restores_them(trained, tmp_path):
    worker, _agent, unit, ema, _ = trained
    worker.save(str(tmp_path / "ckpt"), {"step": 1})
    saved = torch.load(tmp_path / "ckpt" / f"ema_{unit}.pt", weights_only=True)
    assert saved["beta"] == 0.5 and saved["updates"] == 2
    assert all(torch.equal(saved["weights"][n], ema.shadow[n]) for n in ema.shadow)
    fresh = _worker("micro_train_batch_size=1")
    assert not all(torch.equal(fresh.ema[unit].shadow[n], ema.shadow[n]) for n in ema.shadow)
    fresh.load(str(tmp_path / "ckpt"))
    assert all(torch.equal(fresh.ema[unit].shadow[n], ema.shadow[n]) for n in ema.shadow)


def test_ema_is_off_by_default_and_refused_where_evaluation_could_not_use_it():
    worker_cfg = load_config(ROOT / "examples" / "tiny.yaml")
    assert not worker_cfg.policy.ema and worker_cfg.policy.ema_beta == 0.992
    raw = worker_cfg.model_dump(mode="json")
    raw["policy"]["ema"] = True
    raw["ray"]["num_rollout_workers"] = 1
    with pytest.raises(InvalidArgumentError, match="policy.ema"):
        config_from_dict(raw)


def test_ema_under_zero3_averages_whole_weights_and_evaluates_with_them():
    worker = _worker("strategy.name=deepspeed", "strategy.zero_stage=3")
    agent = "agent_1"
    ema = worker.ema[worker.policy.unit_of(agent)]
    assert all(t.numel() > 0 for t in ema.shadow.values())  # gathered, not ZeRO-3 partitions
    gens = worker.generate(agent, CHATS)
    worker.train(
        agent, [one_turn(g.prompt_token_ids, g.response_token_ids, float(i), 0) for i, g in enumerate(gens)]
    )
    assert ema.updates >= 1
    weights = worker.ema_weights_for_sync(agent)
    assert all(t.numel() > 0 for t in weights.values())
    assert len(worker.generate(agent, CHATS, greedy=True)) == len(CHATS)
