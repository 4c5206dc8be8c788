"""Checkpoint folders of a run: atomic publication, pruning that keeps ``latest``, and finding what exists."""

from __future__ import annotations

from pathlib import Path

from marti.config import load_config
from services.trainer.job.addresses import Addresses
from services.trainer.job.loop import TrainingLoop
from services.trainer.job.run_dir import latest_checkpoint

ROOT = Path(__file__).resolve().parents[3]


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
