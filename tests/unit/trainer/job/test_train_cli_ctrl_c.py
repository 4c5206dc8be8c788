"""Ctrl-C while ``marti train`` checks the job (before its run folder, Ray and services): one line, exit 130."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]

#: ``marti train`` whose dataset pre-checks (a large file's tokenisation, say) take a real SIGINT.
_INTERRUPTED_CHECKS = """
import os, signal, sys, time
from services.trainer.job.cli import train_cli
from services.trainer.job.run import prechecks

# a terminal's default: a process started with SIGINT ignored (a pytest-xdist worker's child) keeps ignoring it
signal.signal(signal.SIGINT, signal.default_int_handler)

def checks(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
    sys.exit("the SIGINT was not delivered")

prechecks.check_before_the_run_folder = checks
sys.exit(train_cli.main(["examples/tiny.yaml", "--set", "output.dir=" + sys.argv[1]]))
"""


def test_ctrl_c_during_the_checks_stops_in_one_line_with_130(tmp_path):
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_CHECKS, str(run)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 130, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "KeyboardInterrupt" not in out.stderr, out.stderr[-3000:]
    assert out.stderr.strip() == "marti train: stopped by Ctrl-C (SIGINT) before the job started"
    assert not run.exists()  # nothing was started
