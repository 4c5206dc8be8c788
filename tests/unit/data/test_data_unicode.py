"""Text is full Unicode end to end: LaTeX, Chinese and emoji come back exactly from every file format and from
the JSON a remote env server receives; nothing is ASCII-sanitised."""

from __future__ import annotations

import json

import pytest

import marti
from marti.codec.env import map_from_proto, map_to_proto
from marti.data import ProblemSet
from marti.errors import InvalidArgumentError
from marti.rewards import make_verifier
from tests.unit.data.files import write

TEXT_ROWS = [
    {"prompt": r"Compute $\frac{1}{2} + \sqrt{x^2}$ when $x = -3$.", "answer": r"\boxed{\frac{7}{2}}"},
    {"prompt": "小明有 3 个苹果，又买了 5 个。他现在有几个苹果？", "answer": "8 个"},
    {"prompt": "Quelle est la capitale de l’Allemagne ? 🇩🇪🎉 — réponds « en un mot »", "answer": "Berlin ✅"},
    {"prompt": "Zero-width\u200bjoiner and tab\tand newline\nkept", "answer": "Ω≈ç√∫"},
]


@pytest.mark.parametrize("kind", ["json", "jsonl", "parquet", "csv"])
def test_unicode_round_trips_through_each_format_and_json(tmp_path, kind):
    problems = ProblemSet.from_source(
        str(write(tmp_path, kind, TEXT_ROWS)), input_key="prompt", label_key="answer"
    )
    rows = [problems.row(i) for i in range(len(problems))]
    assert rows == TEXT_ROWS
    assert [problems.prompt(i) for i in range(4)] == [r["prompt"] for r in TEXT_ROWS]
    # how a row reaches a remote env server: inside the env config, as JSON text
    for text in (json.dumps(rows, ensure_ascii=False), json.dumps(rows)):
        assert json.loads(text) == TEXT_ROWS


def test_a_json_column_mixing_numbers_and_text_keeps_the_text_written(tmp_path):
    """datasets stores a mixed column as JSON text and decoded "007" as 7; such a column is read as text."""
    path = tmp_path / "mixed.jsonl"
    path.write_text(
        '{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": "007"}\n{"prompt": "c", "answer": "1.50"}\n'
    )
    problems = ProblemSet.from_source(f"jsonl:{path}", input_key="prompt", label_key="answer")
    assert [problems.label(i) for i in range(3)] == ["1", "007", "1.50"]
    plain = tmp_path / "plain.jsonl"  # one type per column: kept as it is
    plain.write_text('{"prompt": "a", "answer": 1}\n{"prompt": "b", "answer": 7}\n')
    assert ProblemSet.from_source(f"jsonl:{plain}", input_key="prompt", label_key="answer").label(1) == 7


@pytest.mark.parametrize("kind", ["jsonl", "json"])
def test_a_mixed_json_column_keeps_every_string_exactly_and_numbers_as_written(tmp_path, kind):
    """datasets stores a mixed column as JSON text: read back as text, its strings came back JSON-quoted."""
    labels = [
        1,
        "Paris",
        "café",
        'q"x',
        "007",
        1.50,
        "1",
        "🎉 \\frac{1}{2}",
        12345678901234567890,
        None,
        [1, "a"],
    ]
    rows = [{"prompt": f"p{i}", "answer": label} for i, label in enumerate(labels)]
    path = write(tmp_path, kind, rows)
    if kind == "jsonl":  # 1.50 as written (json.dumps writes 1.5)
        path.write_text(
            path.read_text(encoding="utf-8").replace('"answer": 1.5}', '"answer": 1.50}'), "utf-8"
        )
    problems = ProblemSet.from_source(str(path), input_key="prompt", label_key=None)
    got = [problems.row(i)["answer"] for i in range(len(problems))]
    decimal = "1.50" if kind == "jsonl" else "1.5"
    assert got == ["1", "Paris", "café", 'q"x', "007", decimal, "1", "🎉 \\frac{1}{2}", "12345678901234567890",
                   None, [1, "a"]]  # fmt: skip
    assert all(type(v) is str for v in got[:9])


@pytest.mark.parametrize("layout", ["jsonl", "json", "pretty"])
def test_json_numbers_keep_the_number_written_beside_floats_and_beyond_64_bits(tmp_path, layout):
    """datasets reads such a column as floats: 1 beside 1.5 was 1.0, 12345678901234567890 was 1.23...e+19
    (kept as its digits: an integer beyond 64 bits does not fit an env server's wire)."""
    written = ["12345678901234567890", "1", "1.5", "-7", "2e3", "null"]
    records = [f'{{"prompt": "p{i}", "answer": {w}}}' for i, w in enumerate(written)]
    text = {"jsonl": "\n".join(records), "json": "[" + ",\n".join(records) + "]"}.get(layout)
    path = tmp_path / f"n.{'json' if layout == 'json' else 'jsonl'}"
    path.write_text(
        text or "\n".join(r.replace(", ", ",\n  ") for r in records)
    )  # pretty: one object, 2 lines
    problems = ProblemSet.from_source(str(path), input_key="prompt", label_key=None)
    got = [problems.row(i)["answer"] for i in range(len(problems))]
    assert got == ["12345678901234567890", 1, 1.5, -7, 2000.0, None]  # beyond 64 bits: its digits
    assert [type(v) for v in got[:5]] == [str, int, float, int, float]
    assert make_verifier("exact")("12345678901234567890", str(got[0])) == 1.0  # the text a verifier reads
    assert str(got[1]) == "1"


@pytest.mark.parametrize("kind", ["jsonl", "json"])
def test_values_inside_json_lists_and_objects_come_back_as_written(tmp_path, kind):
    """datasets decoded the string "007" beside 7 inside a list or an object as the number 7, and read nested
    numbers as floats: 1234567890123456789 was 1.2345678901234568e+18, 1 beside 1.5 was 1.0."""
    records = [
        '{"q": "x", "tags": ["007", 7], "meta": {"zip": "007"}, "o": {"k": 1234567890123456789}, "l": [1, 1.5]}',
        '{"q": "y", "tags": [], "meta": {"zip": 7}, "o": {"k": 1}, "l": [2, [3, "4"]]}',
        '{"q": "z", "tags": null, "meta": {"zip": "x", "more": [{"n": 1}, {"n": 2.5}]}, "o": {"k": 1.5}, "l": []}',
    ]
    path = tmp_path / f"nested.{kind}"
    path.write_text("\n".join(records) if kind == "jsonl" else "[" + ",\n".join(records) + "]")
    problems = ProblemSet.from_source(str(path), input_key="q", label_key=None)
    assert [problems.row(i) for i in range(3)] == [json.loads(r) for r in records]
    got = problems.row(0)
    assert got["tags"] == ["007", 7] and got["meta"] == {"zip": "007"} and got["l"] == [1, 1.5]
    assert type(got["l"][0]) is int and got["o"]["k"] == 1234567890123456789


def test_a_json_integer_beyond_64_bits_is_its_digits_and_reaches_an_env_server(tmp_path):
    """Kept as a Python int, such a label crashed the job's env check with a raw "ValueError: Value out of
    range" (the env wire's integers are int64), after --overwrite had cleared the run folder."""
    path = tmp_path / "big.jsonl"
    path.write_text(
        '{"q": "What is big?", "a": 12345678901234567890, "n": {"k": [-9223372036854775809, 7]}}\n'
        '{"q": "Edges", "a": 9223372036854775807, "n": {"k": [-9223372036854775808]}}\n'
    )
    problems = ProblemSet.from_source(f"jsonl:{path}", input_key="q", label_key="a")
    assert [problems.label(i) for i in range(2)] == ["12345678901234567890", 9223372036854775807]
    assert problems.row(0)["n"] == {"k": ["-9223372036854775809", 7]}
    assert problems.row(1)["n"] == {"k": [-9223372036854775808]}
    for i in range(2):  # the env config of an episode, over the env server's wire
        row = map_from_proto(map_to_proto({"row": problems.row(i)}))["row"]
        assert row == problems.row(i)
        env = marti.make("dataset_task", row=row, input_key="q", label_key="a", verifier="exact")
        env.reset(seed=0)
        assert env.step({"agent_1": f"Answer: {problems.label(i)}"})[1] == {"agent_1": 1.0}


def test_rows_given_with_an_integer_beyond_64_bits_are_refused_naming_it():
    with pytest.raises(
        InvalidArgumentError, match=r"row 0, column 'm': the integer 9223372036854775808 is beyond 64 bits"
    ):
        ProblemSet([{"q": "x", "a": "1", "m": {"k": [2**63]}}], input_key="q", label_key="a")


def test_a_csv_with_a_utf8_byte_order_mark_reads_its_header_and_cells_as_written(tmp_path) -> None:
    path = tmp_path / "excel.csv"  # Excel's "CSV UTF-8" starts the file with a byte-order mark
    path.write_bytes(b"\xef\xbb\xbfprompt,answer\nq1,1\ncaf\xc3\xa9,007\n")
    problems = ProblemSet.from_source(str(path), input_key="prompt", label_key="answer")
    assert problems.columns == ["prompt", "answer"]
    assert [(problems.prompt(i), problems.label(i)) for i in range(len(problems))] == [
        ("q1", "1"),
        ("café", "007"),
    ]
