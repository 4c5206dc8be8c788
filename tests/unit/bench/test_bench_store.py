"""``marti bench store`` end to end at its smallest (no Reverb): every row measured, client CPU per insert and the
load average recorded, the same numbers in ``--out`` and ``--json``."""

from __future__ import annotations

import json
import math

from benchmarks import store


def test_smallest_run_records_rates_client_cpu_and_load(tmp_path, capsys):
    out, copy = tmp_path / "out.json", tmp_path / "copy.json"
    argv = ["--no-reverb", "--items-4k", "32", "--items-64k", "16", "--sample-calls", "1", "--stream-samples",
            "16", "--clients", "1,2", "--restart-items", "0", "--out", str(out), "--json", str(copy)]  # fmt: skip
    assert store.main(argv) == 0
    data = json.loads(out.read_text())
    assert json.loads(copy.read_text()) == data
    assert [(r["item_bytes"], r["clients"]) for r in data["rows"]] == [
        (4096, 1),
        (4096, 2),
        (65536, 1),
        (65536, 2),
    ]
    for r in data["rows"]:
        m = r["marti"]
        assert r["reverb"] is None and m["inserts_per_s"] > 0 and m["samples_per_s"] > 0
        assert m["inserts_per_s_16_per_call"] > 0
        assert 0 < m["client_cpu_ms_per_insert"] < 1000 and math.isfinite(m["client_cpu_ms_per_insert"])
    assert len(data["loadavg_before"].split()) == 3 and len(data["loadavg_after"].split()) == 3
    assert data["reverb_note"] == "skipped (--no-reverb)" and data["cpus"] >= 1
    printed = capsys.readouterr().out
    assert "load average before:" in printed and "cli ms/ins" in printed and "m 16/call" in printed
