"""``deploy/submit_job.py`` against a trainer service, as a user meets it: a job whose run folder already holds a
run is refused at SubmitJob with advice SubmitJob can follow (another output.dir or training_name, or ``marti
train --resume``; it has no resume or overwrite field), and a refused job is one line, exit 2, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from marti.rpc.testing import serve_in_thread
from services.trainer.__main__ import build_specs
from services.trainer.job.service.settings import TrainerSettings

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "examples" / "tiny.yaml"


@pytest.fixture(scope="module")
def trainer():
    """A trainer service with no services behind it: the refusals come before a job starts."""
    settings = TrainerSettings(port=0)
    with serve_in_thread(build_specs(settings), settings) as server:
        yield server.address


def _submit(
    address: str, config: Path, *overrides: str, unset: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    args = [sys.executable, str(ROOT / "deploy" / "submit_job.py"), address, str(config), "--timeout-s", "30"]
    for o in overrides:
        args += ["--set", o]
    for key in unset:
        args += ["--unset", key]
    return subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT)


def _one_line(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def test_a_run_folder_that_holds_a_run_is_refused_with_advice_submit_job_can_follow(trainer, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("training_name: tiny\n")  # what a started job leaves
    out = _submit(trainer, TINY, f"output.dir={run}")
    assert out.returncode == 2, out
    line = _one_line(out)
    assert line.startswith(
        f"submit_job.py: error: FailedPreconditionError: run folder {run} already holds a run;"
    )
    assert "another output.dir or training_name" in line and "marti train CONFIG --resume" in line, line
    assert "--overwrite" not in line, line
    assert "submitted job" not in out.stdout


def test_a_config_naming_user_code_is_one_line(trainer, tmp_path):
    cfg = tmp_path / "user_code.yaml"
    cfg.write_text(
        TINY.read_text().replace('env_name: "collaborative_task_solving"', 'env_name: "my_envs.py:f"')
    )
    out = _submit(trainer, cfg, f"output.dir={tmp_path / 'run'}")
    assert out.returncode == 2, out
    assert "PermissionDeniedError: this trainer does not run user code" in _one_line(out)


def test_a_config_file_that_cannot_be_read_is_one_line(trainer, tmp_path):
    """A mistyped config path printed a FileNotFoundError traceback, exit 1; now one line naming the file, exit 2,
    before anything is sent (a folder given as the config likewise)."""
    for path, why in ((tmp_path / "nope.yaml", "No such file or directory"), (tmp_path, "Is a directory")):
        out = _submit(trainer, path)
        assert out.returncode == 2, out
        assert _one_line(out) == f"submit_job.py: error: cannot read the config {str(path)!r}: {why}"


def test_unset_drops_the_files_lora_keys_before_the_text_is_sent(trainer, tmp_path):
    """``--set policy.mode=per_agent`` on tiny.yaml (lora_r 4, lora_alpha 8) is refused in one line naming the
    ``--unset`` fix; with it the config passes and the next check (a run folder that holds a run) refuses."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("training_name: tiny\n")
    sets = ("policy.mode=per_agent", f"output.dir={run}")
    line = _one_line(_submit(trainer, TINY, *sets))
    assert "policy.lora_r=4 (default 8)" in line and "--unset policy.lora_r --unset policy.lora_alpha" in line
    out = _submit(trainer, TINY, *sets, unset=("policy.lora_r", "policy.lora_alpha"))
    assert "already holds a run" in _one_line(out) and out.returncode == 2
    line = _one_line(_submit(trainer, TINY, *sets, unset=("policy.lora_rr",)))
    assert "unknown config key 'policy.lora_rr' in --unset 'policy.lora_rr'" in line, line
