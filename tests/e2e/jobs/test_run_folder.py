"""A run folder as a user meets it, with real ``marti train`` processes on the tiny model (slow: 25-60 s each).
Both jobs are stopped by Ctrl-C in a terminal: SIGINT to the job's whole process group.

1. ``--overwrite`` clears an old run; a second job on the same folder is refused while the first runs (the lock
   names the folder and the holder's pid); two Ctrl-C stop the job at once, exit 130, no traceback, no process
   left, and say what was saved, also when the second lands while the job waits in ``ray.get``.
2. One Ctrl-C: exit 130, the checkpoint and the exact resume command are printed, no process is left; a new run
   in that folder is refused; a resume that changes the model's shape is refused in one line; the printed resume
   command with ``--set learning_rate=0.5`` and a 0.1 s wall-time budget trains one step at 0.5, stops before
   the next (exit 0), and the folder's record says what changed.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.jobs.signalled_jobs import (
    check_stopped_by_a_group_signal,
    descendants,
    group_members,
    left_behind,
    read_stderr,
    wait_for_line,
)

ROOT = Path(__file__).resolve().parents[3]


def _train_args(run: Path, *extra: str) -> list[str]:
    """``marti train``'s arguments: the tiny config, one-turn episodes, no evaluations, into ``run``."""
    sets = ("environment.max_turns=1", "rollout.eval_every=0", f"output.dir={run}")
    return ["examples/tiny.yaml", "--no-progress", *[a for s in sets for a in ("--set", s)], *extra]


def _marti(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "marti.command.main", "train", *args]


def _start(args: list[str]) -> subprocess.Popen:
    """``marti train args`` in a process group of its own (its pid is the group's id), as a terminal starts it."""
    return subprocess.Popen(
        _marti(args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True,
    )  # fmt: skip


def _kill(job: subprocess.Popen) -> None:
    """Kill what is left of ``job``'s process group (after a failed check)."""
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def _run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(_marti(args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _wait_for_first_step(proc: subprocess.Popen, run: Path, lines: list[str] | None = None) -> None:
    """Wait until ``run``'s ``metrics.jsonl`` holds step 1; fails with the job's last stderr (``lines`` when
    its stderr is being read into them) when it exits first or 300 s pass."""
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().startswith('{"step": 1,')):
        assert proc.poll() is None, (
            "".join(lines)[-3000:] if lines is not None else proc.communicate()[1][-3000:]
        )
        assert time.monotonic() < deadline, "no training step within 300 s"
        time.sleep(0.1)


def _wait_for_the_record(proc: subprocess.Popen, run: Path, lines: list[str]) -> bytes:
    """Wait until the job ``proc`` has recorded its start in ``run/config.yaml`` (just before its first step) and
    return the file's bytes; fails with the job's last stderr ``lines`` when it exits first or 300 s pass."""
    path = run / "config.yaml"
    deadline = time.monotonic() + 300
    while not (path.exists() and b"training_name: tiny" in path.read_bytes()):
        assert proc.poll() is None, "".join(lines)[-3000:]
        assert time.monotonic() < deadline, "the job did not start within 300 s"
        time.sleep(0.1)
    return path.read_bytes()


@pytest.mark.slow
def test_overwrite_lock_and_a_second_ctrl_c_while_the_job_waits_on_ray(tmp_path):
    """The second Ctrl-C, 4 s into the second step and 0.5 s after the job printed that the first one stops it
    after the step, lands while the job waits in ``ray.get`` (400-token replies: a step takes several seconds;
    with 2 s instead of 0.5 s, a busy machine once finished the step first and the job was already tearing down). Ray's signal check turned the
    handler's stop into a ``SystemError``: a traceback, exit 1 and no report. It stops at once with the
    documented lines, exit 130 and no process left."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000005").mkdir(parents=True)  # an old run that --overwrite must clear
    (run / "checkpoints" / "latest").write_text("step_000005")
    (run / "metrics.jsonl").write_text('{"step": 5, "time": 0, "metrics": {}}\n')
    (run / "config.yaml").write_text("training_name: old\n")
    # max_steps far off: the job is mid-step when signalled (a finished job that is tearing down only says
    # "already stopping" to a second signal)
    args = _train_args(run, "--set", "max_steps=1000", "--set", "rollout.max_new_tokens=400", "--overwrite")
    job = _start(args)
    lines, readers = read_stderr(job)  # stderr as it comes
    started: dict[int, str] = {}
    try:
        record = _wait_for_the_record(job, run, lines)  # the job has started: its first step comes next
        started = descendants(job.pid)
        assert not (run / "checkpoints" / "step_000005").exists()
        assert yaml.safe_load(record)["training_name"] == "tiny"

        second = _run(args, timeout=120)  # while the first job plays its first step
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"run folder {run} is in use by another job (pid {job.pid})" in second.stderr
        # the refused job touched nothing
        assert job.poll() is None and (run / "config.yaml").read_bytes() == record

        _wait_for_first_step(job, run, lines)
        time.sleep(4)  # into the second step's generation
        os.killpg(job.pid, signal.SIGINT)
        # two signals sent before the first is handled would arrive as one
        wait_for_line(job, lines, "stopping after the current step", 60)
        time.sleep(0.5)
        os.killpg(job.pid, signal.SIGINT)  # the second lands during the step the first lets finish
        try:
            job.wait(timeout=120)
        except subprocess.TimeoutExpired:  # say where it hung: the job's own last lines
            raise AssertionError(
                "the job did not exit 120 s after a second Ctrl-C:\n" + "".join(lines)[-3000:]
            ) from None
        for reader in readers:
            reader.join(timeout=10)
        err = "".join(lines)
    finally:
        _kill(job)
        left = left_behind(started)
    assert job.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "SystemError" not in err, err[-3000:]
    assert "stopped at once by a second Ctrl-C (SIGINT): the step in progress is lost" in err, err[-3000:]
    assert f"checkpoint: {run / 'checkpoints'}" in err and "resume with: marti train" in err
    assert f"report: {run / 'report.md'}" in err and (run / "report.md").exists(), err[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 1 and all(r["time"] > 0 for r in records)  # the old run's record is gone
    assert not left, left  # Ray, its workers and the embedded services
    group = group_members(job.pid)
    assert not group, group


@pytest.mark.slow
def test_ctrl_c_refusals_and_a_resume_with_a_new_learning_rate_and_a_budget(tmp_path):
    run = tmp_path / "run"
    args = _train_args(run, "--set", "max_steps=8")
    job = _start(args)
    started: dict[int, str] = {}
    try:
        _wait_for_first_step(job, run)
        started = descendants(job.pid)
        assert any("raylet" in a for a in started.values()), started
        signalled = time.monotonic()
        os.killpg(job.pid, signal.SIGINT)
        out, err = job.communicate(timeout=300)
        took = time.monotonic() - signalled
    finally:
        _kill(job)
        left = left_behind(started)
    steps = check_stopped_by_a_group_signal(job, run, 8, signal.SIGINT, out, err, took, left)
    assert "done:" not in out
    command = next(line for line in out.splitlines() if line.startswith("resume with: "))[
        len("resume with: ") :
    ]
    assert shlex.split(command) == ["marti", "train", *args, "--resume"]
    record = (run / "config.yaml").read_bytes()

    again = _run(args, timeout=120)  # a new run in a folder that holds one
    assert again.returncode == 2
    assert f"run folder {run} already holds a run" in again.stderr
    assert "--resume" in again.stderr and "--overwrite" in again.stderr
    changed = _run([*args, "--resume", "--set", "policy.lora_r=8"], timeout=120)
    assert changed.returncode == 2 and "Traceback" not in changed.stderr
    assert "policy.lora_r: the checkpoint has 4, the config asks for 8" in changed.stderr
    assert (run / "config.yaml").read_bytes() == record  # a refused job leaves the record as it was

    # a resumed job may run in chunks too: a wall-time budget shorter than any step stops it after its first step
    # (the budget never stops a job before its first), before a second that would overrun it
    resumed = _run(
        [*shlex.split(command)[2:], "--set", "learning_rate=0.5", "--set", f"max_steps={steps + 4}"]
        + ["--set", "budget.max_wall_time_s=0.1"]
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"done: {steps + 1} steps (resumed at step {steps})" in resumed.stdout
    budget = [line for line in resumed.stderr.splitlines() if "wall-time budget of" in line]
    assert budget and f": stopping at step {steps + 1} (" in budget[0], resumed.stderr[-3000:]
    checkpoint = run / "checkpoints" / f"step_{steps + 1:06d}"
    assert (
        f"stopped by its budget after step {steps + 1} of {steps + 4}; checkpoint: {checkpoint}"
        in resumed.stdout
    )
    assert (run / "checkpoints" / "latest").read_text().strip() == checkpoint.name
    assert (run / "report.md").exists()
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == steps + 1 and last["metrics"]["agent_1/lr"] == pytest.approx(0.5)
    assert yaml.safe_load((run / "config.yaml").read_text())["learning_rate"] == 0.5
    history = [json.loads(line) for line in (run / "config_history.jsonl").read_text().splitlines()]
    assert [h["start_step"] for h in history] == [0, steps]
    assert history[1]["changed"]["learning_rate"] == [0.001, 0.5]
    assert history[1]["resumed_from"] == str(run / "checkpoints" / f"step_{steps:06d}")


def test_resume_without_a_checkpoint_names_the_folder(tmp_path):
    run = tmp_path / "empty"
    out = _run(_train_args(run, "--resume"), timeout=120)
    assert out.returncode == 2
    assert f"--resume: run folder {run} has no checkpoint" in out.stderr
    assert not (run / "config.yaml").exists()
