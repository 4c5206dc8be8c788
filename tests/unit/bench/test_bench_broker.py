"""``marti bench broker`` end to end at its smallest: the broker started through :mod:`benchmarks.server`, one
Markdown table whose rows name the senders that ran and carry the numbers ``--json`` writes."""

from __future__ import annotations

import json

from benchmarks import broker


def test_smallest_run_prints_one_table_of_the_arms_it_ran(tmp_path, capsys):
    out = tmp_path / "broker.json"
    argv = ["--no-ray", "--arms", "unbatched,batched", "--messages", "32", "--senders", "2", "--batch", "4",
            "--json", str(out)]  # fmt: skip
    assert broker.main(argv) == 0
    arms = json.loads(out.read_text())["arms"]
    assert set(arms) == {"b1", "b_sync", "b"}
    lines = capsys.readouterr().out.splitlines()
    top = lines.index("| run | msgs | msgs/s | p50 ms | p99 ms | latency per | wire MB | compression |")
    assert lines[top + 1] == "|---|---:|---:|---:|---:|---|---:|---:|"
    rows = {
        line.strip("| ").split(" | ")[0]: line.strip("| ").split(" | ") for line in lines[top + 2 : top + 5]
    }
    assert set(rows) == {
        "(b) broker SDK unbatched, 2 senders",
        "(b) broker sync SDK batched x4, 2 threads",
        "(b) broker aio SDK batched x4, 2 tasks",
    }
    b = arms["b"]
    cells = rows["(b) broker aio SDK batched x4, 2 tasks"]
    assert cells[1:5] == [
        str(b["messages"]),
        f"{b['msgs_per_s']:,.0f}",
        f"{b['p50_ms']:.2f}",
        f"{b['p99_ms']:.2f}",
    ]
    assert cells[5:] == ["batch of 4", f"{b['wire_bytes'] / 1e6:.2f}", f"{b['compression']:.2f}"]
