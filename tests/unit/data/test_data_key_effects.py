"""Each key of the ``dataset:`` section changes the problems :func:`marti.data.load_problems` builds from it
(tests/unit/config/key_walk_tables.py maps every ``dataset.*`` key here, for the key walk of test_key_walk.py)."""

from __future__ import annotations

from typing import Any

import datasets
import pytest

from marti.config import DatasetConfig
from marti.data import load_problems
from tests.unit.data.files import jsonl

ROWS = [{"q": f"problem {i}", "a": str(i), "alt_q": f"other {i}", "alt_a": f"x{i}"} for i in range(10)]


def summary(section: dict[str, Any]) -> tuple:
    """What a job would play: the first 25 training problems in order, and the held-out prompts and labels."""
    problems = load_problems(DatasetConfig(**section), seed=0)
    played = [tuple(problems.problem(k).values())[:2] for k in range(25)]
    prompts = [problems.train.prompt(i) for i in range(len(problems.train))]
    labels = [problems.train.label(i) for i in range(len(problems.train))]
    held = None if problems.eval is None else [problems.eval.prompt(i) for i in range(len(problems.eval))]
    return played, prompts, labels, held


@pytest.fixture
def sources(tmp_path):
    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[5:])}
    ).save_to_disk(str(saved))
    return {
        "train": str(jsonl(tmp_path, ROWS, "train.jsonl")),
        "other": str(jsonl(tmp_path, ROWS[::-1], "other.jsonl")),
        "held": str(jsonl(tmp_path, ROWS[:3], "held.jsonl")),
        "saved": str(saved),
    }


#: key -> (extra settings on both sides, the changed value); the value may name a source of the fixture.
CHANGES: dict[str, tuple[dict[str, Any], Any]] = {
    "path": ({}, "other"),
    "split": ({"path": "saved"}, "test"),
    "input_key": ({}, "alt_q"),
    "label_key": ({}, "alt_a"),
    "eval_path": ({}, "held"),
    "eval_fraction": ({}, 0.3),
    "max_samples": ({}, 4),
    "shuffle": ({}, False),
    "seed": ({"seed": 1}, 2),
}


def test_the_table_names_every_key():
    assert sorted(CHANGES) == sorted(DatasetConfig.model_fields)


@pytest.mark.parametrize("key", sorted(CHANGES))
def test_each_dataset_key_changes_the_loaded_problems(sources, key):
    context, value = CHANGES[key]
    base = {"path": "train", "input_key": "q", "label_key": "a", **context}
    base = {k: sources.get(v, v) if k in ("path", "eval_path") else v for k, v in base.items()}
    changed = {**base, key: sources.get(value, value) if key in ("path", "eval_path") else value}
    assert summary(changed) != summary(base)
