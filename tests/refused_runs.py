"""``marti train --overwrite`` over an earlier run, as a user runs it: for the tests that a refused job leaves that
run alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

OLD_METRICS = '{"step": 1}\n'


def train_over_an_old_run(tmp_path: Path, job: dict[str, Any]) -> subprocess.CompletedProcess:
    """Write an earlier run's ``metrics.jsonl`` and checkpoint (``checkpoints/step_000001``, named by
    ``checkpoints/latest``) in ``tmp_path/old_run``, then run ``marti train JOB --overwrite`` with ``output.dir``
    there (in a subprocess, 120 s at most); assert the job was refused (exit 2) and the earlier run is untouched;
    returns the process (its ``stderr`` holds the refusal)."""
    old = tmp_path / "old_run"
    (old / "checkpoints" / "step_000001").mkdir(parents=True)
    (old / "checkpoints" / "step_000001" / "state.pt").write_bytes(b"weights")
    (old / "checkpoints" / "latest").write_text("step_000001")
    (old / "metrics.jsonl").write_text(OLD_METRICS)
    config = tmp_path / "job.yaml"
    config.write_text(json.dumps({**job, "output": {"dir": str(old)}}))
    proc = subprocess.run(
        [sys.executable, "-m", "marti.command.main", "train", str(config), "--overwrite"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert (old / "metrics.jsonl").read_text() == OLD_METRICS  # the old run is still there
    assert (old / "checkpoints" / "step_000001" / "state.pt").read_bytes() == b"weights"
    return proc
