"""User reward functions (TRL-style calls) and the one check every reward kind's output goes through."""

from __future__ import annotations

import math

import numpy as np
import pytest

from marti.errors import DeadlineExceededError, InvalidArgumentError, NotFoundError
from marti.rewards import RewardFunction, WeightedSum, check_scores, reward_functions

PROMPTS = ["What is 2+2?", "Quelle est la capitale de la France ? \\(x^2\\)"]
COMPLETIONS = ["4", "Paris"]
COLUMNS = {"prompt": PROMPTS, "label": ["4", "Lyon"], "level": [1, 2]}

USER_FILE = """
def exact(prompts, completions, label, **kwargs):
    return [float(c.strip() == l) for c, l in zip(completions, label)]

def seen(prompts, completions, **kwargs):
    return [float(len(kwargs))] * len(completions)

def divide(prompts, completions, **kwargs):
    return [1 / 0 for _ in completions]

def nan(prompts, completions, **kwargs):
    return [1.0, float("nan")]

def short(prompts, completions, **kwargs):
    return [1.0]
"""


@pytest.fixture
def user_file(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(USER_FILE)
    monkeypatch.chdir(tmp_path)
    return "my_rewards.py"


def test_file_function_is_called_trl_style_with_every_column(user_file):
    calls = []

    def spy(prompts, completions, **columns):
        calls.append((prompts, completions, columns))
        return np.array([0.5, 1.5])

    assert RewardFunction(f"{user_file}:exact").score(PROMPTS, COMPLETIONS, COLUMNS) == [1.0, 0.0]
    assert RewardFunction(spy).score(PROMPTS, COMPLETIONS, COLUMNS) == [0.5, 1.5]
    prompts, completions, columns = calls[0]
    assert prompts == PROMPTS and completions == COMPLETIONS
    assert columns == {"label": ["4", "Lyon"], "level": [1, 2]}  # 'prompt' is what prompts= holds (as TRL)


def test_module_path_loads(user_file):
    assert RewardFunction("my_rewards:seen").score(PROMPTS, COMPLETIONS, COLUMNS) == [2.0, 2.0]


def test_function_that_raises_names_itself_the_exception_and_the_first_prompt(user_file):
    with pytest.raises(InvalidArgumentError) as err:
        RewardFunction(f"{user_file}:divide").score(PROMPTS, COMPLETIONS, COLUMNS)
    msg = str(err.value)
    assert "my_rewards.py:divide" in msg and "ZeroDivisionError" in msg and "What is 2+2?" in msg
    assert isinstance(err.value.__cause__, ZeroDivisionError)


def test_marti_error_raised_by_a_function_keeps_its_class():
    def slow(prompts, completions, **kw):
        raise DeadlineExceededError("judge did not answer in 5 s")

    with pytest.raises(DeadlineExceededError, match="slow.*judge did not answer"):
        RewardFunction(slow).score(PROMPTS, COMPLETIONS, COLUMNS)


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        ("nan", ["my_rewards.py:nan", "index 1", "nan"]),
        ("short", ["my_rewards.py:short", "expected 2, got 1"]),
    ],
)
def test_nan_and_wrong_length_are_errors_never_zero(user_file, fn, words):
    with pytest.raises(InvalidArgumentError) as err:
        RewardFunction(f"{user_file}:{fn}").score(PROMPTS, COMPLETIONS, COLUMNS)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_missing_file_and_attribute_are_named(user_file):
    with pytest.raises(NotFoundError, match="nope.py"):
        RewardFunction("nope.py:f")
    with pytest.raises(NotFoundError, match="absent"):
        RewardFunction(f"{user_file}:absent")
    with pytest.raises(InvalidArgumentError, match="not a callable"):
        RewardFunction(f"{user_file}:__name__")


def test_column_colliding_with_a_keyword_is_refused():
    with pytest.raises(InvalidArgumentError, match="column 'completions'"):
        RewardFunction(lambda **kw: [0.0]).score(["p"], ["c"], {"completions": ["x"]})


def test_columns_of_another_length_are_refused():
    with pytest.raises(InvalidArgumentError, match="column 'label' has 1 values for 2 completions"):
        RewardFunction(lambda **kw: [0.0, 0.0]).score(PROMPTS, COMPLETIONS, {"label": ["4"]})


def test_weighted_functions_sum(user_file):
    scorer = reward_functions([f"{user_file}:exact", "my_rewards:seen"], weights=[2.0, 0.5])
    assert scorer.score(PROMPTS, COMPLETIONS, COLUMNS) == [2.0 + 1.0, 0.0 + 1.0]
    with pytest.raises(InvalidArgumentError, match="1 weights for 2 scorers"):
        reward_functions([f"{user_file}:exact", "my_rewards:seen"], weights=[1.0])
    with pytest.raises(InvalidArgumentError):
        reward_functions(f"{user_file}:exact")


def test_weighted_sum_checks_each_scorer_output():
    class Bad:
        name = "reward model '/m'"

        def score(self, prompts, completions, columns):
            return [1.0] * (len(completions) + 1)

    with pytest.raises(InvalidArgumentError, match="reward model '/m' returned 3 scores for 2 completions"):
        WeightedSum([Bad()]).score(PROMPTS, COMPLETIONS, {})
    with pytest.raises(InvalidArgumentError, match="non-empty list of reward scorers"):
        WeightedSum([object()])


@pytest.mark.parametrize(
    ("scores", "words"),
    [
        ({"a": 1.0}, ["a value of type dict", "expected a list of 2 floats"]),
        ([1.0, math.inf], ["index 1", "inf"]),
        ([True, 1.0], ["index 0", "True", "bool"]),
        ([None, 1.0], ["index 0", "None"]),
        ([1.0, 10**400], ["index 1", "int"]),
        (["1.0", 1.0], ["index 0", "'1.0'", "str"]),
        ([1.0, 2.0, 3.0], ["3 scores for 2 completions"]),
        (np.array([[1.0, 2.0]]), ["1 scores for 2 completions"]),
    ],
)
def test_check_scores_names_the_scorer_index_and_value(scores, words):
    with pytest.raises(InvalidArgumentError) as err:
        check_scores(scores, 2, scorer="reward function 'f.py:g'")
    assert "reward function 'f.py:g'" in str(err.value)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_check_scores_accepts_numpy_and_ints():
    assert check_scores(np.array([1, 2], dtype=np.int64), 2, scorer="s") == [1.0, 2.0]
    assert check_scores((np.float32(0.5), 3), 2, scorer="s") == [0.5, 3.0]
