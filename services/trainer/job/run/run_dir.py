"""A run folder's guard: one job at a time, no silent overwrite, resumes that say what they changed.

:class:`RunFolder` is used by ``marti train`` (before the embedded services start writing into the folder) and
by :meth:`~services.trainer.job.run.loop.TrainingLoop.run` when no caller prepared the folder (TrainerService jobs):

- :meth:`RunFolder.lock` takes an exclusive ``fcntl.flock`` on ``<run_dir>/.lock`` for the job's life; a second
  job on the folder gets :class:`~marti.errors.FailedPreconditionError` naming the folder and the holder's pid.
- :meth:`RunFolder.prepare` refuses a new run in a folder that holds one (``config.yaml``, logged metrics or a
  checkpoint) unless ``resume`` or ``overwrite`` is given (a run without a checkpoint: only ``overwrite``, and
  both refusals say so); ``overwrite`` clears the folder; ``resume`` finds the checkpoint (an error naming the
  folder when there is none), refuses a config change the checkpoint cannot take (:func:`layout_changes`: one
  line naming the key and both values) or a job whose last step (``max_steps``, or fewer when ``max_epochs``
  passes over the training problems end it first: a dataset job's rows) is below the checkpoint's step, and
  warns when the dataset differs from the one the run last started with (its path, or its content's sha256).
- :meth:`RunFolder.record_start` writes ``config.yaml`` and appends one line to ``config_history.jsonl`` once the
  job has really started (its checkpoint loaded), so a refused or failed start leaves the record as it was.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from marti.config import TrainConfig, dump_config
from marti.data.fingerprint import dataset_fingerprint, fingerprint_changes
from marti.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from marti.plumbing.dir_lock import LOCK_FILE, DirLock
from marti.plumbing.yaml_load import load_yaml
from services.trainer.job.run.summary import epoch_limit_message

HISTORY_FILE = "config_history.jsonl"
_LOG = logging.getLogger(__name__)
_STEP_FOLDER = re.compile(r"step_(\d+)")


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint under ``<run_dir>/checkpoints``, or None.

    It is the folder the ``latest`` file names; when that file is missing or names a folder that is gone, the
    highest ``step_NNNNNN`` folder (a step folder appears only complete: it is renamed into place).
    """
    ckpt_dir = Path(run_dir) / "checkpoints"
    marker = ckpt_dir / "latest"
    if marker.is_file():
        path = ckpt_dir / marker.read_text().strip()
        if path.name and path.is_dir():
            return path
    steps = sorted(p for p in ckpt_dir.glob("step_*") if p.is_dir()) if ckpt_dir.is_dir() else []
    return steps[-1] if steps else None


def checkpoint_step(ckpt: Path) -> int | None:
    """The step a checkpoint folder holds, from its ``step_NNNNNN`` name; None for another name."""
    match = _STEP_FOLDER.fullmatch(Path(ckpt).name)
    return int(match.group(1)) if match else None


def layout(cfg: TrainConfig) -> dict[str, Any]:
    """The config keys a checkpoint's files depend on (the model's shape and mode, which parts are saved, the
    checkpoint format), as ``{dotted key: value}``."""
    out: dict[str, Any] = {
        "agents": [a.name for a in cfg.agents],
        "policy.mode": cfg.policy_mode,
        "policy.ema": cfg.policy.ema,
        "strategy.name": cfg.strategy.name,
        "strategy.zero_stage": cfg.strategy.zero_stage,
        # gae trains a critic per agent, saved beside the policy; the other estimators have none
        "algorithm.advantage_estimator": cfg.algorithm.advantage_estimator == "gae",
    }
    if cfg.policy_mode == "lora":
        out["policy.lora_r"] = cfg.policy.lora_r
        out["policy.lora_target_modules"] = list(cfg.policy.lora_target_modules)
    for i, a in enumerate(cfg.agents):
        out[f"agents.{i}.pretrain_model"] = a.pretrain_model
        out[f"agents.{i}.is_tuning"] = a.is_tuning
    return out


def _shown(cfg: TrainConfig, key: str, value: Any) -> Any:
    if key == "algorithm.advantage_estimator":
        return f"{cfg.algorithm.advantage_estimator} ({'with' if value else 'no'} critics)"
    return value


def layout_changes(saved: TrainConfig, new: TrainConfig) -> list[str]:
    """One line per layout key (:func:`layout`) that differs between the checkpoint's config and the new one,
    e.g. ``policy.lora_r: the checkpoint has 4, the config asks for 8``."""
    old_l, new_l = layout(saved), layout(new)
    return [
        f"{k}: the checkpoint has {_shown(saved, k, old_l.get(k))}, the config asks for {_shown(new, k, v)}"
        for k, v in new_l.items()
        if old_l.get(k) != v
    ]


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: data}


def config_diff(old: TrainConfig | None, new: TrainConfig) -> dict[str, list[Any]]:
    """``{dotted key: [old, new]}`` for every key whose value differs (lists compared whole)."""
    if old is None:
        return {}
    a, b = _flat(old.model_dump(mode="json")), _flat(new.model_dump(mode="json"))
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def _read_config(path: Path) -> TrainConfig | None:
    from marti.config import config_from_dict

    if not path.is_file():
        return None
    try:
        return config_from_dict(load_yaml(path.read_text(), str(path)) or {}, source=str(path))
    except (InvalidArgumentError, yaml.YAMLError):
        return None  # written by another version of marti: no layout to compare


#: What a new ``marti train`` job in a folder that holds a run can do instead.
CLI_WAYS_OUT = "continue it with --resume, replace it with --overwrite, or set another output.dir"

#: The same when that run has no checkpoint (its job failed or was stopped before its first): ``--resume`` has
#: nothing to continue, and ``--overwrite`` loses no checkpoint.
CLI_WAYS_OUT_WITHOUT_CHECKPOINT = (
    "it has no checkpoint (its job stopped before saving one), so --resume cannot continue it: start it again "
    "with --overwrite, or set another output.dir"
)

#: The same for a TrainerService job: SubmitJob has neither ``--resume`` nor ``--overwrite``.
SUBMIT_JOB_WAYS_OUT = (
    "SubmitJob cannot resume or replace a run (it has no such fields): submit the job with another output.dir "
    "or training_name (an override such as 'output.dir=runs/NAME-2'), or continue this run with "
    "'marti train CONFIG --resume' on the trainer's machine"
)


def _past_the_last_step(cfg: TrainConfig, step: int) -> str:
    """Why a checkpoint at ``step`` cannot resume a job of :attr:`~marti.config.TrainConfig.total_steps` steps
    (below ``step``), and the ways out: ``max_steps``, or ``max_epochs`` passes over the training problems
    (:func:`~services.trainer.job.run.summary.epoch_limit_message`) when they end the job first, with
    ``max_steps`` too when it is also below ``step`` (more epochs alone would still end the job before it)."""
    out = "start a new run with --overwrite or another output.dir"
    epochs = epoch_limit_message(cfg)
    if epochs is None:
        return (
            f"the checkpoint is at step {step}, past max_steps {cfg.max_steps}; resume with max_steps {step} or "
            f"more (--set max_steps=N), or {out}"
        )
    steps = f"max_steps {step} or more (--set max_steps=N) and " if cfg.max_steps < step else ""
    return (
        f"the checkpoint is at step {step}, past the job's last step ({epochs}); resume with {steps}more "
        f"max_epochs (--set max_epochs=N) or the training rows the run had, or {out}"
    )


class RunFolder:
    """One job's hold on its output folder (see the module docstring).

    Args:
        run_dir: The run folder (``TrainConfig.run_dir``); created by :meth:`lock`.
        ways_out: What the refusal of a new run in a folder that holds one advises: None for ``marti train``'s
            (:data:`CLI_WAYS_OUT`, or :data:`CLI_WAYS_OUT_WITHOUT_CHECKPOINT` when the run has no checkpoint),
            :data:`SUBMIT_JOB_WAYS_OUT` for a TrainerService job.
    """

    def __init__(self, run_dir: Path, ways_out: str | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.ways_out = ways_out
        self.resume_from: Path | None = None
        self.prepared = False
        self._fingerprint: tuple[Any, dict[str, Any]] | None = None
        self._lock = DirLock(
            self.run_dir, "run folder", "job", "wait for it to end or give this job another output.dir"
        )

    def lock(self) -> None:
        """Take the folder's lock for this job (released by :meth:`unlock` or when the process ends).

        Raises:
            FailedPreconditionError: Another job holds it (the folder and its pid are named).
        """
        self._lock.lock()

    def unlock(self) -> None:
        """Release the lock (idempotent)."""
        self._lock.unlock()

    def holds_a_run(self) -> bool:
        """True when the folder holds a run: ``config.yaml`` (written once a job has started), a checkpoint or
        logged metrics. A job that failed before it started leaves none of them (only logs, maybe empty files)."""
        metrics = self.run_dir / "metrics.jsonl"
        return (
            (self.run_dir / "config.yaml").exists()
            or latest_checkpoint(self.run_dir) is not None
            or (metrics.is_file() and metrics.stat().st_size > 0)
        )

    def refuse_a_held_run(self) -> None:
        """Refuse a new run here when the folder holds one (:meth:`holds_a_run`).

        Raises:
            FailedPreconditionError: ``run folder X already holds a run;`` and :attr:`ways_out` (None: marti
                train's, chosen by whether the run has a checkpoint).
        """
        if not self.holds_a_run():
            return
        ways_out = self.ways_out
        if ways_out is None:
            has_one = latest_checkpoint(self.run_dir) is not None
            ways_out = CLI_WAYS_OUT if has_one else CLI_WAYS_OUT_WITHOUT_CHECKPOINT
        raise FailedPreconditionError(f"run folder {self.run_dir} already holds a run; {ways_out}")

    def clear(self) -> None:
        """Delete everything in the folder but the lock file (``--overwrite``)."""
        for entry in self.run_dir.iterdir():
            if entry.name == LOCK_FILE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def prepare(self, cfg: TrainConfig, *, resume: bool, overwrite: bool) -> Path | None:
        """Check (and with ``overwrite`` clear) the folder for a job of ``cfg``; returns the checkpoint to resume
        from (None for a new run), also kept in :attr:`resume_from`.

        Raises:
            InvalidArgumentError: both ``resume`` and ``overwrite``.
            FailedPreconditionError: a new run in a folder that holds one (the folder, ``--resume`` and
                ``--overwrite`` are named), a resume whose config changes a key the checkpoint cannot take
                (the key and both values are named), or one whose last step (``cfg.total_steps``: ``max_steps``,
                or the steps of ``max_epochs`` passes over the training problems; a dataset job's ``cfg`` sized
                to its rows, :meth:`~services.trainer.data.tasks.DatasetTasks.sized`) is below the checkpoint's
                step (both named, with the keys that set it).
            NotFoundError: ``resume`` and no checkpoint in the folder (advising ``--overwrite`` when the folder
                holds a run all the same, :meth:`holds_a_run`).
        """
        if resume and overwrite:
            raise InvalidArgumentError(
                "--resume continues the run in the folder, --overwrite deletes it: give one"
            )
        if overwrite and self.run_dir.exists():
            self.clear()
        elif resume:
            self.resume_from = self._checkpoint_for(cfg)
            self._warn_if_the_dataset_changed(cfg)
        else:
            self.refuse_a_held_run()
        self.prepared = True
        return self.resume_from

    def _dataset(self, cfg: TrainConfig) -> dict[str, Any] | None:
        """The job's :func:`~marti.data.fingerprint.dataset_fingerprint` (hashed once per folder), or None
        without a ``dataset`` section."""
        if cfg.dataset is None:
            return None
        if self._fingerprint is None or self._fingerprint[0] != cfg.dataset:
            self._fingerprint = (cfg.dataset, dataset_fingerprint(cfg.dataset))
        return self._fingerprint[1]

    def _warn_if_the_dataset_changed(self, cfg: TrainConfig) -> None:
        """Log a warning when the dataset of a resumed job differs from the one the run last started with (the
        last ``dataset`` of ``config_history.jsonl``): its path, or its content's sha256. The row order and the
        held-out split depend on the rows, so the resumed job does not continue where the run was."""
        recorded = [r["dataset"] for r in read_history(self.run_dir) if r.get("dataset")]
        now = self._dataset(cfg)
        if not recorded or now is None:
            return
        changes = fingerprint_changes(recorded[-1], now)
        if changes:
            _LOG.warning(
                "--resume: the dataset differs from the one this run last started with (%s): %s. The row order "
                "and the held-out split depend on the rows, so the resumed job does not continue the run's "
                "epoch where it stopped (docs/datasets.md); resume on the data the run started with, or start "
                "a new run",
                HISTORY_FILE,
                "; ".join(changes),
            )

    def _checkpoint_for(self, cfg: TrainConfig) -> Path:
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            again = (
                "with --overwrite (there is no checkpoint to lose)"
                if self.holds_a_run()
                else "without --resume"
            )
            raise NotFoundError(
                f"--resume: run folder {self.run_dir} has no checkpoint (checkpoints/step_*); start a new run {again}"
            )
        saved = _read_config(ckpt / "config.yaml") or _read_config(self.run_dir / "config.yaml")
        changes = layout_changes(saved, cfg) if saved is not None else []
        if changes:
            raise FailedPreconditionError(
                f"--resume from {ckpt}: {changes[0]}; a checkpoint cannot take that change (start a new run with "
                "--overwrite or another output.dir)"
            )
        step = checkpoint_step(ckpt)
        if step is not None and step > cfg.total_steps:
            raise FailedPreconditionError(f"--resume from {ckpt}: {_past_the_last_step(cfg, step)}")
        return ckpt

    def record_start(
        self, cfg: TrainConfig, start_step: int, rollout: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Record that the job has started at ``start_step``: ``config.yaml`` becomes ``cfg`` and one line is
        appended to ``config_history.jsonl``: ``{"start_step", "time", "resumed_from", "algorithm", "changed":
        {key: [old, new]}, "dataset", "rollout"}`` (``changed`` against the previous ``config.yaml``, empty for a new
        run; ``dataset`` the :func:`~marti.data.fingerprint.dataset_fingerprint` of the job's data, null without one;
        ``rollout`` the sampling engine and dtype ``auto`` resolved to,
        :func:`~services.trainer.rollout.engines.generation.resolved_rollout`, null when not given).

        Returns:
            The appended record.
        """
        path = self.run_dir / "config.yaml"
        previous = _read_config(path) if self.resume_from is not None else None
        record = {
            "start_step": start_step,
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "resumed_from": str(self.resume_from) if self.resume_from is not None else None,
            "algorithm": cfg.algorithm.advantage_estimator,
            "changed": config_diff(previous, cfg),
            "dataset": self._dataset(cfg),
            "rollout": rollout,
        }
        if record["changed"]:
            _warn_changed(record["changed"], start_step)
        tmp = path.with_name(".config.yaml.tmp")
        tmp.write_text(dump_config(cfg))
        os.replace(tmp, path)
        with (self.run_dir / HISTORY_FILE).open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        return record


#: Keys whose change on a resume reshapes the LR schedule from the resumed step on (its length or shape).
SCHEDULE_KEYS = ("max_steps", "max_epochs", "lr_scheduler", "lr_warmup_ratio", "algorithm.ppo_epochs")


def _warn_changed(changed: dict[str, list[Any]], start_step: int) -> None:
    """Log what a resumed job changed (also in ``config_history.jsonl``), and, when a :data:`SCHEDULE_KEYS` key
    is among them, that the LR schedule now follows the new settings from the resumed step."""
    shown = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in list(changed.items())[:8])
    more = f" and {len(changed) - 8} more" if len(changed) > 8 else ""
    schedule = [k for k in SCHEDULE_KEYS if k in changed]
    why = (
        f"; {', '.join(schedule)} shape the LR schedule, so from step {start_step} its rate follows the new "
        "settings (the schedule is not the one the run started with)"
        if schedule
        else ""
    )
    _LOG.warning("--resume at step %d with changed settings (config_history.jsonl): %s%s%s", start_step, shown,
                 more, why)  # fmt: skip


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``config_history.jsonl`` (one per started job of the run), oldest first; [] if none."""
    path = Path(run_dir) / HISTORY_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
