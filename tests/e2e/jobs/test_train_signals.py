"""`marti train` on SIGTERM: finishes the step, checkpoints, writes the report, stops its embedded services; the
same for a SIGTERM to its whole process group; a Ctrl-C while it waits for external episodes.

A Ctrl-C to the whole group, a second Ctrl-C while the job waits on Ray, and the wall-time budget's stop are
checked by tests/e2e/jobs/test_run_folder.py's jobs, which are stopped so anyway: each job started here costs ~14 s
of start and stop on 2 cores."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.jobs.signalled_jobs import check_stopped_by_a_group_signal, descendants, left_behind

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def _train_cmd(run: Path, *overrides: str, progress: bool = False) -> list[str]:
    """`marti train examples/tiny.yaml` into ``run`` with two-turn episodes and the given ``--set`` overrides
    (applied after, so they win), without the progress output unless ``progress``."""
    sets = [arg for o in ("environment.max_turns=2", *overrides, f"output.dir={run}") for arg in ("--set", o)]
    quiet = [] if progress else ["--no-progress"]
    return [sys.executable, "-m", "marti.command.main", "train", "examples/tiny.yaml", *quiet, *sets]


def _stack_children(run: Path) -> int:
    out = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if "marti.command.main broker" in line and str(run) in line)


def test_sigterm_stops_cleanly_with_checkpoint_and_report(tmp_path):
    run = tmp_path / "run_sigterm"
    proc = subprocess.Popen(
        _train_cmd(run, "max_steps=50", "rollout.eval_every=0"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _stop_after_first_step(proc, run)
    finally:
        if proc.poll() is None:
            proc.kill()


def _wait_for_first_step(proc: subprocess.Popen, run: Path) -> None:
    deadline = time.monotonic() + 300
    metrics = run / "metrics.jsonl"
    while not (metrics.exists() and metrics.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None, "no step within 300 s"
        time.sleep(0.1)


def _stop_after_first_step(proc: subprocess.Popen, run: Path) -> None:
    _wait_for_first_step(proc, run)
    assert _stack_children(run) == 1
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]  # stopped before its last step
    assert "stopping after the current step" in err
    assert "stopped by SIGTERM after step" in out and "resume with: marti train" in out
    steps = len((run / "metrics.jsonl").read_text().splitlines())
    assert 1 <= steps < 50
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{steps:06d}"
    assert (run / "report.md").exists()
    gone = time.monotonic() + 1
    while _stack_children(run) and time.monotonic() < gone:
        time.sleep(0.1)
    assert _stack_children(run) == 0, "the embedded services must stop with the job"


def test_a_sigterm_to_the_whole_process_group_stops_like_one_to_the_job(tmp_path):
    """SIGTERM to the job's process group (what `timeout` and `kill -TERM -PGID` send) reached
    Ray's GCS and raylet too: they died, and the job failed a minute later (exit 1) without its report or resume
    line. Ray's processes now run in a session of their own, so it stops as after a SIGTERM to itself, at once
    and leaving no process behind. (SIGINT to the group, Ctrl-C in a terminal, is
    tests/e2e/jobs/test_run_folder.py's Ctrl-C before a resume.)"""
    run = tmp_path / "run_group"
    proc = subprocess.Popen(
        _train_cmd(run, "max_steps=50", "rollout.eval_every=0"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    started: dict[int, str] = {}
    try:
        _wait_for_first_step(proc, run)
        started = descendants(proc.pid)
        assert any("raylet" in args for args in started.values()), started
        signalled = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=300)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        left = left_behind(started)
    check_stopped_by_a_group_signal(proc, run, 50, signal.SIGTERM, out, err, took, left)


def test_ctrl_c_while_waiting_for_external_episodes_then_again_during_teardown(tmp_path):
    """The first Ctrl-C ends the wait for external episodes at once (the job would wait 300 s); a second one
    that lands while the job stops its gateway, Ray and services must not interrupt that teardown (it left Ray
    reconnecting to a stopped cluster for 60 s): the job still ends with the documented lines and 130."""
    run = tmp_path / "run_external"
    sets = ("rollout.source=external", "rollout.eval_every=0", "max_steps=2", "external.wait_timeout_s=300")
    env = {**os.environ, "MARTI_TOKEN": "signals-token"}  # the gateway's token (_refused_reports sends it)
    proc = subprocess.Popen(
        _train_cmd(run, *sets), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (run / "gateway.json").exists():  # waiting at step 0
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        _refused_reports(json.loads((run / "gateway.json").read_text())["http"])
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        while (run / "gateway.json").exists() and time.monotonic() < signalled + 30:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # the gateway is gone: the job is stopping its actors and services
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - signalled < 30, err[-3000:]
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "GCS" not in err, err[-3000:]
    assert "stopping at step 0: stopped while table" in err
    assert "already stopping" in err
    assert "never trained" not in err + out, err[-3000:]  # both reports were refused: nothing was reported
    assert f"stopped by Ctrl-C (SIGINT) after step 0 of 2; checkpoint: {run / 'checkpoints'}" in out, out
    assert "resume with: marti train" in out
    assert (run / "report.md").exists()


def _refused_reports(http: str) -> None:
    """An episode with a recorded call whose report is refused (400: an agent the job does not train), and a report
    of an episode that made no call (404)."""
    auth = {"Authorization": "Bearer signals-token"}
    body = {"model": "agent_1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    call = httpx.post(
        f"{http}/chat/completions", json=body, headers={**auth, "X-Marti-Episode": "e1"}, timeout=60
    )
    assert call.status_code == 200, call.text
    bad = httpx.post(
        f"{http}/episodes/e1/reward", json={"rewards": {"nobody": 1.0}}, headers=auth, timeout=60
    )
    assert bad.status_code == 400, bad.text
    unknown = httpx.post(
        f"{http}/episodes/nope/reward", json={"rewards": {"agent_1": 1.0}}, headers=auth, timeout=60
    )
    assert unknown.status_code == 404, unknown.text
