"""Split a file into numbered chunks with a sha256 manifest, check chunks against it, and join them back.

Standard library only: it runs on the lent GPU machine (Python 3.12, no network) as well as here. The install kit
of ``scripts/gpu/build_kit.py`` travels to that machine in chunks small enough for one command each
(docs/gpu.md); ``scripts/gpu/run_on_gpu.sh`` checks and joins them there.

Manifest (``manifest.json`` beside the chunks)::

    {"archive": "kit.tar", "size": <bytes>, "sha256": "<hex>", "chunk_bytes": <bytes>,
     "chunks": [{"name": "kit.tar.part000", "size": <bytes>, "sha256": "<hex>"}, ...]}

Usage::

    python3 scripts/gpu/kit_chunks.py split kit.tar OUT_DIR [--chunk-mib 58]
    python3 scripts/gpu/kit_chunks.py verify OUT_DIR/manifest.json CHUNK_DIR
    python3 scripts/gpu/kit_chunks.py join OUT_DIR/manifest.json CHUNK_DIR kit.tar
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
MIB = 2**20
DEFAULT_CHUNK_MIB = 58
_BLOCK = 4 * MIB


class ChunkError(Exception):
    """A chunk is missing, has the wrong size or checksum, or the joined file does not match the manifest."""


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at ``path`` (read in 4 MiB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def split_file(path: Path, out_dir: Path, chunk_bytes: int) -> dict[str, Any]:
    """Cut ``path`` into ``<name>.part000``, ``.part001``, ... of at most ``chunk_bytes`` each in ``out_dir`` and
    write ``out_dir/manifest.json``; chunks of an earlier split of the same name are removed first.

    Args:
        path: The file to split (not empty).
        out_dir: Folder for the chunks and the manifest (created).
        chunk_bytes: Largest chunk, bytes (>= 1).

    Returns:
        The manifest written.

    Raises:
        ValueError: ``chunk_bytes`` < 1 or the file is empty.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    size = path.stat().st_size
    if size == 0:
        raise ValueError(f"{path} is empty")
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(f"{path.name}.part*"):
        old.unlink()
    whole = hashlib.sha256()
    chunks = []
    with open(path, "rb") as src:
        index = 0
        while True:
            name = f"{path.name}.part{index:03d}"
            part = hashlib.sha256()
            written = 0
            with open(out_dir / name, "wb") as dst:
                while written < chunk_bytes and (block := src.read(min(_BLOCK, chunk_bytes - written))):
                    dst.write(block)
                    part.update(block)
                    whole.update(block)
                    written += len(block)
            if written == 0:
                (out_dir / name).unlink()
                break
            chunks.append({"name": name, "size": written, "sha256": part.hexdigest()})
            index += 1
    manifest = {
        "archive": path.name,
        "size": size,
        "sha256": whole.hexdigest(),
        "chunk_bytes": chunk_bytes,
        "chunks": chunks,
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def load_manifest(manifest_path: Path) -> dict[str, Any]:
    """Read a manifest written by :func:`split_file`.

    Raises:
        ChunkError: The file is missing or is not a manifest.
    """
    try:
        manifest = json.loads(Path(manifest_path).read_text())
        _ = manifest["archive"], manifest["size"], manifest["sha256"]
        _ = [(c["name"], c["size"], c["sha256"]) for c in manifest["chunks"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ChunkError(f"{manifest_path} is not a chunk manifest: {exc}") from None
    return manifest


def chunk_problems(manifest: dict[str, Any], chunk_dir: Path, *, check_sums: bool = True) -> dict[str, str]:
    """What is wrong with the chunks in ``chunk_dir``, by chunk name: ``missing``, ``size N, expected M`` or
    ``sha256 mismatch``; an empty dict when every chunk is there and intact.

    Args:
        manifest: The manifest (:func:`load_manifest`).
        chunk_dir: Folder holding the chunks.
        check_sums: Also hash each chunk (else names and sizes only).
    """
    problems = {}
    for chunk in manifest["chunks"]:
        path = Path(chunk_dir) / chunk["name"]
        if not path.is_file():
            problems[chunk["name"]] = "missing"
        elif path.stat().st_size != chunk["size"]:
            problems[chunk["name"]] = f"size {path.stat().st_size}, expected {chunk['size']}"
        elif check_sums and sha256_file(path) != chunk["sha256"]:
            problems[chunk["name"]] = "sha256 mismatch"
    return problems


def join_chunks(manifest_path: Path, chunk_dir: Path, out_path: Path) -> Path:
    """Check every chunk against the manifest, concatenate them into ``out_path`` and check the whole file's size
    and sha256; ``out_path`` appears only when everything matched (written beside it, then renamed).

    Returns:
        ``out_path``.

    Raises:
        ChunkError: A chunk is missing or damaged (all are named), or the joined file does not match.
    """
    manifest = load_manifest(manifest_path)
    problems = chunk_problems(manifest, chunk_dir)
    if problems:
        listed = ", ".join(f"{name}: {what}" for name, what in sorted(problems.items()))
        raise ChunkError(f"chunks of {manifest['archive']} do not match {manifest_path}: {listed}")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".partial")
    whole = hashlib.sha256()
    size = 0
    with open(tmp, "wb") as dst:
        for chunk in manifest["chunks"]:
            with open(Path(chunk_dir) / chunk["name"], "rb") as src:
                while block := src.read(_BLOCK):
                    dst.write(block)
                    whole.update(block)
                    size += len(block)
    if size != manifest["size"] or whole.hexdigest() != manifest["sha256"]:
        tmp.unlink()
        raise ChunkError(f"joined {manifest['archive']} does not match the manifest (size {size})")
    os.replace(tmp, out_path)
    return out_path


def main(argv: list[str] | None = None) -> int:
    """Command line: ``split``, ``verify`` or ``join``; returns 0 on success, 1 on a chunk problem."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_split = sub.add_parser("split", help="cut a file into chunks and write manifest.json")
    p_split.add_argument("file", type=Path)
    p_split.add_argument("out_dir", type=Path)
    p_split.add_argument("--chunk-mib", type=float, default=DEFAULT_CHUNK_MIB, help="largest chunk, MiB")
    p_verify = sub.add_parser("verify", help="list missing or damaged chunks")
    p_verify.add_argument("manifest", type=Path)
    p_verify.add_argument("chunk_dir", type=Path)
    p_join = sub.add_parser("join", help="check the chunks and join them")
    p_join.add_argument("manifest", type=Path)
    p_join.add_argument("chunk_dir", type=Path)
    p_join.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "split":
            manifest = split_file(args.file, args.out_dir, int(args.chunk_mib * MIB))
            for c in manifest["chunks"]:
                print(f"{c['name']}  {c['size'] / MIB:.1f} MiB  {c['sha256'][:16]}")
            print(f"{len(manifest['chunks'])} chunks of {args.file.name} ({manifest['size'] / MIB:.1f} MiB)")
        elif args.cmd == "verify":
            manifest = load_manifest(args.manifest)
            problems = chunk_problems(manifest, args.chunk_dir)
            for c in manifest["chunks"]:
                print(f"{c['name']}: {problems.get(c['name'], 'ok')}")
            if problems:
                return 1
        else:
            join_chunks(args.manifest, args.chunk_dir, args.out)
            print(f"joined {args.out}")
    except ChunkError as exc:
        print(f"kit_chunks: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
