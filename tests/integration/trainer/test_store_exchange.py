"""The training loop's store exchange over a real experience_store: re-runnable after an interrupted attempt."""

from __future__ import annotations

from pathlib import Path

import pytest

from marti.clients.experience import ExperienceSharingClient
from marti.config import load_config
from marti.rpc.testing import serve_in_thread
from marti.trajectory import Trajectory, Turn
from services.experience_store.__main__ import make_spec
from services.experience_store.settings import StoreSettings
from services.trainer.loop import Addresses, TrainingLoop

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def store(tmp_path):
    settings = StoreSettings(port=0, data_dir=str(tmp_path / "data"), default_timeout_ms=2000)
    with serve_in_thread(lambda: [make_spec(settings)[0]], settings) as server:
        client = ExperienceSharingClient("trainer", server.address, timeout_s=10)
        client.create_table("agent_1", preset="queue", max_size=100)
        yield server.address, client
        client.close()


def _traj(episode: str, reward: float) -> Trajectory:
    turn = Turn(step=0, prompt_token_ids=[1, 2], response_token_ids=[3, 4], response_logprobs=[-0.1, -0.2])
    return Trajectory(
        episode_id=episode, session=episode, agent_id="agent_1", role="executor", policy_version=0,
        turns=[turn], metadata={"seed": 1, "return": reward},
    )  # fmt: skip


def _loop(tmp_path: Path, address: str) -> TrainingLoop:
    cfg = load_config(ROOT / "examples" / "tiny.yaml", [f"output.dir={tmp_path / 'run'}"])
    return TrainingLoop(cfg, Addresses(broker="unused:1", env="unused:1", store=address), show_progress=False)


def test_exchange_returns_each_trajectory_once_in_order(tmp_path, store):
    address, client = store
    loop = _loop(tmp_path, address)
    trajs = [_traj(f"ep-{i}", float(i)) for i in range(5)]
    out = loop._exchange(client, "agent_1", trajs, step=0)
    assert [t.episode_id for t in out] == [f"ep-{i}" for i in range(5)]
    assert [t.metadata["return"] for t in out] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert client.info("agent_1").size == 0 and loop.dropped_items == 0


def test_exchange_after_an_interrupted_attempt_drops_duplicates_and_leftovers(tmp_path, store):
    address, client = store
    loop = _loop(tmp_path, address)
    # What an attempt cut by a store restart leaves behind: a confirmed item of an earlier step that was
    # never sampled, and two of this step's items that the retry will insert again.
    client.share_experiences(
        [_traj("old-step", 9.0), _traj("ep-0", 0.0), _traj("ep-1", 1.0)], table="agent_1"
    )
    trajs = [_traj(f"ep-{i}", float(i)) for i in range(3)]
    out = loop._exchange(client, "agent_1", trajs, step=1)
    assert [t.episode_id for t in out] == ["ep-0", "ep-1", "ep-2"]
    # "old-step" and the first copies of ep-0/ep-1 were sampled and dropped; second copies may remain queued
    assert loop.dropped_items >= 1
    left = client.info("agent_1").size
    assert loop.dropped_items + left == 3, (loop.dropped_items, left)
    # the next step's exchange drains what is left and still returns exactly its own trajectories
    nxt = loop._exchange(client, "agent_1", [_traj("ep-9", 9.0)], step=2)
    assert [t.episode_id for t in nxt] == ["ep-9"] and client.info("agent_1").size == 0
