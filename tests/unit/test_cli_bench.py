"""``marti bench``: the benchmarks it lists, and its answers to no name, ``list`` and an unknown name."""

from __future__ import annotations

from pathlib import Path

import pytest

from marti.command import main as cli

ROOT = Path(__file__).resolve().parents[2]


def test_names_are_the_modules_that_say_they_are_a_marti_bench(tmp_path):
    names = cli.bench_names(ROOT / "benchmarks")
    expected = {"broker", "env", "store", "scale", "trainer", "team_comparison", "gateway", "rollout"}
    assert expected <= set(names)
    assert not {"report", "server"} & set(names)  # helpers, not benches
    (tmp_path / "mine.py").write_text('"""``marti bench mine``: mine."""\n')
    (tmp_path / "other.py").write_text('"""``marti bench mine``: named for another file."""\n')
    (tmp_path / "helper.py").write_text('"""A helper."""\n')
    assert cli.bench_names(tmp_path) == ["mine"]
    assert cli.bench_names(tmp_path / "missing") == []


def test_no_name_lists_the_benchmarks_and_fails(capsys):
    assert cli.main(["bench"]) == 2
    out = capsys.readouterr().out
    assert "usage: marti bench NAME" in out and "store" in out and "team_comparison" in out


@pytest.mark.parametrize("ask", ["list", "--help", "-h"])
def test_list_and_help_list_the_benchmarks(ask, capsys):
    assert cli.main(["bench", ask]) == 0
    assert "benchmarks: broker, " in capsys.readouterr().out


def test_an_unknown_name_is_refused_with_the_list(capsys):
    assert cli.main(["bench", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark 'nope'" in err and "broker" in err and "report" not in err


def test_a_benchmarks_own_refusal_is_one_line_without_a_traceback(capsys):
    assert cli.main(["bench", "engine", "--model", "nosuch", "--batches", "1", "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("marti bench engine: error: model 'nosuch' not found") and "Traceback" not in err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("name", cli.bench_names(ROOT / "benchmarks"))
def test_each_benchmarks_help_is_plain_text(name, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", name, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: marti bench {name}") and "``" not in out, out
