"""End to end: `marti up` starts the services as processes, `marti train` runs the main job on a tiny model
against them, then resumes from its checkpoint."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marti.clients.broker import MartiCommClient
from marti.clients.experience import ExperienceSharingClient

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


@pytest.fixture
def stack():
    proc = subprocess.Popen(
        [sys.executable, "-m", "marti.command.main", "up", "--ephemeral-ports", "--no-trainer"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    addrs: dict[str, str] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.match(r"(\S+)\s+SERVING at (\S+)", line)
        if m:
            addrs[m.group(1)] = m.group(2)
        if "all services SERVING" in line or not line:
            break
    assert set(addrs) == {"broker", "env-server", "store"}, addrs
    yield addrs
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "stopped: " in out


def _train(addrs, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "marti.command.main",
        "train",
        "examples/tiny.yaml",
        "--no-progress",
        "--broker",
        addrs["broker"],
        "--env",
        addrs["env-server"],
        "--store",
        addrs["store"],
        "--set",
        f"output.dir={run_dir}",
        "--set",
        "environment.max_turns=2",
        *extra,
    ]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=dict(os.environ))


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_main_job_uses_every_service_and_resumes(stack, tmp_path):
    run_dir = tmp_path / "run"
    first = _train(stack, run_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    records = _records(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        for agent in ("agent_1", "agent_2"):
            loss = r["metrics"][f"{agent}/policy_loss"]
            assert isinstance(loss, float) and math.isfinite(loss)
        assert r["metrics"]["team/num_turns"] == 2  # the env server played both turns
        assert r["metrics"]["team/messages"] >= 1  # teammates' messages came through the broker
    assert (run_dir / "report.md").read_text().startswith("# Run report")
    assert {p.name for p in (run_dir / "plots").glob("*.png")} >= {
        "reward_per_agent.png",
        "task_completion.png",
    }
    assert list((run_dir / "tensorboard").glob("events.*")) if (run_dir / "tensorboard").exists() else True
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert latest == "step_000002"

    # The services' own counters moved.
    comm = MartiCommClient("observer", stack["broker"], session="observer")
    stats = comm.get_broker_stats(whole_broker=True)
    comm.close()
    assert stats.sent > 0 and stats.delivered > 0 and stats.acked > 0, stats
    store = ExperienceSharingClient("observer", stack["store"])
    info = store.info("tiny/agent_1")  # the job's table: <training_name>/<agent>
    store.close()
    assert info.inserts == 8 and info.samples == 8  # 4 episodes x 2 steps, each sampled once
    assert info.size == 0 and info.config.max_policy_lag == 0  # the store was the queue: all consumed

    second = _train(stack, run_dir, "--resume", "--set", "max_steps=3")
    assert second.returncode == 0, second.stderr[-3000:]
    steps = [r["step"] for r in _records(run_dir / "metrics.jsonl")]
    assert steps == [1, 2, 3], steps  # resumed at step 2, did one more
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000003"
