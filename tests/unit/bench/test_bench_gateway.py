"""``marti bench gateway`` end to end at its smallest: every arm measured, traces inserted into a real store."""

from __future__ import annotations

import json

from benchmarks import gateway


def test_smallest_run_writes_every_arm_and_the_trace_rate(tmp_path, capsys):
    out = tmp_path / "gateway.json"
    argv = ["--clients", "1,2", "--requests", "1", "--max-tokens", "4", "--episodes", "3", "--json", str(out)]
    argv += ["--arms", "model"]
    assert gateway.main(argv) == 0
    data = json.loads(out.read_text())
    assert data["baseline"] == "direct" and set(data["by_clients"]) == {"1", "2"}
    for c, arms in data["by_clients"].items():
        assert set(arms) == {"direct", "http", "grpc", "in-process"}
        assert arms["direct"]["ratio_tokens_per_s"] == 1.0
        for s in arms.values():
            assert s["requests"] == int(c) and s["tokens"] > 0 and s["p99_s"] >= s["p50_s"] > 0
    assert data["traces"]["episodes"] == 3 and data["traces"]["inserted"] == 6  # one item per agent table
    assert len(data["loadavg_before"]) == 3
    printed = capsys.readouterr().out
    assert "| 2 | http |" in printed and "traces/s" in printed


def test_model_free_arms_report_the_overhead_and_the_load(tmp_path, capsys):
    """The overhead arms at 1 client against the direct call, and the load arm's errors, timeouts and loop lag."""
    out = tmp_path / "gateway.json"
    argv = [
        "--arms",
        "model-free",
        "--overhead-requests",
        "3",
        "--load-clients",
        "20",
        "--load-requests",
        "1",
    ]
    assert gateway.main([*argv, "--max-tokens", "4", "--json", str(out)]) == 0
    data = json.loads(out.read_text())["model_free"]
    assert set(data["overhead"]) == {"direct", "in-process", "grpc", "http"}
    assert data["overhead"]["direct"]["overhead_p50_ms"] == 0.0
    for s in data["overhead"].values():
        assert s["requests"] == 3 and s["p99_s"] >= s["p50_s"] > 0
    for arm in ("http", "grpc"):
        s = data["overhead"][arm]
        assert (
            s["overhead_p50_ms"] > 0
            and s["gateway_cpu_ms_per_request"] > 0
            and s["client_cpu_ms_per_request"] > 0
        )
    load = data["load"]
    assert (load["clients"], load["requests"], load["errors"], load["timeouts"]) == (20, 20, 0, 0)
    assert (
        load["loop_lag_ms_max"] >= load["loop_lag_ms_p50"] >= 0
    )  # a probe every 50 ms: the arm may be shorter
    printed = capsys.readouterr().out
    assert (
        "| http | 3 |" in printed
        and "20 requests in flight over HTTP" in printed
        and "event-loop lag" in printed
    )
