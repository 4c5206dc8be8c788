"""A run folder as a user meets it, with real ``marti train`` processes on the tiny model (slow: 25-60 s each).

1. ``--overwrite`` clears an old run; a second job on the same folder is refused while the first runs (the lock
   names the folder and the holder's pid); two Ctrl-C stop the job at once, exit 130, no traceback, and say what
   was saved.
2. One Ctrl-C: exit 130, the checkpoint and the exact resume command are printed; a new run in that folder is
   refused; a resume that changes the model's shape is refused in one line; the printed resume command with
   ``--set learning_rate=0.5`` trains at 0.5 and the folder's record says what changed.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _train_args(run: Path, *extra: str) -> list[str]:
    """``marti train``'s arguments: the tiny config, one-turn episodes, no evaluations, into ``run``."""
    sets = ("environment.max_turns=1", "rollout.eval_every=0", f"output.dir={run}")
    return ["examples/tiny.yaml", "--no-progress", *[a for s in sets for a in ("--set", s)], *extra]


def _marti(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "marti.cli", "train", *args]


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        _marti(args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )  # fmt: skip


def _run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(_marti(args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _wait_for_first_step(proc: subprocess.Popen, run: Path) -> None:
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text().startswith('{"step": 1,')):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no training step within 300 s"
        time.sleep(0.3)


@pytest.mark.slow
def test_overwrite_lock_and_a_second_ctrl_c(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000005").mkdir(parents=True)  # an old run that --overwrite must clear
    (run / "checkpoints" / "latest").write_text("step_000005")
    (run / "metrics.jsonl").write_text('{"step": 5, "time": 0, "metrics": {}}\n')
    (run / "config.yaml").write_text("training_name: old\n")
    # max_steps far off: the job is mid-step when signalled (a finished job that is tearing down only says
    # "already stopping" to a second signal)
    job = _start(_train_args(run, "--set", "max_steps=1000", "--overwrite"))
    try:
        _wait_for_first_step(job, run)
        assert not (run / "checkpoints" / "step_000005").exists()
        assert yaml.safe_load((run / "config.yaml").read_text())["training_name"] == "tiny"

        second = _run(_train_args(run, "--set", "max_steps=1000", "--overwrite"), timeout=120)
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"run folder {run} is in use by another job (pid {job.pid})" in second.stderr
        assert job.poll() is None and (run / "checkpoints").is_dir()  # the refused job touched nothing

        lines: list[str] = []  # stderr, read as it comes; stdout drained so the job never blocks on it
        readers = [
            threading.Thread(target=lines.extend, args=(job.stderr,), daemon=True),
            threading.Thread(target=job.stdout.read, daemon=True),
        ]
        for reader in readers:
            reader.start()
        job.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60  # two signals sent before the first is handled would arrive as one
        while not any("stopping after the current step" in line for line in lines):
            assert time.monotonic() < deadline and job.poll() is None, "".join(lines)[-3000:]
            time.sleep(0.02)
        job.send_signal(signal.SIGINT)  # the second lands during the step the first lets finish
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
        if job.poll() is None:
            job.kill()
    assert job.returncode == 130, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert "stopped at once by a second Ctrl-C (SIGINT)" in err, err[-3000:]
    assert f"checkpoint: {run / 'checkpoints'}" in err and "resume with: marti train" in err
    assert (run / "report.md").exists()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["step"] == 1 and all(r["time"] > 0 for r in records)  # the old run's record is gone


@pytest.mark.slow
def test_ctrl_c_refusals_and_a_resume_with_a_new_learning_rate(tmp_path):
    run = tmp_path / "run"
    args = _train_args(run, "--set", "max_steps=8")
    job = _start(args)
    try:
        _wait_for_first_step(job, run)
        job.send_signal(signal.SIGINT)
        out, err = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 130, err[-3000:]
    assert "done:" not in out
    stopped = [line for line in out.splitlines() if line.startswith("stopped by Ctrl-C (SIGINT) after step")]
    assert stopped and stopped[0].split("after step ")[1].startswith(tuple("1234567")), out
    steps = int(stopped[0].split("after step ")[1].split()[0])
    assert f"checkpoint: {run / 'checkpoints' / f'step_{steps:06d}'}" in stopped[0]
    command = next(line for line in out.splitlines() if line.startswith("resume with: "))[
        len("resume with: ") :
    ]
    assert shlex.split(command) == ["marti", "train", *args, "--resume"]
    assert (run / "report.md").exists()
    record = (run / "config.yaml").read_bytes()

    again = _run(args, timeout=120)  # a new run in a folder that holds one
    assert again.returncode == 2
    assert f"run folder {run} already holds a run" in again.stderr
    assert "--resume" in again.stderr and "--overwrite" in again.stderr
    changed = _run([*args, "--resume", "--set", "policy.lora_r=8"], timeout=120)
    assert changed.returncode == 2 and "Traceback" not in changed.stderr
    assert "policy.lora_r: the checkpoint has 4, the config asks for 8" in changed.stderr
    assert (run / "config.yaml").read_bytes() == record  # a refused job leaves the record as it was

    resumed = _run(
        [*shlex.split(command)[2:], "--set", "learning_rate=0.5", "--set", f"max_steps={steps + 1}"]
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"done: {steps + 1} steps (resumed at step {steps})" in resumed.stdout
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
