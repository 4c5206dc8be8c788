"""RayRuntime actor groups: per-agent actors in per_agent mode, one team actor in lora mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from marti.config import load_config
from services.trainer.learner import Sample
from services.trainer.ray_runtime import RayRuntime

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def test_per_agent_actors_route_calls_and_checkpoint(tmp_path):
    cfg = load_config(ROOT / "examples" / "tiny.yaml", ["policy.mode=per_agent", "rollout.max_new_tokens=4"])
    runtime = RayRuntime(cfg)
    assert runtime.groups() == [["agent_1"], ["agent_2"]]
    try:
        runtime.start()
        chat = [[{"role": "user", "content": "Say hi"}]] * 2
        gens = runtime.generate("agent_2", chat)
        assert len(gens) == 2 and all(g.response_token_ids for g in gens)
        samples = [Sample(g.prompt_token_ids, g.response_token_ids, float(i), 0) for i, g in enumerate(gens)]
        stats = runtime.train("agent_2", samples)
        assert stats["policy_version"] == 1.0
        assert runtime.versions() == {"agent_1": 0, "agent_2": 1}
        runtime.save(str(tmp_path / "ckpt"), {"step": 1})
        assert {p.name for p in (tmp_path / "ckpt").iterdir()} == {"worker_0", "worker_1"}
        assert runtime.load(str(tmp_path / "ckpt")) == {"step": 1}
        assert runtime.versions() == {"agent_1": 0, "agent_2": 1}
    finally:
        runtime.shutdown()


def test_lora_mode_uses_one_team_actor():
    cfg = load_config(ROOT / "examples" / "tiny.yaml")
    assert RayRuntime(cfg).groups() == [["agent_1", "agent_2"]]
