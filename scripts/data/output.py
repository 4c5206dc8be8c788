"""Writing a data script's ``--out`` file (shared by the scripts in ``scripts/data``)."""

from __future__ import annotations

import argparse
from pathlib import Path


def write_out(parser: argparse.ArgumentParser, path: str, text: str) -> Path:
    """Write ``text`` to ``path`` (UTF-8), creating its folder.

    Args:
        parser: The script's parser: a path that cannot be written is its error (exit status 2, one line).
        path: The ``--out`` value.
        text: What the file holds.

    Returns:
        The path written.
    """
    out = Path(path)
    if out.is_dir():
        parser.error(f"--out {path} is a folder; name the file to write in it")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        parser.error(f"--out {path} cannot be written: {exc.strerror or exc}")
    return out
