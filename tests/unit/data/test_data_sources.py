"""Every source kind loads through ``datasets`` into the same rows: JSON, JSONL, Parquet, CSV (prefixed or by
extension), a ``save_to_disk`` folder (a Dataset, or one split of a DatasetDict), and a hub id (how it is called;
an unreachable hub is a typed error naming the id)."""

from __future__ import annotations

import datasets
import pytest

from marti.data import ProblemSet, parse_source
from marti.errors import InvalidArgumentError, NotFoundError, UnavailableError
from tests.unit.data.files import ROWS, write


@pytest.mark.parametrize("kind", ["json", "jsonl", "parquet", "csv"])
@pytest.mark.parametrize("prefixed", [True, False])
def test_each_file_format_loads_every_row_and_column(tmp_path, kind, prefixed):
    path = write(tmp_path, kind)
    spec = f"{kind}:{path}" if prefixed else str(path)
    problems = ProblemSet.from_source(spec, input_key="prompt", label_key="answer")
    # CSV has no types: every cell is read as the text written (docs/datasets.md)
    expected = [{k: str(v) for k, v in r.items()} for r in ROWS] if kind == "csv" else ROWS
    assert [problems.row(i) for i in range(len(problems))] == expected
    assert problems.prompt(1) == "What is 7 * 6?" and problems.label(1) == "42"
    assert problems.columns == ["prompt", "answer", "level"]
    assert str(path) in problems.source


def test_csv_cells_keep_their_text(tmp_path):
    """``007`` is not the number 7, an empty cell is ``""`` (so a missing label is named, not NaN)."""
    path = tmp_path / "t.csv"
    path.write_text("prompt,answer\nq1,007\nq2,1.50\nq3,NA\n", encoding="utf-8")
    problems = ProblemSet.from_source(str(path), input_key="prompt", label_key="answer")
    assert [problems.label(i) for i in range(3)] == ["007", "1.50", "NA"]


def test_a_json_file_with_a_jsonl_prefix_and_vice_versa(tmp_path):
    """``jsonl:`` and ``json:`` both use the json builder, which reads JSON lines and a JSON array alike."""
    path = write(tmp_path, "json")
    assert len(ProblemSet.from_source(f"jsonl:{path}", input_key="prompt")) == 3


def test_a_saved_dataset_folder(tmp_path):
    folder = tmp_path / "saved"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(folder))
    for spec in (str(folder), f"disk:{folder}"):
        problems = ProblemSet.from_source(spec, input_key="prompt", label_key="answer")
        assert problems.row(2) == ROWS[2] and "saved dataset folder" in problems.source


def test_a_saved_dataset_dict_folder_takes_a_named_split(tmp_path):
    folder = tmp_path / "dd"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])}
    ).save_to_disk(str(folder))
    assert len(ProblemSet.from_source(str(folder), input_key="prompt")) == 3  # train by default
    assert len(ProblemSet.from_source(str(folder), input_key="prompt", split="test")) == 1
    with pytest.raises(NotFoundError, match=r"no split 'validation'; its splits are \['test', 'train'\]"):
        ProblemSet.from_source(str(folder), input_key="prompt", split="validation")


def test_a_split_that_a_file_or_one_saved_dataset_would_ignore_is_refused(tmp_path):
    """A new user set dataset.split=test on a JSONL file and on a saved single Dataset: both trained on every row.
    Sources without named splits refuse any split but ``train`` (their one split), naming the source and split."""
    path = write(tmp_path, "jsonl")
    assert len(ProblemSet.from_source(str(path), input_key="prompt", split="train")) == 3
    with pytest.raises(
        InvalidArgumentError, match=r"is a file: its rows are one split, so split 'test' would be"
    ):
        parse_source(f"jsonl:{path}", split="test")
    folder = tmp_path / "one"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(folder))
    assert len(ProblemSet.from_source(str(folder), input_key="prompt", split="train")) == 3
    with pytest.raises(
        InvalidArgumentError, match=r"is one saved Dataset \(no named splits\), so split 'test'"
    ):
        ProblemSet.from_source(str(folder), input_key="prompt", split="test")


def test_a_folder_that_is_not_a_saved_dataset(tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(InvalidArgumentError, match="not a folder written by Dataset.save_to_disk"):
        ProblemSet.from_source(str(tmp_path / "plain"), input_key="prompt")


@pytest.mark.parametrize(
    ("text", "location", "split", "config"),
    [
        ("openai/gsm8k", "openai/gsm8k", "train", None),
        ("openai/gsm8k@test", "openai/gsm8k", "test", None),
        ("openai/gsm8k:main@test", "openai/gsm8k", "test", "main"),
        ("hf:gsm8k:main", "gsm8k", "train", "main"),
    ],
)
def test_hub_specs_parse(text, location, split, config):
    spec = parse_source(text)
    assert (spec.kind, spec.location, spec.split, spec.config) == ("hub", location, split, config)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "non-empty string"),
        ("json:", "names no path or id"),
        ("data/problems.txt", "not a file of a known format"),
        ("hf:org/name:", "a hub dataset is written ID"),
        ("hf:org/name@", "a hub dataset is written ID"),
    ],
)
def test_bad_specs_are_named(text, fragment):
    with pytest.raises(InvalidArgumentError, match=fragment):
        parse_source(text)


def test_a_split_in_the_spec_and_a_different_one_given():
    with pytest.raises(InvalidArgumentError, match="names split 'test' but the split given is 'train'"):
        parse_source("org/name@test", split="train")
    for bad in ("", 3):
        with pytest.raises(InvalidArgumentError, match="split must be a non-empty string"):
            parse_source("data/x.jsonl", split=bad)


def test_a_hub_id_is_loaded_with_its_config_and_split(monkeypatch):
    """How the hub is called (no network here): ``load_dataset(ID, name=config, split=split)``."""
    calls = []

    def fake(path, **kwargs):
        calls.append((path, kwargs))
        return datasets.Dataset.from_list(ROWS)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    problems = ProblemSet.from_source("openai/gsm8k:main@test", input_key="prompt", label_key="answer")
    assert calls == [("openai/gsm8k", {"name": "main", "split": "test"})]
    assert len(problems) == 3 and problems.source == "hub dataset 'openai/gsm8k' (split test, config main)"


def test_an_unreachable_hub_is_unavailable_and_names_the_id(monkeypatch):
    """``datasets``' own offline path (what a machine without the hub meets), answered at once."""
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(UnavailableError, match="hub dataset 'nobody-here/no-such-set'.*not reachable"):
        ProblemSet.from_source("nobody-here/no-such-set", input_key="prompt")


@pytest.mark.parametrize(
    ("raised", "error", "fragment"),
    [
        (
            datasets.exceptions.DatasetNotFoundError("Dataset 'o/n' doesn't exist"),
            NotFoundError,
            "not found on",
        ),
        (ConnectionError("Couldn't reach 'o/n'"), UnavailableError, "not reachable"),
        (ValueError('Unknown split "tset"'), InvalidArgumentError, "Unknown split"),
    ],
)
def test_hub_failures_are_typed_and_name_the_id(monkeypatch, raised, error, fragment):
    def fail(path, **kwargs):
        raise raised

    monkeypatch.setattr(datasets, "load_dataset", fail)
    with pytest.raises(error, match=rf"hub dataset 'o/n' \(split train\).*{fragment}"):
        ProblemSet.from_source("o/n", input_key="prompt")
