"""``marti bench store`` end to end at its smallest (no Reverb): every row measured, client CPU per insert and the
load average recorded in strict JSON; the ratios and targets from rows with and without Reverb."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import store


def _strict(text: str):
    def refuse(token):
        raise AssertionError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_smallest_run_records_rates_client_cpu_and_load(tmp_path, capsys):
    out = tmp_path / "out.json"
    argv = ["--no-reverb", "--items-4k", "32", "--items-64k", "16", "--sample-calls", "1", "--stream-samples",
            "16", "--clients", "1,2", "--restart-items", "0", "--json", str(out)]  # fmt: skip
    assert store.main(argv) == 0
    data = _strict(out.read_text())
    assert data["benchmark"] == "store" and data["targets"] == []
    assert [(r["item_bytes"], r["clients"]) for r in data["rows"]] == [
        (4096, 1),
        (4096, 2),
        (65536, 1),
        (65536, 2),
    ]
    for r in data["rows"]:
        m = r["marti"]
        assert (
            r["reverb"] is None and r["ratios"] is None and m["inserts_per_s"] > 0 and m["samples_per_s"] > 0
        )
        assert m["inserts_per_s_16_per_call"] > 0
        assert 0 < m["client_cpu_ms_per_insert"] < 1000 and math.isfinite(m["client_cpu_ms_per_insert"])
    assert len(data["loadavg_before"]) == 3 and len(data["loadavg_after"]) == 3
    assert all(isinstance(x, float) for x in data["loadavg_before"] + data["loadavg_after"])
    assert data["reverb_note"] == "skipped (--no-reverb)" and data["cpus"] >= 1
    printed = capsys.readouterr().out
    assert "load average before:" in printed and "load average after:" in printed
    lines = printed.splitlines()
    top = lines.index("| " + " | ".join(store.TABLE_HEADER) + " |")  # one Markdown table of every row
    assert "cli ms/ins m" in store.TABLE_HEADER and "m 16/call" in store.TABLE_HEADER
    assert lines[top + 1] == "|" + "---:|" * len(store.TABLE_HEADER)
    for line, r in zip(lines[top + 2 : top + 6], data["rows"], strict=True):
        m = r["marti"]
        cells = line.strip("| ").split(" | ")
        assert cells[:3] == [f"{r['item_bytes'] // 1024}KB", str(r["clients"]), f"{m['inserts_per_s']:.0f}"]
        assert cells[3] == cells[5] == "n/a"  # no Reverb, no ratio
        assert cells[6] == f"{m['samples_per_s']:.0f}" and cells[13] == f"{m['sample_p99_ms']:.2f}"
        assert cells[15] == f"{m['client_cpu_ms_per_insert']:.3f}"
        assert cells[17] == f"{m['inserts_per_s_16_per_call']:.0f}"


def test_ratios_are_marti_over_reverb_and_a_zero_baseline_is_not_a_number():
    m = {"inserts_per_s": 50.0, "samples_per_s": 30.0, "stream_samples_per_s": 8.0}
    r = {"inserts_per_s": 100.0, "samples_per_s": 10.0, "stream_samples_per_s": 0.0}
    got = store._ratios(m, r)
    assert got["inserts"] == 0.5 and got["samples"] == 3.0 and math.isnan(got["stream_samples"])
    assert store._ratios(m, None) is None
    side = {**m, "sample_p99_ms": 2.5, "client_cpu_ms_per_insert": 0.125, "inserts_per_s_16_per_call": 40.0}
    row = {"item_bytes": 4096, "clients": 1, "marti": side, "reverb": {**side, **r}, "deque": side}
    cells = store.table([{**row, "ratios": got}]).splitlines()[2].strip("| ").split(" | ")
    assert cells[2:6] == ["50", "100", "50", "0.50"] and cells[9] == "3.00" and cells[12] == "nan"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--items-4k", "0"], "argument --items-4k: must be an integer >= 1, got 0"),
        (["--items-64k", "-5"], "argument --items-64k: must be an integer >= 1, got -5"),
        (["--sample-calls", "0"], "argument --sample-calls: must be an integer >= 1, got 0"),
        (["--stream-samples", "-4"], "argument --stream-samples: must be an integer >= 1, got -4"),
        (["--clients", "0"], "argument --clients: must be an integer >= 1, got 0"),
        (["--clients", "1,x"], "argument --clients: must be an integer >= 1, got 'x'"),
        (["--clients", ","], "argument --clients: must name at least one integer >= 1, got ','"),
        (["--restart-items", "-1"], "argument --restart-items: must be an integer >= 0, got -1"),
        (["--json", "/nonexistent-dir/x.json"], "--json /nonexistent-dir/x.json: the folder"),
    ],
)
def test_bad_values_are_refused_before_anything_runs(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        store.main(["--no-reverb", *argv])
    assert info.value.code == 2 and message in capsys.readouterr().err
