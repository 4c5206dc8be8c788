"""Regenerate marti/api/ from protos/ (Python, gRPC and .pyi stubs).

Usage: ``python scripts/gen_protos.py [--check]``. With ``--check`` it generates into a temporary folder and
exits 1 if the committed code differs (CI runs this). The proto root equals the Python root, so
``protos/marti/api/env/v1/env.proto`` becomes ``marti/api/env/v1/env_pb2.py`` and imports need no rewriting.
Only ``protos/marti/**`` is generated; ``google/rpc/status.proto`` comes from googleapis-common-protos.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.resources
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
OUT_PKG = "marti/api"


def _include_dirs() -> list[str]:
    import grpc_tools

    dirs = [str(PROTOS), str(Path(grpc_tools.__file__).parent / "_proto")]
    # google/rpc/*.proto ship with googleapis-common-protos (a dependency of grpcio-status).
    import google.rpc

    google_root = Path(next(iter(google.rpc.__path__))).parent.parent
    dirs.append(str(google_root))
    return dirs


def generate(out_root: Path) -> None:
    """Generate code for every proto under ``protos/marti`` into ``out_root`` (mirroring the proto tree)."""
    from grpc_tools import protoc

    files = sorted(str(p.relative_to(PROTOS)) for p in (PROTOS / "marti").rglob("*.proto"))
    if not files:
        raise SystemExit("no .proto files under protos/marti")
    args = ["protoc", *(f"-I{d}" for d in _include_dirs())]
    args += [f"--python_out={out_root}", f"--pyi_out={out_root}", f"--grpc_python_out={out_root}", *files]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for folder in [out_root / OUT_PKG, *(p for p in (out_root / OUT_PKG).rglob("*") if p.is_dir())]:
        init = folder / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated from protos/ by scripts/gen_protos.py. Do not edit."""\n')


def _tree(root: Path) -> dict[str, Path]:
    base = root / OUT_PKG
    return {
        str(p.relative_to(base)): p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    }


def main(argv: list[str] | None = None) -> int:
    """Generate (default) or check (``--check``) the committed generated code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if marti/api/ is out of date")
    args = parser.parse_args(argv)
    _ = importlib.resources  # keep import for tools that inspect resources
    with tempfile.TemporaryDirectory() as tmp:
        tmp_root = Path(tmp)
        (tmp_root / OUT_PKG).mkdir(parents=True)
        (tmp_root / OUT_PKG / "__init__.py").write_text((ROOT / OUT_PKG / "__init__.py").read_text())
        generate(tmp_root)
        new, old = _tree(tmp_root), _tree(ROOT)
        if args.check:
            stale = sorted(
                k
                for k in set(new) | set(old)
                if k not in new or k not in old or not filecmp.cmp(new[k], old[k], False)
            )
            if stale:
                print("generated code is out of date; run `make protos`:", *stale, sep="\n  ")
                return 1
            print(f"generated code is current ({len(new)} files)")
            return 0
        for rel in set(old) - set(new):
            old[rel].unlink()
        for rel, path in new.items():
            dest = ROOT / OUT_PKG / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
        print(f"generated {len(new)} files under {OUT_PKG}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
