"""The trainer benchmark's pure parts: the task's reward and the 'equal or better reward' verdict."""

from __future__ import annotations

import pytest

from benchmarks import sum_task
from benchmarks.trainer import reward_comparison


def _side(tail, scores):
    return {
        "tail_rewards": tail,
        "tail_reward": sum(tail) / len(tail),
        "eval_scores": scores,
        "eval_reward": sum(scores) / len(scores),
    }


def test_task_reward_scores_the_first_integer():
    assert sum_task.reward("The answer is 35.", 35) == sum_task.CORRECT_REWARD
    assert sum_task.reward("34, no 35", 35) == sum_task.NUMBER_REWARD
    assert sum_task.reward("thirty-five", 35) == 0.0
    problems = sum_task.make_problems(3, 5)
    assert problems == sum_task.make_problems(3, 5) and len(problems) == 5
    with pytest.raises(ValueError):
        sum_task.make_problems(0, -1)


def test_a_difference_inside_one_standard_error_counts_as_equal():
    ours = _side([0.088, 0.081, 0.144, 0.1], [0.1, 0.1, 1.0, 0.1])
    trl = _side([0.138, 0.088, 0.088, 0.1], [0.1, 0.1, 1.0, 0.1])
    ok, text = reward_comparison(ours, trl)
    assert ok and "training -0.000" in text and "held-out +0.000 (paired SE 0.000)" in text


def test_a_clearly_lower_reward_is_not_equal():
    ours = _side([0.05, 0.05, 0.05, 0.05], [0.1, 0.1, 0.1, 0.1])
    trl = _side([0.3, 0.31, 0.29, 0.3], [0.1, 0.1, 0.1, 0.1])
    assert not reward_comparison(ours, trl)[0]
    # Held-out, paired per problem: TRL right on two problems ours misses, never the reverse.
    ours = _side([0.1, 0.1], [0.1, 0.1, 0.1, 0.1])
    trl = _side([0.1, 0.1], [1.0, 1.0, 0.1, 0.1])
    assert not reward_comparison(ours, trl)[0]
    assert reward_comparison(trl, ours)[0]  # better is fine
