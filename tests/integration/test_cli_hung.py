"""``marti up`` with a hung service (SIGSTOP: alive, no health answer): it is killed after ``--health-failures``
failed checks and restarted with its data under the restart policy, or stops the stack with ``--restart no``;
SIGINT while a restarted service's wait for SERVING is in progress stops everything at once, exit 0."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from log_wait import wait_for

from marti.clients.experience import ExperienceSharingClient
from marti.types.trajectory import Trajectory, Turn

FAST_PROBE = [
    *("--health-interval-s", "0.5", "--health-timeout-s", "0.5", "--health-failures", "2"),
    *("--health-kill-grace-s", "0.5"),
]


def _up(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, Path]:
    """``marti up --no-trainer --ephemeral-ports --data-dir tmp/data FLAGS`` with stdout to ``tmp/out`` and
    stderr to ``tmp/err``; returns the process and the data dir."""
    data = tmp_path / "data"
    cmd = [sys.executable, "-m", "marti.command.main", "up", "--no-trainer", "--ephemeral-ports"]
    cmd += ["--data-dir", str(data), *flags]
    with (tmp_path / "out").open("w") as out, (tmp_path / "err").open("w") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, text=True), data


_STOPPED: list[psutil.Process] = []


def _stop(data_dir: Path) -> int:
    """SIGSTOP the service holding ``data_dir`` (its lock file holds the pid); returns the pid."""
    return _sigstop(psutil.Process(int((data_dir / ".lock").read_text())))


def _sigstop(proc: psutil.Process) -> int:
    """SIGSTOP ``proc`` (remembered for :func:`_end`); returns its pid."""
    _STOPPED.append(proc)
    proc.send_signal(signal.SIGSTOP)
    return proc.pid


def _end(up: subprocess.Popen) -> None:
    """Kill ``marti up`` if a failed test left it running, and the processes the test stopped (a stopped one
    would never see that its parent died)."""
    if up.poll() is None:
        up.kill()
        up.wait()
    while _STOPPED:
        proc = _STOPPED.pop()
        try:
            proc.kill()  # psutil checks it is still the same process (not a reused pid)
        except psutil.NoSuchProcess:
            pass


def _hung_line(pid: int) -> str:
    return (
        f"marti up: store (pid {pid}) failed 2 health checks in a row (every 0.5 s, 0.5 s timeout; last: "
        "UNREACHABLE: DEADLINE_EXCEEDED); killing it (SIGTERM, SIGKILL after 0.5 s)"
    )


def test_marti_up_restarts_a_hung_store_with_its_data_until_its_limit(tmp_path):
    """A stopped store was never restarted (its process had not exited). Now it is killed after 2 failed
    checks, restarted on its port with its data dir (the 5 items inserted before are read back through the same
    client), and a second hang over ``--max-restarts 1`` stops the stack, exit 1."""
    up, data = _up(tmp_path, "--max-restarts", "1", "--restart-backoff-s", "0.1", *FAST_PROBE)
    err = tmp_path / "err"
    try:
        lines = wait_for(tmp_path / "out", "all services SERVING", up)
        address = dict(re.findall(r"^(\S+)\s+SERVING at (\S+)$", lines, re.M))
        store = ExperienceSharingClient("a1", address["store"], timeout_s=10)
        turn = Turn(
            step=0, prompt_token_ids=[1], response_token_ids=[2], response_logprobs=[-0.5], reward=1.0
        )
        store.share_experiences([Trajectory(f"ep{i}", "a1", turns=[turn]) for i in range(5)])

        pid = _stop(data / "store")
        log = wait_for(err, "store SERVING again", up)
        assert _hung_line(pid) in log, log
        assert (
            "marti up: store hung and was killed (code -9 (SIGKILL)); restarting it in 0.1 s "
            "(restart 1 of at most 1 within 60 s)"
        ) in log, log
        assert f"marti up: store SERVING again at {address['store']} (restart 1)" in log, log
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert int((data / "store" / ".lock").read_text()) != pid
        assert {t.episode_id for t in store.get_trajectories(agent_id="a1")} == {f"ep{i}" for i in range(5)}
        store.close()

        pid = _stop(data / "store")  # a second failure within the window: over --max-restarts 1
        assert up.wait(timeout=60) == 1
        log = err.read_text()
        assert _hung_line(pid) in log, log
        assert (
            "marti up: error: store hung and was killed (code -9 (SIGKILL)); restarted 1 times within 60 s "
            "already (--max-restarts 1, --restart-window-s 60); stopping the stack"
        ) in log, log
        assert "Traceback" not in log, log
    finally:
        _end(up)


def test_marti_up_restart_no_stops_the_stack_on_a_hung_service(tmp_path):
    """``--restart no``: a hung store is killed and reported, and the stack stops, exit 1, as for a crash."""
    up, data = _up(tmp_path, "--restart", "no", *FAST_PROBE)
    try:
        wait_for(tmp_path / "out", "all services SERVING", up)
        pid = _stop(data / "store")
        assert up.wait(timeout=60) == 1
    finally:
        _end(up)
    log = (tmp_path / "err").read_text()
    assert _hung_line(pid) in log, log
    assert (
        "marti up: error: store hung and was killed (code -9 (SIGKILL)); not restarted (--restart no); "
        "stopping the stack"
    ) in log, log
    assert "restarting it" not in log and "Traceback" not in log, log


def test_sigint_during_a_restarts_wait_for_serving_stops_at_once(tmp_path):
    """The restarted store is stopped (SIGSTOP) before it listens, so ``marti up`` waits for it; SIGINT then
    acted only when that wait ended (after 60 s; never, before the wait for the address had a deadline). Now
    every service stops within seconds, exit 0, none left behind."""
    up, data = _up(tmp_path, "--restart-backoff-s", "0.1")
    try:
        wait_for(tmp_path / "out", "all services SERVING", up)
        old = int((data / "store" / ".lock").read_text())
        others = [int((data / name / ".lock").read_text()) for name in ("broker",)]
        os.kill(old, signal.SIGKILL)
        restarted = _new_store_child(up, old)
        _sigstop(restarted)
        wait_for(tmp_path / "err", "restarting it in 0.1 s", up)
        time.sleep(1.0)  # the restart is under way, waiting for the stopped store
        assert up.poll() is None
        start = time.monotonic()
        up.send_signal(signal.SIGINT)
        code = up.wait(timeout=30)
        took = time.monotonic() - start
        pids = [restarted.pid, *others]
        deadline = (
            time.monotonic() + 10
        )  # a process still ending (or an orphan init has yet to reap) goes soon
        while (left := _running(pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        _end(up)
    log = (tmp_path / "err").read_text()
    assert code == 0, log
    assert took < 10, (took, log)
    assert "SERVING again" not in log and "Traceback" not in log, log
    assert "stopped: " in (tmp_path / "out").read_text()
    assert left == [], left  # none left behind, the stopped one included


def _running(pids: list[int]) -> list[int]:
    """Those of ``pids`` whose process still runs (gone or a zombie: not running)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def _new_store_child(up: subprocess.Popen, old: int, timeout_s: float = 30) -> psutil.Process:
    """The store process ``marti up`` started in place of ``old``, once it runs ``marti.command.main store`` (exec'd)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in psutil.Process(up.pid).children():
            try:
                if child.pid != old and "store" in child.cmdline():
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.005)
    pytest.fail("marti up started no new store")
