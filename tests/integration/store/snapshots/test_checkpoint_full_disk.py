"""A checkpoint (the ``Checkpoint`` rpc, or ``--snapshot-interval-s``) on a full disk, over real gRPC, with the
data dir on a real 3 MiB filesystem (tmpfs; skipped where this process may not mount one)."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import time

import pytest

from marti.clients.experience import ExperienceSharingClient
from marti.errors import ResourceExhaustedError
from marti.rpc.testing import serve_in_thread
from marti.types.trajectory import Trajectory, Turn
from services.experience_store.__main__ import make_spec
from services.experience_store.settings import StoreSettings


@pytest.fixture
def tiny_disk(tmp_path):
    """A folder on a 3 MiB tmpfs of its own."""
    where = tmp_path / "disk"
    where.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def _traj(i: int) -> Trajectory:
    """About 20 KB of random token ids (they do not compress away)."""
    rng = random.Random(i)
    ids = [rng.randrange(1 << 30) for _ in range(5000)]
    return Trajectory(episode_id=f"e{i}", agent_id="a", turns=[Turn(step=0, prompt_token_ids=ids)])


@pytest.mark.parametrize("fill", [1.0, 0.6], ids=["disk-full", "no-room-for-the-snapshot"])
def test_a_checkpoint_on_a_full_disk_is_resource_exhausted_and_leaves_no_partial_snapshot(tiny_disk, fill):
    """Was INTERNAL ("OperationalError: database or disk is full") with a traceback in the store's log, and a
    snapshot cut off by the full disk stayed behind, holding the space. Now RESOURCE_EXHAUSTED naming the
    snapshot, no partial snapshot file is left, and the store goes on serving what it holds. ``fill``: how much
    of the disk the inserts fill (1.0: until the store refuses one; 0.6: the database fits, its copy does not)."""
    settings = StoreSettings(port=0, data_dir=str(tiny_disk / "data"), wal_checkpoint_mib=0.05)
    with serve_in_thread(lambda: [make_spec(settings)[0]], settings) as server:
        with ExperienceSharingClient("a", server.address, timeout_s=10) as client:
            client.create_table("t", max_size=1000)
            stored = 0
            try:
                while _used(tiny_disk) < fill:
                    client.share_experience(_traj(stored), table="t")
                    stored += 1
            except ResourceExhaustedError as e:
                assert fill == 1.0 and "is full" in e.message, e
            with pytest.raises(
                ResourceExhaustedError, match=r"store snapshot .*snapshot-\d+\.sqlite is full"
            ):
                client.checkpoint()
            assert list((tiny_disk / "data" / "snapshots").iterdir()) == []
            assert client.info("t").size == stored > 0
            assert len(client.sample("t", 2, timeout_s=5)) == 2


def _used(where) -> float:
    """The share of the filesystem of ``where`` in use."""
    st = os.statvfs(where)
    return 1 - st.f_bavail / st.f_blocks


def test_periodic_snapshots_survive_a_full_disk_and_resume_once_there_is_room(tiny_disk):
    """``--snapshot-interval-s``: the first snapshot that failed on a full disk raised sqlite3's error out of the
    snapshot thread, which died: no snapshot ever again, with nothing but a traceback in the log. Now each failure
    is logged and the next interval tries again, so a snapshot is taken once space is freed."""
    filler = tiny_disk / "filler"
    filler.write_bytes(b"\0" * (2 << 20))  # space the test frees later (2 of the disk's 3 MiB)
    settings = StoreSettings(
        port=0, data_dir=str(tiny_disk / "data"), wal_checkpoint_mib=0.05, snapshot_interval_s=0.2
    )
    holder = {}

    def specs():
        spec, holder["servicer"] = make_spec(settings)
        return [spec]

    with serve_in_thread(specs, settings) as server:
        with ExperienceSharingClient("a", server.address, timeout_s=10) as client:
            client.create_table("t", max_size=1000)
            with pytest.raises(ResourceExhaustedError, match="is full"):
                for i in range(1000):
                    client.share_experience(_traj(i), table="t")
            stored = client.info("t").size
            time.sleep(1.0)  # several snapshots fail meanwhile
            thread = holder["servicer"].store._snapshot_thread
            assert thread is not None and thread.is_alive()
            before = set((tiny_disk / "data" / "snapshots").glob("snapshot-*.sqlite"))
            filler.unlink()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                new = set((tiny_disk / "data" / "snapshots").glob("snapshot-*.sqlite")) - before
                if new:
                    break
                time.sleep(0.05)
            assert new, "no snapshot was taken once the disk had room"
            time.sleep(0.5)  # let the one being written finish
            done = max(set((tiny_disk / "data" / "snapshots").glob("snapshot-*.sqlite")) - before)
            with sqlite3.connect(f"file:{done}?mode=ro", uri=True) as conn:
                assert conn.execute("SELECT count(*) FROM items").fetchone()[0] == stored
