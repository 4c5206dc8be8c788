"""A policy worker for asynchronous rollouts: its engine owns a copy of the weights, synced whole under ZeRO-3."""

from __future__ import annotations

from pathlib import Path

import torch

from marti.config import load_config
from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config
from tests.trainer_data import one_turn

ROOT = Path(__file__).resolve().parents[4]


def _worker() -> PolicyWorker:
    cfg = load_config(
        ROOT / "examples" / "tiny.yaml",
        [
            "rollout.max_staleness=1",
            "strategy.name=deepspeed",
            "strategy.zero_stage=3",
            "rollout.max_new_tokens=4",
        ],
    )
    return PolicyWorker(policy_actor_config(cfg), num_threads=1)


def test_zero3_worker_syncs_whole_weights_to_its_own_engine_and_after_a_resume(tmp_path):
    worker = _worker()
    assert worker.engine_owns_weights
    chats = [[{"role": "user", "content": "Say hi"}]] * 2
    gens = worker.generate("agent_1", chats)
    samples = [one_turn(g.prompt_token_ids, g.response_token_ids, float(i), 0) for i, g in enumerate(gens)]
    worker.train("agent_1", samples)
    greedy = worker.generate("agent_1", chats, greedy=True)
    assert all(g.policy_version == 1 for g in greedy)
    weights, version = worker.weights_for_sync("agent_1")
    assert version == 1 and all(t.numel() > 0 for t in weights.values())  # gathered, not ZeRO-3 partitions
    worker.save(str(tmp_path / "ckpt"), {"step": 1})

    resumed = _worker()
    assert resumed.load(str(tmp_path / "ckpt")) == {"step": 1}
    again = resumed.generate("agent_1", chats, greedy=True)
    assert [g.response_token_ids for g in again] == [g.response_token_ids for g in greedy]
    for a, b in zip(again, greedy, strict=True):
        assert torch.allclose(torch.tensor(a.response_logprobs), torch.tensor(b.response_logprobs), atol=1e-5)
