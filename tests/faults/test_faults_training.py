"""Faults during a real training job on the tiny model (slow: each job takes 30-90 s on 2 cores).

1. Kill -9 the broker, then the store, then the env server while ``marti train`` runs; each is restarted by
   the test on the same port and data dir. Expected: the job finishes every step and the store still holds
   every trajectory confirmed before each kill (ids counted through the store's counters). The loop re-runs
   the interrupted rollout or store exchange with backoff (services/trainer/job/connections/reconnect.py).
2. Kill -9 the trainer after its first checkpoint; ``--resume`` finishes the run, and with the fixed seed
   it reaches the same per-step metrics as an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marti.clients.experience import ExperienceSharingClient

from .procs import ROOT, start

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train_cmd(addrs: dict[str, str], run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "marti.command.main", "train", "examples/tiny.yaml", "--no-progress",
            "--broker", addrs["broker"], "--env", addrs["env-server"], "--store", addrs["store"],
            "--set", f"output.dir={run_dir}", "--set", "environment.max_turns=2", *extra]  # fmt: skip


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("kind", "train") == "train"]


def _wait_for(predicate, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"train exited early with {proc.returncode}")
        time.sleep(0.2)
    raise AssertionError("timed out")


def _inserts(address: str) -> int:
    client = ExperienceSharingClient("observer", address, timeout_s=5)
    try:
        return sum(t.inserts for t in client.list_tables())
    finally:
        client.close()


def test_training_survives_broker_store_and_env_restarts(tmp_path):
    ports = {name: _free_port() for name in ("broker", "env-server", "store")}
    data = {"broker": str(tmp_path / "broker"), "store": str(tmp_path / "store")}

    def launch(name: str):
        args = ["--data-dir", data[name]] if name in data else []
        return start(name, "--port", str(ports[name]), *args)

    services = {name: launch(name) for name in ports}
    addrs = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    run_dir = tmp_path / "run"
    train = subprocess.Popen(_train_cmd(addrs, run_dir, "--set", "max_steps=4"), cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        for step, victim in enumerate(("broker", "store", "env-server"), start=1):
            _wait_for(lambda s=step: len(_records(run_dir / "metrics.jsonl")) >= s, 300, train)
            confirmed = _inserts(addrs["store"])
            services[victim].kill9()
            time.sleep(1.0)
            services[victim] = launch(victim)
            assert _inserts(addrs["store"]) >= confirmed, f"confirmed experience lost after {victim} restart"
        _, err = train.communicate(timeout=600)
        assert train.returncode == 0, err[-3000:]
        records = _records(run_dir / "metrics.jsonl")
        assert [r["step"] for r in records] == [1, 2, 3, 4]
        # every step trained on exactly its own trajectories: none lost, none doubled by a re-sent insert
        counts = {r["metrics"]["agent_1/num_samples"] for r in records} | {
            r["metrics"]["agent_2/num_samples"] for r in records
        }
        assert len(counts) == 1, [(r["step"], r["metrics"]["agent_1/num_samples"]) for r in records]
        assert records[-1]["metrics"]["services/reconnects"] >= 1, "no outage reached the loop"
    finally:
        if train.poll() is None:
            train.kill()
        for svc in services.values():
            svc.stop()


def test_trainer_kill9_resumes_to_the_same_metrics(tmp_path):
    services = {
        "broker": start("broker"),
        "env-server": start("env-server"),
        "store": start("store"),
    }
    addrs = {name: svc.address for name, svc in services.items()}
    try:
        clean = tmp_path / "clean"
        out = subprocess.run(_train_cmd(addrs, clean, "--set", "max_steps=3"), cwd=ROOT,
                             capture_output=True, text=True, timeout=900)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]

        crashed = tmp_path / "crashed"
        train = subprocess.Popen(_train_cmd(addrs, crashed, "--set", "max_steps=3"), cwd=ROOT,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)  # fmt: skip
        latest = crashed / "checkpoints" / "latest"
        _wait_for(lambda: latest.exists() and latest.read_text().strip() == "step_000001", 600, train)
        os.killpg(train.pid, signal.SIGKILL)  # the trainer and its Ray workers
        train.wait(timeout=60)
        out = subprocess.run(_train_cmd(addrs, crashed, "--resume", "--set", "max_steps=3"), cwd=ROOT,
                             capture_output=True, text=True, timeout=900)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        want = {r["step"]: r["metrics"] for r in _records(clean / "metrics.jsonl")}
        got = {r["step"]: r["metrics"] for r in _records(crashed / "metrics.jsonl")}
        assert sorted(got) == [1, 2, 3]
        for step in (2, 3):  # steps recomputed after the resume
            for key in ("agent_1/policy_loss", "agent_2/policy_loss"):
                assert got[step][key] == pytest.approx(want[step][key], rel=1e-5, abs=1e-6), (step, key)
    finally:
        for svc in services.values():
            svc.stop()
