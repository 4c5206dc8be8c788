"""The TRL virtualenv of ``marti bench trainer`` (:mod:`benchmarks.trainer`), created on first use beside this
environment: the same torch, transformers, peft and accelerate versions, plus ``trl`` and ``datasets``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: ``--trl-venv``'s default.
DEFAULT_TRL_VENV = Path.home() / ".cache" / "marti-bench" / "trl-venv"


def installed_versions() -> dict[str, str]:
    """Versions of torch, transformers, peft and accelerate in this (the project's) environment."""
    from importlib.metadata import version

    return {p: version(p).split("+")[0] for p in ("torch", "transformers", "peft", "accelerate")}


def ensure_trl_venv(venv: Path) -> Path:
    """Create the TRL virtualenv if ``trl`` is not importable there; returns its python.

    torch is installed first at this environment's version (the CPU build) and pinned with a constraints file,
    so pip never pulls a CUDA build; transformers, peft and accelerate are pinned to this environment's.

    Raises:
        RuntimeError: An install step failed (the pip command is named).
    """
    py = venv / "bin" / "python"
    if (
        py.exists()
        and subprocess.call([str(py), "-c", "import trl, datasets"], stderr=subprocess.DEVNULL) == 0
    ):
        return py
    versions = installed_versions()
    venv.parent.mkdir(parents=True, exist_ok=True)
    constraints = venv.parent / "trl-constraints.txt"
    constraints.write_text("".join(f"{k}=={v}\n" for k, v in versions.items()))
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "-q", f"torch=={versions['torch']}"],
        [str(venv / "bin" / "pip"), "install", "-q", "-c", str(constraints), "trl", "datasets"]
        + [f"{k}=={v}" for k, v in versions.items() if k != "torch"],
    ]
    for cmd in steps:
        print("+", " ".join(cmd), flush=True)
        if subprocess.call(cmd) != 0:
            raise RuntimeError(f"setting up the TRL virtualenv failed at: {' '.join(cmd)}")
    return py
