"""Helpers of the end-to-end tests that signal a real ``marti train`` job (tests/e2e/jobs/test_train_signals.py,
tests/e2e/jobs/test_run_folder.py): the processes it started, what of them is left after it exits, its stderr read as
it comes, and the checks of a job stopped by one signal to its whole process group."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path


def descendants(root: int) -> dict[int, str]:
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


def alive(pids: list[int]) -> dict[int, str]:
    """The processes of ``pids`` still running (zombies count as gone): pid -> ``ps`` line."""
    if not pids:
        return {}
    rows = subprocess.run(
        ["ps", "-ww", "-o", "pid=,stat=,args=", "-p", ",".join(map(str, pids))],
        capture_output=True,
        text=True,
    ).stdout
    return {int(r.split()[0]): r for r in rows.splitlines() if r.split()[1][0] != "Z"}


def left_behind(started: dict[int, str]) -> dict[int, str]:
    """The processes of ``started`` still running 15 s on (each then killed, so that a failure leaves none)."""
    deadline = time.monotonic() + 15
    while alive(list(started)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = alive(list(started))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def group_members(pgid: int) -> list[str]:
    """The ``ps`` lines of the processes of process group ``pgid`` still running (zombies count as gone)."""
    rows = subprocess.run(["ps", "-eo", "pgid=,stat=,args="], capture_output=True, text=True).stdout
    return [r for r in rows.splitlines() if int(r.split()[0]) == pgid and r.split()[1][0] != "Z"]


def read_stderr(proc: subprocess.Popen) -> tuple[list[str], list[threading.Thread]]:
    """Start reading ``proc``'s stderr line by line into the returned list as it comes, and draining its stdout
    (so the job never blocks on a full pipe); returns the list and the reader threads (join them after the exit)."""
    lines: list[str] = []
    readers = [
        threading.Thread(target=lines.extend, args=(proc.stderr,), daemon=True),
        threading.Thread(target=proc.stdout.read, daemon=True),
    ]
    for reader in readers:
        reader.start()
    return lines, readers


def wait_for_line(proc: subprocess.Popen, lines: list[str], text: str, timeout: float) -> None:
    """Wait until a line of ``lines`` (the job's stderr, read as it comes) holds ``text``; fails with the job's
    last lines when it exits or ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while not any(text in line for line in lines):
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)[-3000:]
        time.sleep(0.02)


def check_stopped_by_a_group_signal(
    proc: subprocess.Popen,
    run: Path,
    max_steps: int,
    sig: int,
    out: str,
    err: str,
    took: float,
    left: dict[int, str],
) -> int:
    """Check a job of ``max_steps`` into ``run`` stopped by ``sig`` sent to its whole process group after its
    first step, as by one to ``marti train`` alone: exit ``128 + sig`` ``took`` < 45 s after the signal (Ray's GCS
    timeout alone is 60 s), no traceback, the stopped, checkpoint, resume and report lines on stdout (``out``),
    the checkpoint and report written, and no process left: none of those it had started (``left``, from
    :func:`left_behind`) and none of its process group. Returns the steps it trained."""
    how = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C (SIGINT)"
    assert proc.returncode == 128 + sig, err[-3000:]
    assert took < 45, f"{took:.0f}s from the signal to the exit"
    assert "Traceback" not in err, err[-3000:]
    steps = len((run / "metrics.jsonl").read_text().splitlines())
    assert 1 <= steps < max_steps, out
    assert (
        f"stopped by {how} after step {steps} of {max_steps}; checkpoint: "
        f"{run / 'checkpoints' / f'step_{steps:06d}'}" in out
    ), out
    assert "resume with: marti train" in out and f"report: {run / 'report.md'}" in out, out
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step_{steps:06d}"
    assert (run / "report.md").exists()
    assert not left, left  # Ray, its workers and the embedded services
    group = group_members(proc.pid)
    assert not group, group  # nothing else of the job's process group runs on either
    return steps
