"""kill -9 the store process while it writes a snapshot (the ``Checkpoint`` rpc): no file named as a snapshot
is left that is not a complete store, and the next checkpoint clears what the killed one left."""

from __future__ import annotations

import random
import sqlite3
import threading
import time

from faults.procs import start

from marti.clients.experience import ExperienceSharingClient
from marti.types.trajectory import Trajectory, Turn


def _team(batch: int, ids: list[int]) -> list[Trajectory]:
    """50 trajectories of 16,000 random token ids (64 KB each: they do not compress away)."""
    return [
        Trajectory(
            episode_id=f"e{batch}-{i}", agent_id="a", turns=[Turn(step=0, prompt_token_ids=ids[i:] + ids[:i])]
        )
        for i in range(50)
    ]


def _items(path) -> int:
    """How many items the store database at ``path`` holds (raises sqlite3.Error when it is not one)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT count(*) FROM items").fetchone()[0]


def test_a_snapshot_cut_by_kill9_is_never_left_under_a_snapshot_name(tmp_path):
    """The snapshot was written under its final name: a kill -9 mid-write left an empty or truncated
    ``snapshot-<ns>.sqlite`` (and its ``-journal``), the newest "snapshot" in the folder; restored as the docs
    say (renamed to ``store.sqlite``), an empty one is a store with no items, without a word."""
    data = tmp_path / "data"
    snapshots = data / "snapshots"
    svc = start("store", "--data-dir", str(data))
    try:
        client = ExperienceSharingClient("a", svc.address, timeout_s=60)
        client.create_table("t", max_size=10**6)
        rng = random.Random(0)
        ids = [rng.randrange(1 << 30) for _ in range(16_000)]
        for batch in range(12):  # 600 items, about 40 MB: its snapshot takes a while to write
            client.share_experiences(_team(batch, ids), table="t")
        threading.Thread(target=lambda: _swallow(client.checkpoint), daemon=True).start()
        deadline = time.monotonic() + 60
        while not (snapshots.exists() and any(snapshots.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.001)
        svc.kill9()
        client.close()
    finally:
        svc.stop()
    left = sorted(p.name for p in snapshots.iterdir())
    assert left, "the checkpoint wrote nothing before the kill"
    for path in snapshots.glob("snapshot-*.sqlite"):
        assert _items(path) == 600, f"{path.name} is not a complete snapshot (the folder holds {left})"
    svc = start("store", "--data-dir", str(data))
    try:
        with ExperienceSharingClient("a", svc.address, timeout_s=60) as client:
            done = client.checkpoint()
        assert [p.name for p in snapshots.iterdir()] == [done.path.rsplit("/", 1)[1]]
        assert _items(done.path) == 600
    finally:
        svc.stop()


def _swallow(fn) -> None:
    """Call ``fn``; the store killed under it fails it (UnavailableError), which is expected here."""
    try:
        fn()
    except Exception:  # noqa: BLE001
        pass
