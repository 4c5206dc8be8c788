"""Checkpoint folders of a run: atomic publication, pruning that keeps ``latest``, and finding what exists."""

from __future__ import annotations

from pathlib import Path

from marti.config import load_config
from services.trainer.job.connections.addresses import Addresses
from services.trainer.job.run.loop import TrainingLoop
from services.trainer.job.run.run_dir import latest_checkpoint

ROOT = Path(__file__).resolve().parents[4]


class _Runtime:
    """Writes what a real runtime's ``save`` writes, in miniature: one file per part."""

    def save(self, path: str, position: dict) -> str:
        Path(path).mkdir(parents=True)
        (Path(path) / "worker_0").mkdir()
        (Path(path) / "worker_0" / "state.json").write_text(str(position["step"]))
        return path


def test_a_checkpoint_is_published_whole_and_pruning_keeps_the_one_latest_names(tmp_path):
    cfg = load_config(
        ROOT / "examples" / "tiny.yaml", [f"output.dir={tmp_path}", "output.keep_checkpoints=1"]
    )
    ckpts = tmp_path / "checkpoints"
    (ckpts / "step_000005").mkdir(parents=True)  # an older run's later step
    loop = TrainingLoop(cfg, Addresses("unused:1", "unused:1", "unused:1"), show_progress=False)
    path = Path(loop._checkpoint(_Runtime(), 1))
    assert path == ckpts / "step_000001" and (path / "worker_0" / "state.json").read_text() == "1"
    assert (path / "config.yaml").is_file()  # what a resume checks its config against
    assert (ckpts / "latest").read_text() == "step_000001"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000001"]  # no temp folder left
    loop._checkpoint(_Runtime(), 1)  # the same step again (the final save) replaces it whole
    assert latest_checkpoint(tmp_path) == ckpts / "step_000001"


def test_a_dangling_latest_falls_back_to_the_newest_step_folder(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for step in (2, 4):
        (ckpts / f"step_00000{step}").mkdir(parents=True)
    (ckpts / ".tmp-step_000006").mkdir()  # an interrupted save is never a checkpoint
    (ckpts / "latest").write_text("step_000009")
    assert latest_checkpoint(tmp_path) == ckpts / "step_000004"
    (ckpts / "latest").unlink()
    assert latest_checkpoint(tmp_path) == ckpts / "step_000004"
    assert latest_checkpoint(tmp_path / "nothing") is None


def _dataset_job(run: Path, data: Path):
    from marti.config import config_from_dict

    return config_from_dict(
        {"training_name": "t", "num_agents": 1,
         "agents": [{"name": "solver", "pretrain_model": "tiny-llama", "role": "solver"}],
         "dataset": {"path": f"jsonl:{data}", "eval_fraction": 0.2}, "output": {"dir": str(run)}}
    )  # fmt: skip


def _resume_warnings(cfg, caplog) -> list[str]:
    """What ``prepare(resume=True)`` (``marti train --resume``) logs, as warnings."""
    from services.trainer.job.run.run_dir import RunFolder

    caplog.clear()
    with caplog.at_level("WARNING", logger="services.trainer.job.run.run_dir"):
        RunFolder(cfg.run_dir).prepare(cfg, resume=True, overwrite=False)
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_a_resume_on_a_changed_or_other_dataset_file_warns_naming_what_changed(tmp_path, caplog):
    """A fresh-user review: ``--resume`` with an edited file or another ``--dataset`` was only recorded."""
    from services.trainer.job.run.run_dir import RunFolder, read_history

    rows = "".join(f'{{"prompt": "What is {i} + {i}?", "answer": "{2 * i}"}}\n' for i in range(10))
    data, run = tmp_path / "rows.jsonl", tmp_path / "run"
    data.write_text(rows)
    cfg = _dataset_job(run, data)
    folder = RunFolder(run)
    folder.lock()  # creates the folder, as marti train does
    folder.prepare(cfg, resume=False, overwrite=False)
    folder.record_start(cfg, 0)  # what a job that started records
    folder.unlock()
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    assert read_history(run)[0]["dataset"]["path"] == f"jsonl:{data}"
    assert _resume_warnings(cfg, caplog) == []  # the same data: nothing to say
    data.write_text(rows.replace('"18"', '"19"'))  # the file edited
    (warning,) = _resume_warnings(cfg, caplog)
    assert (
        f"--resume: the dataset differs from the one this run last started with (config_history.jsonl): the content of dataset.path 'jsonl:{data}' changed (sha256 "
        in warning
    )
    other = tmp_path / "copy.jsonl"
    other.write_text(rows)  # the run's original rows, under another path
    (warning,) = _resume_warnings(_dataset_job(run, other), caplog)
    assert f"dataset.path 'jsonl:{data}' -> 'jsonl:{other}' (same content)" in warning
    assert "does not continue the run's epoch where it stopped" in warning
    from marti.data.fingerprint import source_sha256

    assert source_sha256("hf:org/name") is None  # a hub dataset: its spec is recorded, no bytes to hash


def test_a_run_without_a_checkpoint_is_restarted_with_overwrite_and_both_refusals_say_so(tmp_path):
    """A job killed before its first checkpoint leaves a run (config.yaml, logged steps) that --resume cannot
    continue: the refusal of a new run and that of --resume both name --overwrite; --overwrite starts it again.
    A run with a checkpoint keeps its protection."""
    import pytest

    from marti.errors import FailedPreconditionError, NotFoundError
    from services.trainer.job.run.run_dir import SUBMIT_JOB_WAYS_OUT, RunFolder

    cfg = load_config(ROOT / "examples" / "tiny.yaml", [f"output.dir={tmp_path}"])
    (tmp_path / "config.yaml").write_text("training_name: tiny\n")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "time": 1, "metrics": {}}\n')
    with pytest.raises(FailedPreconditionError) as new_run:
        RunFolder(tmp_path).prepare(cfg, resume=False, overwrite=False)
    assert str(new_run.value) == (
        f"run folder {tmp_path} already holds a run; it has no checkpoint (its job stopped before saving one), so "
        "--resume cannot continue it: start it again with --overwrite, or set another output.dir"
    )
    with pytest.raises(NotFoundError) as resumed:
        RunFolder(tmp_path).prepare(cfg, resume=True, overwrite=False)
    assert str(resumed.value) == (
        f"--resume: run folder {tmp_path} has no checkpoint (checkpoints/step_*); start a new run with "
        "--overwrite (there is no checkpoint to lose)"
    )
    with pytest.raises(FailedPreconditionError, match="SubmitJob cannot resume or replace a run"):
        RunFolder(tmp_path, SUBMIT_JOB_WAYS_OUT).refuse_a_held_run()  # a TrainerService job: its own advice
    assert RunFolder(tmp_path).prepare(cfg, resume=False, overwrite=True) is None
    assert not (tmp_path / "metrics.jsonl").exists()

    (tmp_path / "checkpoints" / "step_000002").mkdir(parents=True)
    with pytest.raises(
        FailedPreconditionError, match="continue it with --resume, replace it with --overwrite"
    ):
        RunFolder(tmp_path).prepare(cfg, resume=False, overwrite=False)
    with pytest.raises(NotFoundError, match="start a new run without --resume"):
        RunFolder(tmp_path / "empty").prepare(cfg, resume=True, overwrite=False)  # no run at all


def test_a_resume_with_changed_settings_says_them_and_that_the_lr_schedule_follows_a_new_length(
    tmp_path, caplog
):
    """A new user resumed with another max_steps: the LR at the next step changed (0.000998 -> 0.00089) and only
    config_history.jsonl said why. The resumed job's log now names every changed key, and the schedule."""
    from marti.config import load_config
    from services.trainer.job.run.run_dir import RunFolder

    run = tmp_path / "run"
    first = load_config(ROOT / "examples" / "tiny.yaml", [f"output.dir={run}", "lr_scheduler=cosine"])
    folder = RunFolder(run)
    folder.lock()
    folder.prepare(first, resume=False, overwrite=False)
    with caplog.at_level("WARNING", logger="services.trainer.job.run.run_dir"):
        folder.record_start(first, 0)
    assert "changed settings" not in caplog.text  # a new run changes nothing
    (run / "checkpoints" / "step_000001").mkdir(parents=True)
    for sets, schedule in ((["max_steps=8"], True), (["max_steps=8", "learning_rate=0.002"], False)):
        cfg = load_config(
            ROOT / "examples" / "tiny.yaml", [f"output.dir={run}", "lr_scheduler=cosine", *sets]
        )
        folder.prepare(cfg, resume=True, overwrite=False)
        caplog.clear()
        with caplog.at_level("WARNING", logger="services.trainer.job.run.run_dir"):
            folder.record_start(cfg, 1)
        if schedule:
            assert (
                "--resume at step 1 with changed settings (config_history.jsonl): max_steps 2 -> 8"
                in caplog.text
            )
            assert (
                "max_steps shape the LR schedule, so from step 1 its rate follows the new settings"
                in caplog.text
            )
        else:  # against the last start (max_steps already 8): the learning rate alone
            assert "learning_rate 0.001 -> 0.002" in caplog.text and "LR schedule" not in caplog.text
    folder.unlock()


def test_a_resume_with_max_steps_below_the_checkpoint_step_is_refused_before_the_job(tmp_path):
    """A new user ran ``--set max_steps=4``, then ``--resume`` without it (max_steps 2): the job started the
    services and Ray, wrote a start record, then failed with ``start_step must be in [0, 2], got 4``. The run
    folder now refuses it before anything starts, naming the step, max_steps and the way out; max_steps equal
    to the checkpoint's step (a finished run) still resumes."""
    import pytest

    from marti.errors import FailedPreconditionError
    from services.trainer.job.run.run_dir import RunFolder

    ckpt = tmp_path / "checkpoints" / "step_000004"
    ckpt.mkdir(parents=True)
    cfg = load_config(ROOT / "examples" / "tiny.yaml", [f"output.dir={tmp_path}"])  # max_steps: 2
    with pytest.raises(FailedPreconditionError) as refused:
        RunFolder(tmp_path).prepare(cfg, resume=True, overwrite=False)
    assert str(refused.value) == (
        f"--resume from {ckpt}: the checkpoint is at step 4, past max_steps 2; resume with max_steps 4 or more "
        "(--set max_steps=N), or start a new run with --overwrite or another output.dir"
    )
    assert not (tmp_path / "config_history.jsonl").exists()
    again = load_config(ROOT / "examples" / "tiny.yaml", [f"output.dir={tmp_path}", "max_steps=4"])
    assert RunFolder(tmp_path).prepare(again, resume=True, overwrite=False) == ckpt


def test_a_dataset_job_resumed_past_its_epochs_is_refused_before_the_job(tmp_path):
    """A new user resumed a dataset job on fewer rows (5: ``max_epochs`` 1 over them is 3 steps of 2 problems)
    than its checkpoint had trained on (step 6): ``marti train --resume`` started the services and Ray, then
    failed (``start_step must be in [0, 3]``). The run folder now reads the job's last step from the config sized
    to the rows and refuses it before anything starts (no start record, no service files), naming the step, the
    keys and the way out; the job's own last step still resumes."""
    import json
    import subprocess
    import sys

    from services.trainer.data.tasks import DatasetTasks
    from services.trainer.job.run.run_dir import RunFolder

    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"prompt": f"{i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(5))
    )
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_000006"
    ckpt.mkdir(parents=True)
    job = {
        "training_name": "t",
        "num_agents": 1,
        "agents": [{"name": "solver", "pretrain_model": "tiny-llama", "role": "solver"}],
        "dataset": {"path": f"jsonl:{rows}"},
        "rollout": {"eval_every": 0},
        "output": {"dir": str(run)},
    }
    config = tmp_path / "job.yaml"
    config.write_text(json.dumps(job))
    proc = subprocess.run(
        [sys.executable, "-m", "marti.command.main", "train", str(config), "--resume", "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"marti train: --resume from {ckpt}: the checkpoint is at step 6, past the job's last step (max_epochs=1: "
        "1 passes over the 5 training problems (rollout.num_train_seeds) take 3 steps, fewer than max_steps=100; "
        "the job ends after step 3); resume with more max_epochs (--set max_epochs=N) or the training rows the "
        "run had, or start a new run with --overwrite or another output.dir"
    )
    assert sorted(p.name for p in run.iterdir()) == [
        ".lock",
        "checkpoints",
    ]  # nothing started, nothing recorded
    cfg = load_config(config)
    ckpt.rename(run / "checkpoints" / "step_000003")
    assert (
        RunFolder(run).prepare(DatasetTasks(cfg).sized(cfg), resume=True, overwrite=False).name
        == "step_000003"
    )


def test_a_resume_past_both_max_epochs_and_max_steps_names_both(tmp_path):
    """max_epochs 1 over 4 problems (2 steps) ends the job before max_steps 3, and both are below the checkpoint's
    step 6: the refusal names both keys, since raising max_epochs alone would still stop the job at step 3 (and
    be refused again, for max_steps). For a checkpoint at step 3, max_steps is enough: max_epochs alone."""
    import pytest

    from marti.errors import FailedPreconditionError
    from services.trainer.job.run.run_dir import RunFolder

    sets = [f"output.dir={tmp_path}", "rollout.num_train_seeds=4", "max_epochs=1", "max_steps=3"]
    ways = {
        6: "resume with max_steps 6 or more (--set max_steps=N) and more max_epochs (--set max_epochs=N) or the "
        "training rows the run had",
        3: "resume with more max_epochs (--set max_epochs=N) or the training rows the run had",
    }
    for step, way in ways.items():
        (tmp_path / "checkpoints" / f"step_{step:06d}").mkdir(parents=True)
        with pytest.raises(FailedPreconditionError) as refused:
            RunFolder(tmp_path).prepare(
                load_config(ROOT / "examples" / "tiny.yaml", sets), resume=True, overwrite=False
            )
        message = str(refused.value)
        assert message.endswith(f"{way}, or start a new run with --overwrite or another output.dir"), message
        (tmp_path / "checkpoints" / f"step_{step:06d}").rmdir()
