"""Dataset errors name a JSON, JSON lines or CSV file's row as ``row N (FILE:LINE)``: its 0-based position and the
1-based line an editor shows, counting blank lines (JSON lines), lines of an object spread over several lines, a
CSV file's header and lines of a quoted multi-line cell. Parquet rows have no lines: ``row N`` alone.

Before, only the 0-based row was named, which is not the line of a file with blank lines."""

from __future__ import annotations

import re

import datasets
import pytest

from marti.config.sections.dataset import DatasetConfig
from marti.data import ProblemSet, load_problems
from marti.errors import InvalidArgumentError
from tests.refused_runs import train_over_an_old_run


def _refusal(path, **keys) -> str:
    with pytest.raises(InvalidArgumentError) as info:
        ProblemSet.from_source(str(path), **{"input_key": "q", "label_key": "a", **keys})
    return str(info.value)


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        (  # blank lines (and one of spaces) counted
            "p.jsonl",
            '\n{"q": "x", "a": "1"}\n\n\n{"q": "y", "a": "2"}\n  \n{"q": "z", "a": null}\n',
            "row 2 ({path}:7) has no label in column 'a'",
        ),
        (  # an object over several lines: the line it starts on
            "p.jsonl",
            '{"q": "x", "a": "1"}\n{"q": "y",\n "a": "2"}\n\n{"q": "",\n "a": "3"}\n',
            "row 2 ({path}:5) has an empty prompt in column 'q'",
        ),
        (  # a JSON array: the line where the element starts
            "p.json",
            '[\n  {"q": "x", "a": "1"},\n\n  {"q": "y", "a": [1]}\n]\n',
            "row 1 ({path}:4) has a list label [1] in column 'a'",
        ),
        (  # CSV: the header is line 1, a quoted cell over two lines counts both, blank lines are no rows
            "p.csv",
            'q,a\n\nx,1\n"two\nlines",2\n   \ny,\n',
            "row 2 ({path}:7) has no label in column 'a'",
        ),
        (  # a value that is not JSON-able
            "p.jsonl",
            '{"q": "x", "a": "1", "n": 1.5}\n\n{"q": "y", "a": "2", "n": NaN}\n',
            "row 1 ({path}:3), column 'n': nan is not a finite number",
        ),
    ],
    ids=["jsonl-blank-lines", "jsonl-object-over-lines", "json-array", "csv", "not-json-able"],
)
def test_a_bad_row_is_named_by_the_line_it_starts_on(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    assert expected.format(path=path) in _refusal(path)


def test_a_parquet_row_has_no_line_and_is_named_by_its_position(tmp_path):
    path = tmp_path / "p.parquet"
    datasets.Dataset.from_list([{"q": "x", "a": "1"}, {"q": "", "a": "2"}]).to_parquet(str(path))
    assert re.search(r"p\.parquet': row 1 has an empty prompt", _refusal(path))


def test_held_out_and_max_samples_rows_keep_their_lines(tmp_path):
    """A held-out split and ``max_samples`` keep each row's position and its line."""
    path = tmp_path / "p.jsonl"
    path.write_text("".join(f'\n{{"q": "p{i}", "a": "{i}"}}\n' for i in range(10)))  # row i on line 2i + 2
    section = DatasetConfig(path=f"jsonl:{path}", input_key="q", label_key="a", eval_fraction=0.3, seed=1)
    problems = load_problems(section)
    for ps in (problems.train, problems.eval):
        for i in range(len(ps)):
            assert ps.where(i) == f"row {ps.position(i)} ({path}:{2 * ps.position(i) + 2})"
    first = ProblemSet.from_source(str(path), input_key="q", max_samples=3)
    assert [first.where(i) for i in range(3)] == [f"row {i} ({path}:{2 * i + 2})" for i in range(3)]
    assert ProblemSet([{"q": "x"}], input_key="q").where(0) == "row 0"  # rows given in code have no file
    with pytest.raises(InvalidArgumentError, match="lines and file go together"):
        ProblemSet([{"q": "x"}], input_key="q", lines=[1])
    with pytest.raises(InvalidArgumentError, match="2 lines for 1 rows"):
        ProblemSet([{"q": "x"}], input_key="q", lines=[1, 2], file="x.jsonl")


def test_marti_train_names_the_line_of_a_bad_row(tmp_path):
    """Through ``marti train`` in a subprocess: the refusal names ``FILE:LINE`` of a file with blank lines."""
    data = tmp_path / "rows.jsonl"
    rows = [f'{{"prompt": "What is {i}?", "answer": "{i}"}}\n\n' for i in range(6)]
    rows[4] = '{"prompt": "What is 4?", "answer": ""}\n\n'  # row 4, line 9
    data.write_text("".join(rows))
    job = {
        "training_name": "t",
        "num_agents": 1,
        "agents": [{"name": "solver", "pretrain_model": "tiny-llama", "role": "solver"}],
        "dataset": {"path": f"jsonl:{data}", "eval_fraction": 0.2},
    }
    proc = train_over_an_old_run(tmp_path, job)
    assert f"row 4 ({data}:9) has no label in column 'answer'" in proc.stderr, proc.stderr
