"""``ensure_process_group`` survives a picked ``MASTER_PORT`` that another process took before the bind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]

SCRIPT = textwrap.dedent(
    """
    import socket, sys
    import torch.distributed as dist
    from services.trainer.strategy import deepspeed_strategy as ds

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    picks = iter([port, port] if sys.argv[1] == "twice" else [port])
    real = ds._free_port
    ds._free_port = lambda: next(picks, None) or real()
    try:
        ds.ensure_process_group("gloo")
    except dist.DistNetworkError as exc:
        print("raised", "EADDRINUSE" in str(exc))
        raise SystemExit(0)
    import os
    print("ok", dist.is_initialized(), int(os.environ["MASTER_PORT"]) != port)
    """
)


def _run(mode: str, **env: str) -> str:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE")
    }
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_a_taken_picked_port_is_replaced_by_a_fresh_one():
    assert _run("once") == "ok True True"


def test_a_port_the_caller_set_is_not_replaced():
    # MASTER_PORT from the environment wins: its EADDRINUSE is the caller's to see, not retried elsewhere
    assert _run("once", MASTER_PORT=str(_listening_port())) == "raised True"


def _listening_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    _HELD.append(s)
    return s.getsockname()[1]


_HELD: list = []


SHM_SCRIPT = textwrap.dedent(
    """
    import deepspeed.comm.comm as dscomm
    from services.trainer.strategy import deepspeed_strategy as ds

    ds.ensure_process_group("gloo")
    print("shm", dscomm.cdb.shm_comm_op is None)
    """
)


def test_one_cpu_process_does_not_build_deepspeeds_shared_memory_kernel():
    """A lone CPU process has nothing to all-reduce with; building the kernel costs about 75 s of g++."""
    clean = {
        k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE")
    }
    proc = subprocess.run(
        [sys.executable, "-c", SHM_SCRIPT], cwd=ROOT, env={**clean, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "shm True"
    assert "deepspeed_shm_comm" not in proc.stdout + proc.stderr  # no build or load message
