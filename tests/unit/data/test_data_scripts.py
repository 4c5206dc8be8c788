"""The data scripts of ``scripts/data`` refuse a bad ``--out`` or ``--difficulty`` with one line and exit status 2
(argparse's), never a traceback, and a flag their kind does not read is refused, not ignored."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from scripts.data.make_allocation_data import PICK_PROBLEMS, balanced_pick_rows
from scripts.data.make_allocation_data import main as make_allocation
from scripts.data.make_arithmetic_data import main as make_arithmetic


def _refused(main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "main, argv",
    [(make_allocation, ["--kind", "pick", "--count", "2"]), (make_arithmetic, ["--count", "2"])],
    ids=["allocation", "arithmetic"],
)
def test_an_out_path_that_cannot_be_written_is_named(main, argv, tmp_path: Path, capsys) -> None:
    line = _refused(main, [*argv, "--out", str(tmp_path)], capsys)
    assert f"--out {tmp_path} is a folder" in line
    blocker = tmp_path / "file"
    blocker.write_text("x")
    line = _refused(main, [*argv, "--out", str(blocker / "rows.jsonl")], capsys)
    assert f"--out {blocker / 'rows.jsonl'} cannot be written" in line
    assert main([*argv, "--out", str(tmp_path / "sub" / "rows.jsonl")]) == 0  # its folder is created
    assert (tmp_path / "sub" / "rows.jsonl").read_text().count("\n") == 2


def test_difficulty_is_checked_and_only_taken_where_it_applies(tmp_path: Path, capsys) -> None:
    out = str(tmp_path / "rows.json")
    line = _refused(
        make_allocation, ["--kind", "resource_allocation", "--difficulty", "nope", "--out", out], capsys
    )
    assert "--difficulty: invalid choice: 'nope'" in line
    line = _refused(make_allocation, ["--kind", "pick", "--difficulty", "hard", "--out", out], capsys)
    assert "--difficulty is for --kind resource_allocation" in line
    assert (
        make_allocation(
            ["--kind", "resource_allocation", "--difficulty", "medium", "--count", "1", "--out", out]
        )
        == 0
    )
    assert len(json.loads(Path(out).read_text())) == 1


def test_pick_rows_are_distinct_problems_and_a_count_above_them_says_so(tmp_path: Path, capsys) -> None:
    out = tmp_path / "rows.jsonl"
    assert make_allocation(["--kind", "pick", "--count", "240", "--out", str(out)]) == 0
    assert f"there are only {PICK_PROBLEMS} distinct pick problems" in capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert PICK_PROBLEMS == 120 and len(rows) == 120
    # no two rows show the agents the same text, and they are every order of the five tasks
    assert len({(r["prompt"], r["leader_view"]) for r in rows}) == 120
    assert len({tuple(r["ranking"]) for r in rows}) == 120
    assert sorted(Counter(r["answer"] for r in rows).values()) == [24] * 5


def test_fewer_pick_rows_are_distinct_and_balanced() -> None:
    rows = balanced_pick_rows(25, 0)
    assert len({(r["prompt"], r["leader_view"]) for r in rows}) == 25
    assert sorted(Counter(r["answer"] for r in rows).values()) == [5] * 5
    with pytest.raises(ValueError, match="count must be in 1..120"):
        balanced_pick_rows(121, 0)
