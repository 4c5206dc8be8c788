"""marti.rewards.team: what a majority vote and the ``team_answer`` info compare, per verifier."""

from __future__ import annotations

from marti.rewards.team import answer_of, credit, last_replies, team_reply

PICK = r"(?s)^\W*(task_\d+)\b(?!.*task_\d)"


def test_the_answer_is_what_the_verifier_reads():
    assert answer_of("task_3: uses cpu 1 per unit", "regex", PICK) == "task_3"
    assert answer_of("task_3, task_1", "regex", PICK) is None  # the pattern refuses two tasks
    assert answer_of("The answer is 12.", "numeric") == "12"
    assert answer_of("it is 7 or maybe 8", "numeric") == "8"
    assert answer_of("Paris", "exact") == "Paris"  # exact compares the whole reply without a marker
    assert answer_of("so \\boxed{\\frac{1}{2}}", "math") == "\\frac{1}{2}"
    assert answer_of("   ", "exact") is None


def test_majority_vote_uses_the_verifiers_answer():
    last = {"a": "task_2 is best", "b": "task_2.", "c": "task_4"}
    assert (
        team_reply(last, ["a", "b", "c"], final="majority", verifier="regex", pattern=PICK)
        == "task_2 is best"
    )
    # without the pattern no reply has a marked answer: no vote
    assert team_reply(last, ["a", "b", "c"], final="majority", verifier="regex") is None


def test_last_replies_and_credit():
    last, speaker = last_replies([{"a": "x", "b": ""}, {"b": "y"}], ["a", "b"])
    assert last == {"a": "x", "b": "y"} and speaker == "b"
    assert credit(1.0, {"a": 0.0}, ["a", "b"], 0.25) == {"a": 0.75, "b": 1.0}
