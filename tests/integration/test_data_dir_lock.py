"""A second store or broker started on a --data-dir that a running one holds is refused at once: exit code 2, one
line naming the folder and the holder's pid (both would otherwise serve one SQLite file with divergent state)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def serve(module: str, data_dir: Path) -> subprocess.Popen:
    """Start ``python -m MODULE --port 0 --data-dir DATA_DIR`` and wait until it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--port", "0", "--data-dir", str(data_dir)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    for line in proc.stdout:
        if re.search(r"listening on \S+:\d+", line):
            return proc
    proc.kill()
    raise RuntimeError(f"{module} did not start (exit {proc.wait()})")


@pytest.mark.parametrize(
    ("module", "what"), [("services.experience_store", "store"), ("services.comm_broker", "broker")]
)
def test_second_process_on_a_held_data_dir_is_refused(tmp_path, module, what):
    data = tmp_path / "data"
    first = serve(module, data)
    try:
        second = subprocess.run(
            [sys.executable, "-m", module, "--port", "0", "--data-dir", str(data)],
            cwd=ROOT, capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        assert second.returncode == 2, second.stderr[-2000:]
        assert "Traceback" not in second.stderr
        assert f"{what} data dir {data} is in use by another process (pid {first.pid})" in second.stderr
        assert first.poll() is None
    finally:
        first.terminate()
        first.wait(30)
    # released on exit: a new one starts on the same folder
    again = serve(module, data)
    again.terminate()
    again.wait(30)
