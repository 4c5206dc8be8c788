"""``marti bench env`` end to end on a tiny scale: every row is measured (async rows included), the N-session
rows carry CPU per step, and the table prints the ratios."""

from __future__ import annotations

import os

import pytest

from benchmarks import env as bench
from marti.env_registry import default_registry
from marti.rpc.testing import serve_in_thread
from services.env_server.core.sessions import SessionManager
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings


@pytest.fixture(scope="module")
def address():
    settings = EnvServerSettings(port=0, max_sessions=64)
    sessions = SessionManager(default_registry(), max_sessions=64)
    with serve_in_thread(lambda: [env_service(settings, sessions=sessions)], settings) as server:
        yield server.address


@pytest.mark.parametrize("deltas", [True, False])
def test_every_row_is_measured_with_cpu_per_step(address, deltas) -> None:
    rows = bench.run(8, 4, address, deltas, ["resource_allocation"], rounds=2, server_pid=os.getpid())
    modes = [r.mode for r in rows]
    assert modes == [
        "in-process",
        "remote stream",
        "remote unary",
        "in-process",
        "remote batched",
        "remote batched/2",
        "remote async/2",
        "remote async/4",
    ]
    assert all(r.steps_per_s > 0 and r.p99_ms >= r.p50_ms > 0 for r in rows)
    many = [r for r in rows if r.sessions == 4]
    assert all(r.client_cpu_us > 0 for r in many)
    assert all(r.server_cpu_us is not None for r in many if r.mode != "in-process")
    text = bench.table(rows)
    assert "remote async/4" in text and "cpu ratio" in text


def test_rounds_must_be_positive(address) -> None:
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        bench.run(8, 4, address, rounds=0)
