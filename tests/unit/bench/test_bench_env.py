"""``marti bench env`` end to end on a tiny scale: every row is measured (async rows included), the N-session
rows carry CPU per step, and the table prints the ratios."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import env as bench
from marti.env.registry import default_registry
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
    lines = bench.table(rows).splitlines()  # a Markdown table: header, alignment, one line a row
    assert lines[0] == (
        "| env | mode | sessions | steps/s | p50 ms | p99 ms | remote/in-proc | cli us | srv us | cpu ratio |"
    )
    assert lines[1] == "|---|---|" + "---:|" * 8 and len(lines) == 2 + len(rows)
    r = rows[-1]
    cells = lines[-1].strip("| ").split(" | ")
    assert cells[:6] == [
        "resource_allocation", "remote async/4", "4", f"{r.steps_per_s:.0f}", f"{r.p50_ms:.3f}", f"{r.p99_ms:.3f}"
    ]  # fmt: skip
    assert cells[7:9] == [f"{r.client_cpu_us:.0f}", f"{r.server_cpu_us:.0f}"]


def test_rounds_must_be_positive(address) -> None:
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        bench.run(8, 4, address, rounds=0)


def test_json_report_holds_every_row_its_ratios_and_the_targets(address) -> None:
    rows = bench.run(8, 4, address, True, ["resource_allocation"], rounds=1, server_pid=os.getpid())
    out = bench.report(rows, {"steps": 8, "sessions": 4}, [1.0, 1.0, 1.0], [2.0, 2.0, 2.0])
    assert (
        out["bench"] == "env" and out["loadavg_before"] == [1.0, 1.0, 1.0] and len(out["rows"]) == len(rows)
    )
    by_mode = {(r["mode"], r["sessions"]): r for r in out["rows"]}
    base = by_mode[("in-process", 4)]
    batched = by_mode[("remote batched", 4)]
    assert base["ratio"] is None and batched["ratio"] == pytest.approx(
        batched["steps_per_s"] / base["steps_per_s"]
    )
    assert batched["cpu_ratio"] == pytest.approx(
        base["client_cpu_us"] / max(batched["client_cpu_us"], batched["server_cpu_us"])
    )
    target = out["targets"]["resource_allocation"]
    best = max(
        (r for r in out["rows"] if r["sessions"] == 4 and r["ratio"] is not None), key=lambda r: r["ratio"]
    )
    assert target["batched_sessions"] == 4 and target["batched_best_mode"] == best["mode"]
    assert target["batched_met"] == (best["ratio"] >= 0.5)
    assert target["single_step_p50_ms"] == by_mode[("remote stream", 1)]["p50_ms"]
    json.dumps(out)  # JSON-ready as it is
    assert f"{batched['ratio']:.2f}" in bench.table(rows)


def test_a_measured_zero_cpu_figure_still_gives_a_cpu_ratio_and_a_missing_one_does_not() -> None:
    base = bench.Row("e", "in-process", 4, 100.0, 1.0, 2.0, client_cpu_us=50.0)
    zero = bench.Row("e", "remote batched", 4, 50.0, 1.0, 2.0, client_cpu_us=0.0, server_cpu_us=200.0)
    missing = bench.Row("e", "remote stream", 4, 50.0, 1.0, 2.0, client_cpu_us=100.0, server_cpu_us=None)
    idle = bench.Row("e", "remote async/2", 4, 50.0, 1.0, 2.0, client_cpu_us=0.0, server_cpu_us=0.0)
    rows = [base, zero, missing, idle]
    assert bench.ratios(rows, zero) == (0.5, 0.25)
    assert bench.ratios(rows, missing) == (0.5, None)
    assert bench.ratios(rows, idle) == (0.5, None)
