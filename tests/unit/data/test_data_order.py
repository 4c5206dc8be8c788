"""The order rows are played in, the held-out fraction, and a resumed job continuing at the right row."""

from __future__ import annotations

import pytest

from marti.config import DatasetConfig
from marti.data import load_problems, permutation, row_of, split_indices
from marti.errors import InvalidArgumentError
from tests.unit.data.files import jsonl


def test_every_row_once_per_epoch_in_a_new_order_each_epoch():
    n = 20
    epochs = [[row_of(k, n, seed=3) for k in range(e * n, (e + 1) * n)] for e in range(4)]
    assert all(sorted(e) == list(range(n)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 4  # a different order each epoch
    assert epochs[0] != list(range(n))


def test_the_order_depends_only_on_the_seed():
    a = [row_of(k, 15, seed=1) for k in range(45)]
    assert a == [row_of(k, 15, seed=1) for k in range(45)]
    assert a != [row_of(k, 15, seed=2) for k in range(45)]
    assert permutation(15, 1, 0) == (*[row_of(k, 15, seed=1) for k in range(15)],)


def test_without_shuffle_rows_are_in_file_order_every_epoch():
    assert [row_of(k, 4, seed=9, shuffle=False) for k in range(10)] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]


@pytest.mark.parametrize(("k", "n"), [(-1, 3), (0, 0), (True, 3), (1.0, 3)])
def test_bad_indices_are_typed(k, n):
    with pytest.raises(InvalidArgumentError, match="row_of needs"):
        row_of(k, n, seed=0)


def test_a_resumed_job_continues_at_the_right_row(tmp_path):
    """A job that stops after problem k and a new process that loads the same section and continues from
    k play the same rows as one uninterrupted job: the row of problem k depends only on k."""
    path = jsonl(tmp_path, [{"q": f"problem {i}", "a": str(i)} for i in range(7)])
    cfg = DatasetConfig(path=str(path), input_key="q", label_key="a", seed=5)
    whole = [load_problems(cfg).problem(k)["q"] for k in range(30)]
    first = load_problems(cfg)
    before = [first.problem(k)["q"] for k in range(11)]  # stopped mid-epoch 1
    resumed = load_problems(DatasetConfig(path=str(path), input_key="q", label_key="a", seed=5))
    assert before + [resumed.problem(k)["q"] for k in range(11, 30)] == whole
    assert sorted(whole[7:14]) == sorted(f"problem {i}" for i in range(7))  # epoch 1: each row once


def test_the_held_out_fraction_is_seeded_disjoint_and_complete():
    train, held = split_indices(50, 0.2, seed=7)
    assert len(held) == 10 and set(train).isdisjoint(held) and sorted(train + held) == list(range(50))
    assert (train, held) == split_indices(50, 0.2, seed=7)
    assert held != split_indices(50, 0.2, seed=8)[1]


@pytest.mark.parametrize(("n", "fraction"), [(3, 0.1), (3, 0.9), (1, 0.5)])
def test_a_fraction_that_empties_a_part_is_refused(n, fraction):
    with pytest.raises(InvalidArgumentError, match=rf"eval_fraction {fraction} of {n} rows holds out"):
        split_indices(n, fraction, seed=0, source="src")


def test_load_problems_with_an_eval_fraction_keeps_source_rows(tmp_path):
    path = jsonl(tmp_path, [{"q": f"p{i}", "a": str(i)} for i in range(10)])
    problems = load_problems(
        DatasetConfig(path=str(path), input_key="q", label_key="a", eval_fraction=0.3, seed=1)
    )
    assert (len(problems.train), len(problems.eval)) == (7, 3)
    train = {problems.train.prompt(i) for i in range(7)}
    held = {problems.eval.prompt(i) for i in range(3)}
    assert train.isdisjoint(held) and len(train | held) == 10
    # every problem keeps the row it had in the file (errors name that row)
    assert all(problems.eval.prompt(i) == f"p{problems.eval.position(i)}" for i in range(3))
    assert "held-out part" in problems.eval.source


def test_load_problems_with_an_eval_file_and_max_samples(tmp_path):
    train = jsonl(tmp_path, [{"q": f"t{i}", "a": "1"} for i in range(6)], "train.jsonl")
    held = jsonl(tmp_path, [{"q": f"e{i}", "a": "1"} for i in range(6)], "eval.jsonl")
    cfg = DatasetConfig(
        path=str(train), eval_path=f"jsonl:{held}", input_key="q", label_key="a", max_samples=4
    )
    problems = load_problems(cfg, seed=3)
    assert [problems.train.prompt(i) for i in range(4)] == ["t0", "t1", "t2", "t3"]
    assert len(problems.eval) == 4 and problems.eval.prompt(0) == "e0" and problems.seed == 3
    with pytest.raises(InvalidArgumentError, match="no job seed"):
        load_problems(cfg)
