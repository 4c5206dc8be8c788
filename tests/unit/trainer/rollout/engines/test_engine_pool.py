"""``vllm.num_engines``: several engines behind one, each call's prompts split among them.

vLLM is not installed here, so the pool is exercised with real transformers engines over the tiny model (the
same :class:`RolloutEngine` interface the vLLM engine implements).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from marti.config import load_config
from marti.errors import InvalidArgumentError
from services.trainer.models.policy import MultiAgentPolicy
from services.trainer.ray.policy_worker import policy_layout
from services.trainer.rollout.engines.base import SamplingParams
from services.trainer.rollout.engines.generation import engine_count
from services.trainer.rollout.engines.hf import HFRolloutEngine
from services.trainer.rollout.engines.pool import EnginePool, split_contiguous

ROOT = Path(__file__).resolve().parents[5]
GREEDY = SamplingParams(max_new_tokens=3, temperature=0.0)
CHATS = [[{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}] for i in range(5)]


def test_split_contiguous_hand_computed():
    assert split_contiguous(5, 2) == [(0, 2), (2, 5)]
    assert split_contiguous(6, 3) == [(0, 2), (2, 4), (4, 6)]
    assert split_contiguous(1, 3) == [(0, 0), (0, 0), (0, 1)]
    with pytest.raises(InvalidArgumentError):
        split_contiguous(3, 0)


@pytest.fixture(scope="module")
def policy():
    cfg = load_config(ROOT / "examples" / "tiny.yaml")
    return MultiAgentPolicy(policy_layout(cfg))


def test_a_pool_splits_the_prompts_and_returns_them_in_order(policy):
    single = HFRolloutEngine.from_policy(policy, copy_weights=True)
    pool = EnginePool([HFRolloutEngine.from_policy(policy, copy_weights=True) for _ in range(2)])
    got = pool.generate("agent_1", CHATS, GREEDY)
    assert pool.last_split == [2, 3]
    want = single.generate("agent_1", CHATS, GREEDY)
    assert [g.response_token_ids for g in got] == [g.response_token_ids for g in want]
    assert [g.prompt_token_ids for g in got] == [g.prompt_token_ids for g in want]
    # Each engine really generated its own chunk: engine 1 alone gives the last three answers.
    tail = pool.engines[1].generate("agent_1", CHATS[2:], GREEDY)
    assert [g.response_token_ids for g in got[2:]] == [g.response_token_ids for g in tail]


def test_weight_updates_reach_every_engine(policy):
    pool = EnginePool([HFRolloutEngine.from_policy(policy, copy_weights=True) for _ in range(3)])
    weights = {k: torch.randn_like(v) for k, v in policy.state_for_sync("agent_1").items()}
    pool.update_weights("agent_1", weights, 1)
    assert pool.policy_version("agent_1") == 1
    assert all(e.policy_version("agent_1") == 1 for e in pool.engines)
    outs = [e.generate("agent_1", CHATS[:1], GREEDY)[0].response_logprobs for e in pool.engines]
    assert outs[0] == pytest.approx(outs[1]) and outs[1] == pytest.approx(outs[2])


def test_engines_must_serve_the_same_agents(policy):
    engine = HFRolloutEngine.from_policy(policy, copy_weights=True)
    other = HFRolloutEngine({"x": engine._agents["agent_1"]})
    with pytest.raises(InvalidArgumentError, match="serves"):
        EnginePool([engine, other])
    with pytest.raises(InvalidArgumentError):
        EnginePool([])


def test_num_engines_counts_vllm_engines_only():
    cfg = load_config(ROOT / "examples" / "tiny.yaml", ["vllm.num_engines=3"])
    assert engine_count(cfg, "vllm") == 3 and engine_count(cfg, "hf") == 1
