"""What a dataset section reads, as a record a run folder keeps: each source's spec and the sha256 of its bytes, so
that a resumed job can say when its data changed (``services/trainer/job/run/run_dir.py``; docs/datasets.md,
"Errors")."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from marti.data.spec import parse_source

_CHUNK = 1 << 20
"""Bytes read at a time while hashing."""


def source_sha256(text: str) -> str | None:
    """The sha256 (hex) of a local source's bytes: a file's, or a folder's (every file under it, in sorted
    relative-path order, each hashed with its path). None for a hub dataset or a path that does not exist.

    Raises:
        InvalidArgumentError: ``text`` is not a source spec (:func:`marti.data.spec.parse_source`).
    """
    spec = parse_source(text)
    path = Path(spec.location)
    if not spec.is_local or not path.exists():
        return None
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if file is not path:
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with file.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def dataset_fingerprint(section: Any) -> dict[str, str | None]:
    """``{"path", "sha256", "eval_path", "eval_sha256"}`` of a ``dataset`` section (:class:`marti.config.DatasetConfig`):
    each source's spec as configured and :func:`source_sha256` of it (None without an ``eval_path``)."""
    return {
        "path": section.path,
        "sha256": source_sha256(section.path),
        "eval_path": section.eval_path,
        "eval_sha256": source_sha256(section.eval_path) if section.eval_path else None,
    }


def fingerprint_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One line per difference between two :func:`dataset_fingerprint` records: a source whose spec changed
    (``dataset.path 'a.jsonl' -> 'b.jsonl' (other content, sha256 0123abcd... -> 4567ef01...)``, or ``(same
    content)``), or whose bytes changed under the same spec (``the content of dataset.path 'a.jsonl' changed
    (sha256 ...)``); [] when they are the same."""
    out = []
    for key, sha in (("path", "sha256"), ("eval_path", "eval_sha256")):
        short = [f"{h[:12]}..." if h else "none" for h in (old.get(sha), new.get(sha))]
        content = f"sha256 {short[0]} -> {short[1]}"
        if old.get(key) != new.get(key):
            same = "same content" if old.get(sha) == new.get(sha) else f"other content, {content}"
            out.append(f"dataset.{key} {old.get(key)!r} -> {new.get(key)!r} ({same})")
        elif old.get(sha) != new.get(sha):
            out.append(f"the content of dataset.{key} {new.get(key)!r} changed ({content})")
    return out
