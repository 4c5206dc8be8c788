"""The debate scenario: generated problems have the stated answers, rounds, aggregator and rewards."""

from __future__ import annotations

import random
import re

import pytest

import marti.env.make as me
from services.env_server.envs import debate


def reference_answer(question: str) -> int:
    """Independent solver of the generator's templates (no eval)."""
    nums = [int(x) for x in re.findall(r"\d+", question)]
    if question.startswith("What is"):
        m = re.match(r"What is (\d+) ([*+-]) (\d+)(?: ([+-]) (\d+))?\?", question)
        a, op1, b = int(m.group(1)), m.group(2), int(m.group(3))
        v = a * b if op1 == "*" else a + b if op1 == "+" else a - b
        if m.group(4):
            v = v + int(m.group(5)) if m.group(4) == "+" else v - int(m.group(5))
        return v
    if "gets" in question:
        return nums[0] + nums[1]
    if "boxes" in question:
        return nums[0] * nums[1] - nums[2]
    a, b, c, d = nums
    return (a + a * b - c) // d


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_generated_answers_are_right(difficulty: str) -> None:
    rng = random.Random(0)
    kinds = set()
    for _ in range(200):
        q, ans = debate.generate_problem(rng, difficulty)
        assert reference_answer(q) == ans, q
        kinds.add(q.startswith("What is"))
    assert kinds == {True, False}  # both arithmetic and word problems


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("answer: 42", 42),
        ("I think 3 + 4 = 7. Answer is -5", -5),
        ("it is 12", 12),
        ("no idea", None),
        ("answer: 1\nanswer: 2", 2),
    ],
)
def test_parse_answer(text: str, value: int | None) -> None:
    assert debate.parse_answer(text) == value


def test_debate_rounds_and_rewards_dense() -> None:
    env = me.make("collaborative_task_solving", scenario="debate", num_agents=3, debate_rounds=2, seed=1)
    obs, infos = env.reset(seed=4)
    ans = env.env.answer
    assert env.acting_agents == ["agent_1", "agent_2"] and infos["agent_3"]["role"] == "aggregator"
    assert "Problem:" in obs["agent_1"] and "answer:" in obs["agent_1"]
    _, r, *_ = env.step({"agent_1": f"answer: {ans}", "agent_2": f"answer: {ans + 1}"})
    assert r == {"agent_1": 0.25, "agent_2": 0.0, "agent_3": 0.0}
    obs, r, *_ = env.step({"agent_1": f"answer: {ans}", "agent_2": f"answer: {ans}"})
    assert r == {"agent_1": 0.25, "agent_2": 0.25, "agent_3": 0.0}
    assert env.acting_agents == ["agent_3"] and f"answer: {ans + 1}" in obs["agent_3"]
    _, r, term, _, infos = env.step({"agent_3": f"The team says answer: {ans}"})
    assert r == {"agent_1": 0.5, "agent_2": 0.5, "agent_3": 1.0} and all(term.values())
    assert infos["agent_3"]["team_correct"] is True


def test_debate_sparse_and_wrong_aggregator() -> None:
    env = me.make(
        "collaborative_task_solving", scenario="debate", debate_rounds=1, reward_type="sparse", seed=1
    )
    env.reset(seed=4)
    ans = env.env.answer
    _, r, *_ = env.step({"agent_1": f"answer: {ans}", "agent_2": "answer: 0" if ans else "answer: 1"})
    assert set(r.values()) == {0.0}
    _, r, term, _, _ = env.step({"agent_3": "no idea"})
    assert r == {"agent_1": 0.5, "agent_2": 0.0, "agent_3": 0.0} and all(term.values())


def test_debate_truncates_at_max_turns() -> None:
    env = me.make("collaborative_task_solving", scenario="debate", debate_rounds=3, max_turns=2, seed=0)
    env.reset()
    env.step({})
    _, _, term, trunc, _ = env.step({})
    assert all(trunc.values()) and not any(term.values()) and env.agents == []
