"""Bad data is a typed error that names the file, the row, the column and the value, never a raw exception or
a silently skipped row."""

from __future__ import annotations

import math
import subprocess
import sys

import datasets
import pytest

from marti.data import ProblemSet
from marti.data.json_text import as_text, keep_as_written, read_records
from marti.errors import InvalidArgumentError, NotFoundError
from tests.unit.data.files import jsonl, write


def test_a_missing_file_is_not_found_and_named(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(NotFoundError, match=f"JSON file '{path}' does not exist"):
        ProblemSet.from_source(f"jsonl:{path}", input_key="prompt")


def test_an_empty_file_is_named(tmp_path):
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(InvalidArgumentError, match=r"e\.jsonl' is empty \(0 bytes\)"):
        ProblemSet.from_source(str(tmp_path / "e.jsonl"), input_key="prompt")


@pytest.mark.parametrize(
    ("name", "text"),
    [("bad.jsonl", '{"prompt": "a"}\n{bad\n'), ("bad.parquet", "not parquet at all"), ("bad.json", "[{")],
)
def test_a_malformed_file_names_the_file_and_the_parser_error(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    with pytest.raises(InvalidArgumentError, match=rf"{name}' could not be read as (JSON|PARQUET): \w+"):
        ProblemSet.from_source(str(tmp_path / name), input_key="prompt")


GOOD = '{"prompt": "a", "answer": "1"}\n'


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("b.jsonl", GOOD + "{bad\n", "line 2, column 2: Expecting property name"),
        ("b.jsonl", GOOD + '{"prompt": "b", "answer": }\n', "line 2, column 27: Expecting value"),
        ("b.jsonl", GOOD + '{"prompt": "b"\n' + GOOD, "line 2, column 15: Expecting ',' delimiter"),
        ("b.jsonl", GOOD + "\n\n" + '{"prompt": "b",\n', "line 4, column 16: Expecting property name"),
        ("b.jsonl", GOOD + GOOD.strip() + " x\n", "line 2, column 32: Extra data"),
        ("b.jsonl", GOOD + '"x"\n', "line 2, column 1: a JSON lines file holds objects, got '\"x\"'"),
        ("b.jsonl", GOOD + "[1]\n", r"line 2, column 1: a JSON lines file holds objects, got '\[1\]'"),
        ("b.json", "[" + GOOD.strip() + ',\n {"prompt": }]', "line 2, column 13: Expecting value"),
        ("b.jsonl", "{\n  " + GOOD[1:] + '{\n  "prompt": \n}\n', "line 5, column 1: Expecting value"),
    ],
)
def test_a_json_syntax_error_names_the_file_and_its_line(tmp_path, name, text, where):
    """datasets' fallback parser said only "Trailing data at position 27"."""
    (tmp_path / name).write_text(text)
    with pytest.raises(InvalidArgumentError, match=rf"{name}' could not be read as JSON: {where}"):
        ProblemSet.from_source(str(tmp_path / name), input_key="prompt")


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("d.json", '[{"q": "x", "a": "1"},\n {"q": "y", "a": "2", "q": "z"}]', "line 2, column 2: in the record starting here, key 'q' is written twice"),
        ("d.jsonl", '{"q": "x", "a": "1"}\n{"q": "y", "a": "2", "a": "3"}\n', "line 2, column 1: in the record starting here, key 'a' is written twice"),
        ("d.jsonl", '{"q": "x", "a": "1"}\n\n{"q": "y",\n "a": "2", "m": {"k": 1, "k": 2}}\n', "line 3, column 1: .* key 'k' is written twice"),
        ("d.json", '[{"q": "x", "a": "1"}, 5, [1], {"q": "y", "a": "2", "m": [{"k": 1, "k": 2}]}]', "line 1, column 32: .* key 'k' is written twice"),
    ],
)  # fmt: skip
def test_a_json_key_written_twice_in_one_object_names_the_file_line_and_key(tmp_path, name, text, where):
    """JSON kept the last value silently (a JSON array: the prompt "y" was dropped); JSON lines gave datasets'
    "Trailing data at position 17"."""
    (tmp_path / name).write_text(text)
    with pytest.raises(
        InvalidArgumentError, match=rf"{name}' could not be read as JSON: {where} in one object"
    ):
        ProblemSet.from_source(str(tmp_path / name), input_key="q", label_key="a")


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("n.jsonl", '{"q": "x", "a": "1"}\n{"q": "y", "a": 1e400}\n', "line 2, column 1: in the record starting here, the number 1e400 is beyond the range of a double"),
        ("n.jsonl", '{"q": "y", "a": 1e400}\n', "line 1, column 1: in the record starting here, the number 1e400 is beyond"),
        ("n.json", '[{"q": "x", "a": "1"},\n {"q": "y", "a": "2", "m": [-1e309]}]', "line 2, column 2: .* the number -1e309 is beyond"),
        ("n.json", '[{"q": "x", "a": "1"},\n 5]', "line 2, column 2: a JSON array of records holds objects, got '5' beside objects"),
        ("n.json", '[{"q": "x", "a": "1"}, "s, t"]', """line 1, column 24: a JSON array of records holds objects, got '"s, t"'"""),
    ],
)  # fmt: skip
def test_a_json_number_beyond_a_double_or_an_array_mixing_objects_names_its_line(tmp_path, name, text, where):
    """datasets said "Trailing data at position 17", "If using all scalar values, you must pass an index" or
    "ArrowInvalid: JSON parse error: Column() changed from object to string in row 0": no line, no column."""
    (tmp_path / name).write_text(text)
    with pytest.raises(InvalidArgumentError, match=rf"{name}' could not be read as JSON: {where}"):
        ProblemSet.from_source(str(tmp_path / name), input_key="q", label_key="a")


def test_a_csv_header_cell_without_a_name_is_refused_naming_it(tmp_path):
    """datasets said "KeyError: 'Field "" does not exist in schema'"."""
    (tmp_path / "e.csv").write_text("q,a,\nx,1,z\n")
    with pytest.raises(InvalidArgumentError, match=r"e\.csv': the header's column 3 \(1-based\) has no name"):
        ProblemSet.from_source(str(tmp_path / "e.csv"), input_key="q", label_key="a")


LATIN1 = {  # file -> its bytes, the line of the Latin-1 byte
    "l.jsonl": (b'{"prompt": "tea", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "2"}\n', 2),
    "l.json": (b'[{"prompt": "tea", "answer": "1"},\n {"prompt": "caf\xe9", "answer": "2"}]', 2),
    "l.csv": (b"prompt,answer\ntea,1\ncaf\xe9,2\n", 3),
}


@pytest.mark.parametrize("name", sorted(LATIN1))
def test_a_file_that_is_not_utf8_names_the_file_line_and_byte(tmp_path, name):
    """Latin-1 bytes: a raw UnicodeDecodeError (JSON lines: from pyarrow, after the load) before."""
    data, line = LATIN1[name]
    (tmp_path / name).write_bytes(data)
    with pytest.raises(
        InvalidArgumentError,
        match=rf"{name}' is not UTF-8: byte 0xe9 at line {line} \(byte offset {data.index(0xE9)}\)"
        r".*must be UTF-8",
    ):
        ProblemSet.from_source(str(tmp_path / name), input_key="prompt", label_key="answer")


def test_marti_train_dataset_on_a_file_that_is_not_utf8_is_a_one_line_refusal(tmp_path):
    """``marti train --dataset FILE``: exit 2 and one line naming the file, not a traceback (exit 1)."""
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(LATIN1["l.jsonl"][0])
    proc = subprocess.run(
        [sys.executable, "-m", "marti.command.main", "train", "--actor_model", "tiny-llama",
         "--dataset", f"jsonl:{path}", "--input_key", "prompt", "--label_key", "answer", "--set", f"output.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "latin1.jsonl' is not UTF-8: byte 0xe9 at line 2" in proc.stderr.splitlines()[-1]
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("q,a\nWhat is 2+2?,4,note\nWhat is 3+3?,6,note\n", r"line 2 has 3 field\(s\), the header has 2;"),
        (
            "q,a\nx,4,\ny,6,\n",
            r"line 2 has 3 field\(s\), the header has 2 \(a trailing comma adds an empty field\)",
        ),
        ('q,a\nx,1\n\n"two\nlines",2\ny,3,z\n', r"line 6 has 3 field\(s\), the header has 2;"),
        ("q,a\nx,1\ny\n", r"line 3 has 1 field\(s\), the header has 2;"),
    ],
)
def test_a_csv_row_with_another_number_of_fields_than_the_header_names_its_line(tmp_path, text, where):
    """pandas read a first data row with one field more with its first column as the index: every value one
    column off, no error (the prompts lost), or "row 0 has no label" for a trailing comma."""
    (tmp_path / "f.csv").write_text(text, newline="")
    with pytest.raises(InvalidArgumentError, match=rf"CSV file '.*f\.csv': {where}"):
        ProblemSet.from_source(str(tmp_path / "f.csv"), input_key="q", label_key="a")


@pytest.mark.parametrize(("text", "column"), [("q,a,a\nx,1,2\n", "a"), ("q,a,b,b\nx,1,2,3\n", "b")])
def test_a_csv_header_naming_a_column_twice_is_refused_naming_it(tmp_path, text, column):
    """datasets kept the first column of that name and dropped the second one's values, no error."""
    (tmp_path / "d.csv").write_text(text)
    with pytest.raises(InvalidArgumentError, match=rf"d\.csv': the header names column '{column}' twice"):
        ProblemSet.from_source(str(tmp_path / "d.csv"), input_key="q", label_key="a")


def test_a_csv_with_blank_lines_and_quoted_newlines_has_no_field_count_error(tmp_path):
    (tmp_path / "f.csv").write_text('q,a\r\n\r\nx,1\r\n   \r\n"two\nlines",2\r\n', newline="")
    ps = ProblemSet.from_source(str(tmp_path / "f.csv"), input_key="q", label_key="a")
    assert [ps.row(i) for i in range(len(ps))] == [{"q": "x", "a": "1"}, {"q": "two\nlines", "a": "2"}]


@pytest.mark.parametrize(("name", "text"), [("none.json", "[]"), ("blank.jsonl", "\n\n"), ("h.csv", "q,a\n")])
def test_a_dataset_without_rows(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    with pytest.raises(InvalidArgumentError, match=rf"{name}' has no rows"):
        ProblemSet.from_source(str(tmp_path / name), input_key="prompt")
    with pytest.raises(InvalidArgumentError, match="the dataset has no rows"):
        ProblemSet([], input_key="prompt", source="mine")


def test_a_parquet_file_without_rows(tmp_path):
    """pyarrow answered a 0-row Parquet file with 'BatchSize must be greater than 0'; the docs promise 'has no
    rows', as for the other formats."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())}),
                   tmp_path / "empty.parquet")  # fmt: skip
    with pytest.raises(InvalidArgumentError, match=r"empty\.parquet' has no rows"):
        ProblemSet.from_source(str(tmp_path / "empty.parquet"), input_key="prompt")


def test_an_unknown_column_names_the_columns_and_the_closest(tmp_path):
    path = jsonl(tmp_path, [{"question": "q", "answer": "a"}])
    with pytest.raises(
        InvalidArgumentError,
        match=r"input_key 'questoin' is not a column; the columns are \['question', 'answer'\]; "
        r"did you mean 'question'\?",
    ):
        ProblemSet.from_source(str(path), input_key="questoin", label_key="answer")
    with pytest.raises(InvalidArgumentError, match=r"label_key 'solution' is not a column.*label_key: null"):
        ProblemSet.from_source(str(path), input_key="question", label_key="solution")


def test_a_row_without_a_label_names_the_row_and_column(tmp_path):
    path = jsonl(tmp_path, [{"q": "a", "ans": "1"}, {"q": "b", "ans": "2"}, {"q": "c", "ans": None}])
    with pytest.raises(
        InvalidArgumentError,
        match=r"p\.jsonl': row 2 \(.*p\.jsonl:3\) has no label in column 'ans' \(got None\)",
    ):
        ProblemSet.from_source(str(path), input_key="q", label_key="ans")
    # no label needed: the same file loads
    assert len(ProblemSet.from_source(str(path), input_key="q", label_key=None)) == 3


@pytest.mark.parametrize(
    ("labels", "row", "fragment"),
    [
        (['"4"', "[]", "{}"], 1, r"a list label \[\]"),  # a column of [] and {}: read as '[]' and '{}' before
        (['"4"', '"5"', "{}"], 2, r"an object label \{\}"),
        (["[1, 2]", "[3]", "[]"], 0, r"a list label \[1, 2\]"),
        (['{"x": 1}', '{"x": 2}', '{"x": 3}'], 0, r"an object label \{'x': 1\}"),
        (["1", "2", "true"], 2, "a boolean label True"),
    ],
)
def test_a_label_that_is_not_text_or_a_number_is_named(tmp_path, labels, row, fragment):
    path = tmp_path / "l.jsonl"
    path.write_text("".join(f'{{"q": "q{i}", "ans": {label}}}\n' for i, label in enumerate(labels)))
    with pytest.raises(
        InvalidArgumentError,
        match=rf"l\.jsonl': row {row} \(.*l\.jsonl:{row + 1}\) has {fragment} in column 'ans'; a label must be text",
    ):
        ProblemSet.from_source(str(path), input_key="q", label_key="ans")
    assert len(ProblemSet.from_source(str(path), input_key="q", label_key=None)) == 3  # no label: not checked


def test_values_put_back_need_the_records_datasets_read():
    """The guard of the per-column fix-up: records that are not the rows read are an error, not a shift."""
    with pytest.raises(
        InvalidArgumentError, match=r"src: column\(s\) \['a'\] .*2 record\(s\) are not the 1 row"
    ):
        keep_as_written([{"a": "1"}], {"a": as_text}, read_records('{"a": 1}\n{"a": "x"}\n', "s")[0], "src")


def test_an_empty_label_string_is_no_label():
    with pytest.raises(InvalidArgumentError, match="row 0 has no label in column 'a'"):
        ProblemSet([{"q": "x", "a": "  "}], input_key="q", label_key="a")


@pytest.mark.parametrize(
    ("prompt", "fragment"),
    [
        ("", "an empty prompt"),
        ("   ", "an empty prompt"),
        (3, "a non-string prompt 3"),
        (None, "no prompt"),
    ],
)
def test_a_bad_prompt_names_the_row_and_value(prompt, fragment):
    rows = [{"q": "fine", "a": "1"}, {"q": prompt, "a": "2"}]
    with pytest.raises(InvalidArgumentError, match=rf"src: row 1 has {fragment}.*column 'q'"):
        ProblemSet(rows, input_key="q", label_key="a", source="src")


def test_a_row_whose_key_is_misspelt_is_named_with_the_key_it_has(tmp_path):
    """A new user's 5-row file with ``"questoin"`` in one row was refused as ``has a non-string prompt None in
    column 'question'``: the row has no such value because its key is misspelt. The message now says the row has
    no prompt (or label) there and names the row's close key; a row that has no close key gets no guess."""
    rows = [{"question": "What is 2+2?", "answer": "4"}] * 2 + [{"questoin": "What is 10-7?", "answer": "3"}]
    path = write(tmp_path, "jsonl", rows, name="typo")
    with pytest.raises(InvalidArgumentError) as prompt:
        ProblemSet.from_source(f"jsonl:{path}", input_key="question", label_key="answer")
    assert str(prompt.value) == (
        f"JSON file '{path}': row 2 ({path}:3) has no prompt in column 'question' (got None); the row has a "
        "value in 'questoin': a misspelt key?"
    )
    with pytest.raises(InvalidArgumentError) as label:
        ProblemSet(
            [{"q": "x", "answer": "1"}, {"q": "y", "anwser": "2"}],
            input_key="q",
            label_key="answer",
            source="s",
        )
    assert (
        str(label.value)
        == "s: row 1 has no label in column 'answer' (got None); the row has a value in 'anwser': a misspelt key?"
    )
    with pytest.raises(InvalidArgumentError) as no_guess:
        ProblemSet(
            [{"q": "x", "answer": "1"}, {"q": "y", "zzz": "2"}], input_key="q", label_key="answer", source="s"
        )
    assert str(no_guess.value) == "s: row 1 has no label in column 'answer' (got None)"


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (math.nan, "nan is not a finite number"),
        (b"\x00raw", "of type bytes is not JSON-able"),
        ({1: "x"}, "non-string keys"),
        ([1, {"deep": math.inf}], "inf is not a finite number"),
    ],
)
def test_a_value_that_is_not_json_is_named(value, fragment):
    rows = [{"q": "x", "a": "1", "meta": value}]
    with pytest.raises(InvalidArgumentError, match=rf"src: row 0, column 'meta': .*{fragment}"):
        ProblemSet(rows, input_key="q", label_key="a", source="src")


def test_a_binary_parquet_column_is_refused_at_load(tmp_path):
    """The class of non-JSON values a real file can hold (bytes), found before the job starts."""
    path = tmp_path / "b.parquet"
    datasets.Dataset.from_list([{"q": "x", "a": "1", "blob": b"\x01\x02"}]).to_parquet(str(path))
    with pytest.raises(InvalidArgumentError, match=r"b\.parquet'.*row 0, column 'blob'.*bytes"):
        ProblemSet.from_source(str(path), input_key="q", label_key="a")


def test_index_errors_are_typed():
    problems = ProblemSet([{"q": "x"}], input_key="q")
    for bad in (1, -1, True, "0"):
        with pytest.raises(InvalidArgumentError, match=r"problem index .* is not in \[0, 1\)"):
            problems.prompt(bad)
    with pytest.raises(InvalidArgumentError, match="no label_key was given"):
        problems.label(0)


def test_max_samples_keeps_the_first_rows_and_checks_only_those(tmp_path):
    path = jsonl(tmp_path, [{"q": "a", "x": "1"}, {"q": "b", "x": "2"}, {"q": "", "x": "3"}])
    problems = ProblemSet.from_source(str(path), input_key="q", label_key="x", max_samples=2)
    assert [problems.prompt(i) for i in range(len(problems))] == ["a", "b"]
    with pytest.raises(InvalidArgumentError, match=r"row 2 \(.*p\.jsonl:3\) has an empty prompt"):
        ProblemSet.from_source(str(path), input_key="q", label_key="x", max_samples=3)
    for bad in (0, "5", True, 2.0):
        with pytest.raises(InvalidArgumentError, match="max_samples must be an int >= 1"):
            ProblemSet.from_source(str(path), input_key="q", max_samples=bad)


@pytest.mark.parametrize(
    ("keys", "name"),
    [
        ({"input_key": 3}, "input_key"),
        ({"input_key": ""}, "input_key"),
        ({"input_key": "q", "label_key": ["a"]}, "label_key"),
    ],
)
def test_keys_that_are_not_column_names_are_typed_errors(keys, name):
    with pytest.raises(InvalidArgumentError, match=f"src: {name} must name a column"):
        ProblemSet([{"q": "x", "a": "1"}], source="src", **keys)


def test_rows_are_copies():
    rows = [{"q": "x", "tags": ["a"]}]
    problems = ProblemSet(rows, input_key="q")
    rows[0]["tags"].append("changed")
    problems.row(0)["tags"].append("changed too")
    assert problems.row(0) == {"q": "x", "tags": ["a"]}


def test_a_csv_cell_over_pythons_128_kib_field_limit_is_read_and_the_limit_restored(tmp_path):
    """marti's own CSV checks stopped at Python's default field limit with a raw
    ``_csv.Error: field larger than field limit (131072)``; pandas reads the cell."""
    import csv

    big = "x " * 100_000  # 200 kB
    rows = [[big if i == 3 else f"What is {i}?", str(i)] for i in range(5)]
    with open(tmp_path / "big.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["prompt", "answer"], *rows])
    before = csv.field_size_limit()
    ps = ProblemSet.from_source(str(tmp_path / "big.csv"), input_key="prompt", label_key="answer")
    assert ps.row(3)["prompt"] == big and len(ps) == 5
    assert csv.field_size_limit() == before == 131072


def test_a_good_row_is_not_searched_for_a_misspelt_key(monkeypatch):
    """The misspelt-key hint is looked for only in a row that lacks its prompt or label: searching every row
    (difflib over its keys) made the check of 100,000 good rows 7x slower (0.10 -> 0.76 CPU s, 2026-12-06)."""
    import marti.data.checks as checks

    class NoSearch:
        @staticmethod
        def get_close_matches(*args, **kwargs):
            raise AssertionError("a good row was searched for a close key")

    monkeypatch.setattr(checks, "difflib", NoSearch)
    rows = [{"prompt": f"{i} + {i}?", "answer": str(2 * i), "questoin": "x"} for i in range(3)]
    checks.check_rows("rows.jsonl", rows, "prompt", "answer")
