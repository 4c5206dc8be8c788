"""kill -9 the store process mid-insert; restart on the same data dir; every confirmed insert is back, with its
priority and sample count."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from marti.clients.experience import ExperienceSharingClient
from marti.errors import MartiError
from marti.types.trajectory import Trajectory, Turn

ROOT = Path(__file__).resolve().parents[4]


def start(data_dir: Path, config: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.experience_store", "--port", "0", "--data-dir", str(data_dir),
         "--config", str(config)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"listening on (\S+:\d+)", line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain
            return proc, m.group(1)
        if proc.poll() is not None:
            break
    proc.kill()
    raise RuntimeError(f"store did not start: {line!r}")


def traj(i: int) -> Trajectory:
    turn = Turn(step=0, prompt_token_ids=list(range(50)), response_token_ids=list(range(i % 97)),
                response_logprobs=[-0.1] * (i % 97), reward=float(i))  # fmt: skip
    return Trajectory(episode_id=f"ep{i}", agent_id="a1", turns=[turn])


def test_kill9_keeps_every_confirmed_insert(tmp_path):
    cfg = tmp_path / "tables.yaml"
    cfg.write_text("tables:\n  - {name: replay, preset: prioritized, max_size: 100000}\n")
    data = tmp_path / "data"
    proc, addr = start(data, cfg)
    confirmed: dict[int, float] = {}
    try:
        c = ExperienceSharingClient("a1", addr, timeout_s=10)
        for i in range(50):
            confirmed[c.share_experience(traj(i), table="replay", priority=1.0 + i)] = 1.0 + i
        seen_counts: dict[int, int] = {}
        for s in c.sample("replay", 40):
            seen_counts[s.key] = max(seen_counts.get(s.key, 0), s.times_sampled)
        first = next(iter(confirmed))
        c.update_priorities("replay", {first: 123.0})
        confirmed[first] = 123.0
        stop = threading.Event()

        def writer() -> None:
            i = 1000
            while not stop.is_set():
                try:
                    keys = c.share_experiences([traj(i + j) for j in range(8)], table="replay")
                except MartiError:
                    return
                for k in keys:
                    confirmed[k] = 1.0
                i += 8

        th = threading.Thread(target=writer)
        th.start()
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        stop.set()
        th.join(30)
        c.close()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(confirmed) > 60

    proc, addr = start(data, cfg)
    try:
        c = ExperienceSharingClient("a1", addr, timeout_s=10)
        info = c.info("replay")
        assert info.size >= len(confirmed) and info.samples >= 40 and info.inserts >= len(confirmed)
        stored = {s.key: s for s in c.get_items(agent_id="a1", tables=["replay"])}
        missing = [k for k in confirmed if k not in stored]
        assert not missing, f"{len(missing)} of {len(confirmed)} confirmed inserts lost"
        for k, p in confirmed.items():
            assert stored[k].priority == p, (k, stored[k].priority, p)
        for k, n in seen_counts.items():
            assert stored[k].times_sampled >= n
        assert sum(s.times_sampled for s in stored.values()) == 40
        c.close()
    finally:
        proc.kill()
        proc.wait(10)


def test_keys_are_not_reused_after_a_restart_that_follows_deleting_the_newest(tmp_path):
    """The key counter survives a restart (SIGTERM) even when the items with the highest keys were deleted: a
    priority update of a deleted key must not land on a new item."""
    cfg = tmp_path / "tables.yaml"
    cfg.write_text("tables:\n  - {name: r, preset: prioritized, remover: fifo, max_size: 100}\n")
    data = tmp_path / "data"
    proc, addr = start(data, cfg)
    try:
        c = ExperienceSharingClient("a1", addr, timeout_s=10)
        keys = [c.share_experience(traj(i), table="r", priority=1.0) for i in range(3)]
        assert c.delete("r", ["ep2"]) == 1
        c.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    proc, addr = start(data, cfg)
    try:
        c = ExperienceSharingClient("a1", addr, timeout_s=10)
        new_key = c.share_experience(traj(3), table="r", priority=1.0)
        assert new_key > max(keys), (new_key, keys)
        c.update_priorities("r", {keys[-1]: 9.0})
        assert {s.key: s.priority for s in c.get_items(agent_id="a1", tables=["r"])}[new_key] == 1.0
        c.close()
    finally:
        proc.kill()
        proc.wait(10)
