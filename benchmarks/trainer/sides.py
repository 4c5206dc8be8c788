"""The sides of ``marti bench trainer`` (:mod:`benchmarks.trainer`): the starting model every side loads, and each
side run in a fresh process (ours: ``python -m benchmarks.trainer --_ours``; a TRL arm: :mod:`.trl_runner` under
the TRL virtualenv's Python), with the load average around it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.trainer.report import TRL_ARMS

#: The repository root: the children's working folder, and where ``--out``'s default lies.
ROOT = Path(__file__).resolve().parents[2]


def load_avg() -> float:
    """Return the 1-minute load average of this machine."""
    return os.getloadavg()[0]


def prepare_model(name: str, seed: int, out: Path) -> Path:
    """Build or load ``name`` once (seeded) and save it with its tokenizer to ``out``; returns ``out``.

    Raises:
        NotFoundError: The model is not available locally (named, with the places looked).
    """
    from services.trainer.models.loading import load_model, load_tokenizer

    tok = load_tokenizer(name)
    model = load_model(name, tokenizer=tok, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def run_child(role: str, spec_path: Path, out_path: Path, python: str) -> dict[str, Any]:
    """Run one side in a fresh process (a TRL arm with its precision, :data:`TRL_ARMS`); returns its result JSON
    with the load average added."""
    if role in TRL_ARMS:
        runner = Path(__file__).resolve().parent / "trl_runner.py"
        cmd = [python, str(runner), str(spec_path), str(out_path), TRL_ARMS[role]]
    else:
        cmd = [python, "-m", "benchmarks.trainer", "--_ours", str(spec_path), str(out_path)]
    spec = json.loads(spec_path.read_text())
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(spec["threads"])}
    load = load_avg()
    print(f"running {role} (load {load:.1f}) ...", flush=True)
    rc = subprocess.call(cmd, cwd=ROOT, env=env)
    if rc != 0:
        raise RuntimeError(f"{role} side exited with {rc}: {' '.join(cmd)}")
    result = json.loads(out_path.read_text())
    result["load"] = (load + load_avg()) / 2
    result["spec_digest"] = spec_digest(spec)
    return result


def spec_digest(spec: dict[str, Any]) -> str:
    """SHA-256 of a run's settings (``spec.json`` without ``model_dir``, the folder's own path), recorded in each
    side result so that ``--report-only`` can refuse a side file copied from a run with other settings."""
    settings = {k: v for k, v in spec.items() if k != "model_dir"}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()
