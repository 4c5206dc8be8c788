"""What ``marti train`` and ``marti eval`` print: the numbers of the config the job ran (a dataset job's loop
resizes its steps and held-out seeds to the rows, ``DatasetTasks.fit``, after the CLI loaded the config), and the
way back into a run stopped before its first checkpoint."""

from __future__ import annotations

import argparse
import contextlib
import signal
from pathlib import Path

import pytest

from marti.config import TrainConfig, load_config
from services.trainer.job.cli import eval_cli, train_cli
from services.trainer.job.connections.addresses import Addresses
from services.trainer.job.run import loop as loop_module
from services.trainer.job.run.summary import RunSummary

ROOT = Path(__file__).resolve().parents[4]


def _sized(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` resized as ``DatasetTasks.fit`` sizes it for 6 training rows and 2 held-out rows."""
    rollout = cfg.rollout.model_copy(
        update={"num_train_seeds": 6, "train_seed_start": 0, "eval_seeds": [6, 7], "eval_episodes": 2}
    )
    return cfg.model_copy(update={"rollout": rollout})


class _Loop:
    """What the CLIs use of a dataset job's TrainingLoop: its resized config, a run ending after ``steps``
    steps, and an evaluation."""

    steps = 1
    stopped = True

    def __init__(self, cfg: TrainConfig, addresses: Addresses, **_: object) -> None:
        self.cfg = _sized(cfg)

    def run(self) -> RunSummary:
        summary = RunSummary(self.cfg.run_dir, steps=self.steps, stopped=self.stopped)
        summary.epochs = self.cfg.epoch_at(self.steps)
        summary.epoch_limited = self.steps == self.cfg.total_steps < self.cfg.max_steps
        summary.last_checkpoint = str(self.cfg.run_dir / "checkpoints" / f"step_{self.steps:06d}")
        summary.report = self.cfg.run_dir / "report.md"
        return summary

    def evaluate_checkpoint(self, ckpt: str | None, baseline: bool) -> dict[str, dict[str, float]]:
        return {"base": {"team/task_completion": 0.5}}


@pytest.fixture
def fake_job(monkeypatch):
    """The CLIs with the fake loop and no services."""
    monkeypatch.setattr(loop_module, "TrainingLoop", _Loop)
    stack = contextlib.nullcontext(Addresses("unused:1", "unused:1", "unused:1"))
    monkeypatch.setattr(train_cli, "service_addresses", lambda cfg, args: stack)
    monkeypatch.setattr(eval_cli, "service_addresses", lambda cfg, args: stack)


def _train(tmp_path: Path, received: list[int], *sets: str) -> int:
    cfg = load_config(ROOT / "examples" / "tiny.yaml", [f"output.dir={tmp_path}", "max_epochs=1", *sets])
    args = argparse.Namespace(resume=False, no_progress=True)
    return train_cli._train(cfg, args, ["examples/tiny.yaml"], None, (None, None), received)


def test_a_budget_stop_names_the_steps_the_dataset_sized(tmp_path, capsys, fake_job):
    # 6 rows, 2 per step, max_epochs=1: 3 steps, not max_steps=4
    assert _train(tmp_path, [], "max_steps=4", "budget.stop_after_steps=1") == 0
    out = capsys.readouterr().out
    assert "stopped by its budget after step 1 of 3;" in out, out


def test_a_ctrl_c_after_the_last_epoch_is_a_finished_job(tmp_path, capsys, fake_job, monkeypatch):
    monkeypatch.setattr(_Loop, "steps", 3)  # max_epochs ended the job at step 3 of max_steps=4
    monkeypatch.setattr(_Loop, "stopped", False)
    assert _train(tmp_path, [signal.SIGINT], "max_steps=4") == 0
    out = capsys.readouterr().out
    assert "done: 3 steps" in out and "max_epochs=1 reached" in out, out
    assert "stopped by" not in out and "resume with" not in out, out


def test_eval_names_the_held_out_rows_it_played(tmp_path, capsys, fake_job):
    code = eval_cli.main(["examples/tiny.yaml", "--set", f"output.dir={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0
    assert "held-out seeds: [6, 7];" in out, out


def test_a_job_stopped_at_once_before_its_first_checkpoint_is_told_to_start_again_with_overwrite(tmp_path):
    cfg = load_config(ROOT / "examples" / "tiny.yaml", [f"output.dir={tmp_path}"])
    (tmp_path / "config.yaml").write_text(
        "training_name: tiny\n"
    )  # the job had started: the folder holds a run
    message = train_cli._stopped_message(cfg, ["examples/tiny.yaml"], signal.SIGINT, True, None)
    assert message == (
        "stopped at once by a second Ctrl-C (SIGINT): the step in progress is lost; no checkpoint was saved; "
        f"run directory {tmp_path}; start it again with --overwrite"
    )
