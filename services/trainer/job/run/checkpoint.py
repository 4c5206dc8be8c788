"""Checkpoint helpers: RNG state capture, atomic step folders, rotation, and the ``latest`` pointer.

Layout written by :class:`CheckpointManager` under a root folder::

    root/
      latest                  text file: name of the newest complete step folder
      step-000120/
        meta.json             {"step": 120, "data_position": {...}, "units": [...]}
        rng.pt                python, numpy, torch CPU and CUDA RNG states
        policy/               MultiAgentPolicy.save (weights, versions)        (optional)
        <unit>/               one training engine per unit: model, optimizer, scheduler, counters

A step folder is written under a temporary name, synced (``fsync`` of every file and folder) and renamed into
place only when complete, and ``latest`` is replaced atomically afterwards; so a crash (or a NaN-loss stop)
leaves the last good checkpoint untouched. Pruning never deletes the checkpoint ``latest`` names
(:func:`prune_steps`). The training loop's ``step_NNNNNN`` folders are published with the same functions.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marti.errors import InvalidArgumentError, NotFoundError
from marti.plumbing.fsync import fsync_path

_STEP_RE = re.compile(r"^step-(\d{6,})$")


def capture_rng_state() -> dict[str, Any]:
    """Return the python, numpy, torch CPU and (if present) CUDA RNG states, loadable with ``weights_only``."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` returned (CUDA states only when CUDA is available)."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_rng_state(path: str | Path) -> None:
    """Write the current RNG states to ``path`` (torch.save of plain tensors and tuples)."""
    torch.save(capture_rng_state(), str(path))


def load_rng_state(path: str | Path) -> None:
    """Restore RNG states from a file written by :func:`save_rng_state` (loaded with ``weights_only=True``)."""
    restore_rng_state(torch.load(str(path), weights_only=True))


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write JSON to ``path`` through a temp file and ``os.replace``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
    os.replace(tmp, path)


def fsync_tree(root: str | Path) -> None:
    """``fsync`` every file and folder under ``root`` (and ``root`` itself), so a rename that publishes it
    cannot outlive its contents in a power loss."""
    for dirpath, _dirs, files in os.walk(root):
        for name in [*files, "."]:
            fsync_path(os.path.join(dirpath, name))


def replace_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a synced temp file and ``os.replace`` (readers see old or new)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def publish_folder(tmp: str | Path, final: str | Path) -> Path:
    """Sync the complete folder ``tmp`` and rename it to ``final`` (a folder already there is replaced: moved
    aside, then deleted once ``final`` is in place). Returns ``final``."""
    tmp, final = Path(tmp), Path(final)
    fsync_tree(tmp)
    aside = final.with_name(f".old-{final.name}")
    shutil.rmtree(aside, ignore_errors=True)
    if final.exists():
        os.replace(final, aside)
    os.replace(tmp, final)
    fsync_path(final.parent)
    shutil.rmtree(aside, ignore_errors=True)
    return final


def prune_steps(steps: Mapping[int, Path], current: int, keep_last: int) -> list[Path]:
    """Delete old checkpoints: keep the one of step ``current`` (the one ``latest`` names) and the
    ``keep_last - 1`` newest before it; folders of later steps (an abandoned timeline) go too.

    Args:
        steps: step -> its complete folder.
        current: The step just published.
        keep_last: Checkpoints to keep, >= 1.

    Returns:
        The deleted folders.
    """
    older = sorted(s for s in steps if s < current)
    keep = set(older[len(older) - (keep_last - 1) :]) if keep_last > 1 else set()
    doomed = [p for s, p in sorted(steps.items()) if s != current and s not in keep]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def save_job_checkpoint(
    ckpt_dir: Path,
    step: int,
    save: Callable[[str, dict[str, Any]], Any],
    position: dict[str, Any],
    config_yaml: str,
    keep_last: int,
) -> Path:
    """Save the training loop's ``ckpt_dir/step_NNNNNN`` atomically.

    It is written under a temporary name (``save(folder, position)``, then the job's ``config.yaml``, what a
    resume checks its config against), synced and renamed into place (:func:`publish_folder`), then ``latest``
    is replaced (:func:`replace_text_atomic`); pruning keeps ``keep_last`` and never the one ``latest`` names
    (:func:`prune_steps`).

    Args:
        ckpt_dir: The run's ``checkpoints`` folder (created if missing).
        step: The step saved.
        save: Writes the job's state into a folder (``RayRuntime.save``).
        position: Where the job stands (``step``, and the curriculum's state when it has one).
        config_yaml: The job's config, as ``dump_config`` writes it.
        keep_last: Checkpoints to keep, >= 1.

    Returns:
        The published folder.
    """
    path = ckpt_dir / f"step_{step:06d}"
    tmp = ckpt_dir / f".tmp-{path.name}"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    save(str(tmp), position)
    (tmp / "config.yaml").write_text(config_yaml)
    publish_folder(tmp, path)
    replace_text_atomic(ckpt_dir / "latest", path.name)
    steps = {int(p.name[5:]): p for p in ckpt_dir.glob("step_*") if p.is_dir() and p.name[5:].isdigit()}
    prune_steps(steps, step, keep_last)
    return path


class CheckpointManager:
    """Numbered, atomic, rotated checkpoints of a whole training job.

    Args:
        root: Folder that holds the step folders.
        keep_last: How many complete checkpoints to keep, >= 1 (older ones are deleted after a save).

    Raises:
        InvalidArgumentError: ``keep_last`` < 1.
    """

    def __init__(self, root: str | Path, *, keep_last: int = 2) -> None:
        if keep_last < 1:
            raise InvalidArgumentError(f"keep_last must be >= 1, got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last

    def steps(self) -> list[int]:
        """Steps of the complete checkpoints, ascending."""
        if not self.root.is_dir():
            return []
        return sorted(
            int(m.group(1)) for p in self.root.iterdir() if (m := _STEP_RE.match(p.name)) and p.is_dir()
        )

    def latest(self) -> Path | None:
        """Folder of the newest complete checkpoint, or None."""
        pointer = self.root / "latest"
        if pointer.is_file():
            folder = self.root / pointer.read_text().strip()
            if folder.is_dir():
                return folder
        steps = self.steps()
        return self.root / f"step-{steps[-1]:06d}" if steps else None

    def save(
        self,
        step: int,
        writers: Mapping[str, Callable[[Path], None]],
        *,
        data_position: Mapping[str, Any] | None = None,
    ) -> Path:
        """Write one checkpoint atomically.

        Args:
            step: Global training step (>= 0), the folder's number.
            writers: sub-folder name -> function writing into that (already created) folder; e.g.
                ``{"policy": policy.save, "agent_1": engine.save_checkpoint}``.
            data_position: JSON-serialisable position in the data stream per agent (epoch, offset, ...).

        Returns:
            The complete step folder.
        """
        if step < 0:
            raise InvalidArgumentError(f"checkpoint step must be >= 0, got {step}")
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step-{step:06d}"
        tmp = self.root / f".tmp-step-{step:06d}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name, write in writers.items():
            sub = tmp / name
            sub.mkdir()
            write(sub)
        save_rng_state(tmp / "rng.pt")
        write_json_atomic(
            tmp / "meta.json",
            {"step": step, "data_position": dict(data_position or {}), "units": sorted(writers)},
        )
        publish_folder(tmp, final)
        replace_text_atomic(self.root / "latest", final.name)
        prune_steps({s: self.root / f"step-{s:06d}" for s in self.steps()}, step, self.keep_last)
        return final

    def load(
        self,
        readers: Mapping[str, Callable[[Path], Any]],
        *,
        folder: str | Path | None = None,
        restore_rng: bool = True,
    ) -> dict[str, Any]:
        """Read a checkpoint back (the latest by default).

        Args:
            readers: sub-folder name -> function reading from it.
            folder: A specific step folder instead of the latest.
            restore_rng: Also restore the RNG states saved with it.

        Returns:
            ``meta.json`` contents: ``{"step", "data_position", "units"}``.

        Raises:
            NotFoundError: No checkpoint, or a reader's sub-folder is missing.
        """
        path = Path(folder) if folder is not None else self.latest()
        if path is None or not (path / "meta.json").is_file():
            raise NotFoundError(f"no complete checkpoint under {self.root if folder is None else folder}")
        for name, read in readers.items():
            sub = path / name
            if not sub.is_dir():
                raise NotFoundError(
                    f"checkpoint {path} has no {name!r} part (has {sorted(p.name for p in path.iterdir())})"
                )
            read(sub)
        if restore_rng:
            load_rng_state(path / "rng.pt")
        return json.loads((path / "meta.json").read_text())
