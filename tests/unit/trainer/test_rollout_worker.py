"""A rollout actor outside Ray: seeded apart from its siblings, and its sampler state survives a checkpoint."""

from __future__ import annotations

from pathlib import Path

from marti.config import load_config
from services.trainer.ray.rollout_worker import RolloutWorker

ROOT = Path(__file__).resolve().parents[3]
CHATS = [[{"role": "user", "content": "Say hi"}]] * 2


def _worker(index: int) -> RolloutWorker:
    cfg = load_config(ROOT / "examples" / "tiny.yaml", ["rollout.max_new_tokens=6"])
    return RolloutWorker(cfg, index=index, num_threads=1)


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
