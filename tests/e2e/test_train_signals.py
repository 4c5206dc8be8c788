"""`marti train` on SIGTERM: finishes the step, checkpoints, writes the report, stops its embedded services."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _train_cmd(run: Path, *overrides: str, progress: bool = False) -> list[str]:
    """`marti train examples/tiny.yaml` into ``run`` with two-turn episodes and the given ``--set`` overrides
    (applied after, so they win), without the progress output unless ``progress``."""
    sets = [arg for o in ("environment.max_turns=2", *overrides, f"output.dir={run}") for arg in ("--set", o)]
    quiet = [] if progress else ["--no-progress"]
    return [sys.executable, "-m", "marti.cli", "train", "examples/tiny.yaml", *quiet, *sets]


def _stack_children(run: Path) -> int:
    out = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
    return sum(1 for line in out.splitlines() if "marti.cli broker" in line and str(run) in line)


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
        time.sleep(0.5)


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
    time.sleep(1)
    assert _stack_children(run) == 0, "the embedded services must stop with the job"


def _descendants(root: int) -> dict[int, str]:
    """Every process below ``root`` (children, their children, ...): pid -> command line."""
    rows = subprocess.run(["ps", "-eww", "-o", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    children: dict[int, list[tuple[int, str]]] = {}
    for line in rows.splitlines():
        pid, ppid, *args = line.split(None, 2)
        children.setdefault(int(ppid), []).append((int(pid), args[0] if args else ""))
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for pid, args in children.get(todo.pop(), []):
            found[pid] = args
            todo.append(pid)
    return found


def _alive(pids: list[int]) -> dict[int, str]:
    """The processes of ``pids`` still running (zombies count as gone): pid -> ``ps`` line."""
    if not pids:
        return {}
    rows = subprocess.run(
        ["ps", "-ww", "-o", "pid=,stat=,args=", "-p", ",".join(map(str, pids))],
        capture_output=True,
        text=True,
    ).stdout
    return {int(r.split()[0]): r for r in rows.splitlines() if r.split()[1][0] != "Z"}


def _left_behind(started: dict[int, str]) -> dict[int, str]:
    """The processes of ``started`` still running 15 s on (each then killed, so that a failure leaves none)."""
    deadline = time.monotonic() + 15
    while _alive(list(started)) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _alive(list(started))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_whole_process_group_stops_like_one_to_the_job(tmp_path, sig):
    """SIGTERM to the job's process group (what `timeout` and `kill -TERM -PGID` send) reached
    Ray's GCS and raylet too: they died, and the job failed a minute later (exit 1) without its report or resume
    line. Ray's processes now run in a session of their own, so it stops as after a SIGTERM to itself, at once
    and leaving no process behind. SIGINT to the group is Ctrl-C in a terminal."""
    run = tmp_path / "run_group"
    proc = subprocess.Popen(
        _train_cmd(run, "max_steps=50", "rollout.eval_every=0"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    started: dict[int, str] = {}
    try:
        _wait_for_first_step(proc, run)
        started = _descendants(proc.pid)
        assert any("raylet" in args for args in started.values()), started
        signalled = time.monotonic()
        os.killpg(proc.pid, sig)
        out, err = proc.communicate(timeout=300)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        left = _left_behind(started)
    how = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C (SIGINT)"
    assert proc.returncode == 128 + sig, err[-3000:]
    assert took < 45, f"{took:.0f}s from the signal to the exit"  # Ray's GCS timeout alone is 60 s
    assert "Traceback" not in err, err[-3000:]
    steps = len((run / "metrics.jsonl").read_text().splitlines())
    assert 1 <= steps < 50
    assert (
        f"stopped by {how} after step {steps} of 50; checkpoint: {run / 'checkpoints' / f'step_{steps:06d}'}"
        in out
    )
    assert "resume with: marti train" in out and f"report: {run / 'report.md'}" in out, out
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{steps:06d}"
    assert (run / "report.md").exists()
    assert not left, left  # Ray, its workers and the embedded services
    rows = subprocess.run(
        ["ps", "-eo", "pgid=,stat=,args="], capture_output=True, text=True
    ).stdout.splitlines()
    group = [r for r in rows if int(r.split()[0]) == proc.pid and r.split()[1][0] != "Z"]
    assert not group, group  # nothing else of the job's process group runs on either


def test_wall_time_budget_stops_before_a_step_that_would_overrun(tmp_path):
    run = tmp_path / "run_budget"
    out = subprocess.run(
        _train_cmd(run, "max_steps=5", "budget.max_wall_time_s=1"),
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "wall-time budget of 1s: stopping at step 1" in out.stderr
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 1
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert (run / "report.md").exists()


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


def test_a_second_ctrl_c_while_the_job_waits_on_ray_stops_at_once(tmp_path):
    """A second Ctrl-C to the job's process group, 4 s into the first step and 2 s after the first Ctrl-C, lands
    while the job waits in ``ray.get`` (400-token replies: the step's generation and update take over 6 s). Ray's
    signal check turned the handler's stop into a ``SystemError``: a traceback, exit 1 and no report. It stops at
    once with the documented lines, exit 130 and no process left (about 25 s here)."""
    run = tmp_path / "run_now"
    sets = ("environment.max_turns=1", "rollout.eval_every=0", "max_steps=3", "rollout.max_new_tokens=400")
    cmd = _train_cmd(run, *sets, progress=True)  # with progress: the rollout line
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )  # fmt: skip
    lines: list[str] = []  # stderr as it comes; stdout drained so the job never blocks on it
    readers = [
        threading.Thread(target=lines.extend, args=(proc.stderr,), daemon=True),
        threading.Thread(target=proc.stdout.read, daemon=True),
    ]
    for reader in readers:
        reader.start()
    started: dict[int, str] = {}
    try:
        _wait_for_line(proc, lines, "rollout: engine", 300)
        started = _descendants(proc.pid)
        time.sleep(4)
        os.killpg(proc.pid, signal.SIGINT)
        _wait_for_line(proc, lines, "stopping after the current step", 30)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
        for reader in readers:
            reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        left = _left_behind(started)
    err = "".join(lines)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "SystemError" not in err, err[-3000:]
    assert "stopped at once by a second Ctrl-C (SIGINT): the step in progress is lost" in err, err[-3000:]
    assert f"run directory {run}" in err or "resume with: marti train" in err, err[-3000:]
    assert f"report: {run / 'report.md'}" in err and (run / "report.md").exists(), err[-3000:]
    assert not left, left


def _wait_for_line(proc: subprocess.Popen, lines: list[str], text: str, timeout: float) -> None:
    """Wait until a line of ``lines`` (the job's stderr, read as it comes) holds ``text``."""
    deadline = time.monotonic() + timeout
    while not any(text in line for line in lines):
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)[-3000:]
        time.sleep(0.05)
