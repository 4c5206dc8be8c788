"""A data dir written by an older, laxer version can hold a table config this version refuses (an infinite
``priority_exponent``, an integer over int64): ``marti store --data-dir`` then exits 2 with one line naming the
table, the field, the value and the fix, instead of a validation traceback; the fix it names works."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from marti.types.experience import TableConfig
from services.experience_store.core.storage import SqliteStorage

ROOT = Path(__file__).resolve().parents[4]


def store_args(data: Path, *more: str) -> list[str]:
    """The command line of ``marti store`` on ``data`` (port 0), plus ``more``."""
    return [sys.executable, "-m", "services.experience_store", "--port", "0", "--data-dir", str(data), *more]


@pytest.mark.parametrize(
    ("stored", "field", "value"),
    [
        ('{"name":"u","sampler":"uniform","priority_exponent":Infinity}', "priority_exponent", "inf"),
        ('{"name":"u","max_size":99999999999999999999999}', "max_size", "99999999999999999999999"),
    ],
)
def test_a_stored_config_this_version_refuses_exits_2_with_one_line(tmp_path, stored, field, value):
    data = tmp_path / "data"
    old = SqliteStorage(data)  # the row an older version wrote, as it wrote it
    old.save_table("u", stored)
    old.close()
    proc = subprocess.run(store_args(data), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("marti store: error: the stored config of table 'u' is refused")
    assert f"{field}: " in lines[0] and f"(got {value})" in lines[0]
    assert "--config giving table 'u' a valid config" in lines[0]

    # the fix named: a --config with a valid config for the table replaces the stored one
    tables = tmp_path / "tables.yaml"
    tables.write_text("tables:\n  - name: u\n    sampler: uniform\n")
    proc = subprocess.Popen(
        store_args(data, "--config", str(tables)),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        started = any(re.search(r"listening on \S+:\d+", line) for line in proc.stdout)
    finally:
        proc.terminate()
        proc.wait(30)
    assert started
    reopened = SqliteStorage(data)
    try:
        (row,) = [r for r in reopened.load().tables if r.name == "u"]
        TableConfig.model_validate_json(row.config_json)  # the stored config is a valid one now
    finally:
        reopened.close()
