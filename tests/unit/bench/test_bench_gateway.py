"""``marti bench gateway`` end to end at its smallest: every arm measured, traces inserted into a real store."""

from __future__ import annotations

import json

from benchmarks import gateway


def test_smallest_run_writes_every_arm_and_the_trace_rate(tmp_path, capsys):
    out = tmp_path / "gateway.json"
    argv = ["--clients", "1,2", "--requests", "1", "--max-tokens", "4", "--episodes", "3", "--json", str(out)]
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
