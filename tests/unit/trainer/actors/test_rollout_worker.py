"""A rollout actor outside Ray: seeded apart from its siblings, and its sampler state survives a checkpoint."""

from __future__ import annotations

from pathlib import Path

from marti.config import load_config
from services.trainer.ray.rollout_worker import RolloutWorker, rollout_actor_config

ROOT = Path(__file__).resolve().parents[4]
CHATS = [[{"role": "user", "content": "Say hi"}]] * 2


def _worker(index: int) -> RolloutWorker:
    cfg = load_config(ROOT / "examples" / "tiny.yaml", ["rollout.max_new_tokens=6"])
    return RolloutWorker(rollout_actor_config(cfg), index=index, num_threads=1)


def _tokens(worker: RolloutWorker) -> list[list[int]]:
    return [g.response_token_ids for g in worker.generate("agent_1", CHATS)]


def test_sampler_state_round_trips_through_save_and_load(tmp_path):
    worker = _worker(0)
    assert worker.versions() == {"agent_1": 0, "agent_2": 0}
    path = worker.save(str(tmp_path / "rollout_worker_0.pt"))
    first = _tokens(worker)
    assert worker.load(path) is True
    assert _tokens(worker) == first  # the same draws again
    assert worker.load(str(tmp_path / "absent.pt")) is False  # a checkpoint from a run with fewer actors


def test_sibling_actors_draw_different_samples():
    assert _tokens(_worker(0)) != _tokens(_worker(1))


def test_the_actor_gets_only_its_frozen_part_of_the_config():
    """The driver builds the rollout actor's narrow config (its layout, engine, each agent's sampling and response
    prefix, resident versions); a whole training config is refused by name, not re-read in the actor."""
    import dataclasses

    import pytest

    from marti.errors import InvalidArgumentError

    cfg = load_config(
        ROOT / "examples" / "tiny.yaml",
        ["rollout.max_new_tokens=6", "agents.1.response_prefix=task_", "agents.1.sampling.temperature=0.5"],
    )
    narrow = rollout_actor_config(cfg)
    assert narrow.layout.keep_reference is False and narrow.layout.gradient_checkpointing is False
    assert narrow.generation.engine == cfg.rollout.engine and narrow.resident_versions == 1
    assert narrow.generation.response_prefixes == {"agent_1": "", "agent_2": "task_"}
    params = narrow.generation.params
    assert (params("agent_1").max_new_tokens, params("agent_2").temperature) == (6, 0.5)
    assert params("agent_2", greedy=True).temperature == 0.0
    with pytest.raises(InvalidArgumentError, match="no agent 'nobody'"):
        params("nobody")
    with pytest.raises(dataclasses.FrozenInstanceError):
        narrow.resident_versions = 3  # type: ignore[misc]
    gateway = load_config(
        ROOT / "examples" / "tiny.yaml", ["gateway.enabled=true", "gateway.resident_versions=3"]
    )
    assert rollout_actor_config(gateway).resident_versions == 3
    with pytest.raises(InvalidArgumentError, match="RolloutActorConfig"):
        RolloutWorker(cfg, num_threads=1)
    gens = RolloutWorker(narrow, num_threads=1).generate("agent_2", CHATS)
    assert all(g.text.startswith("task_") and len(g.response_token_ids) <= 6 for g in gens)
