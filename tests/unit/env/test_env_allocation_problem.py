"""Allocation problems: the exact solver against brute force, scoring by hand, and the tolerant parsers."""

from __future__ import annotations

import itertools
import random

import pytest

from marti.errors import InvalidArgumentError
from services.env_server.envs import allocation_problem as ap


def brute_force(p: ap.Problem) -> int:
    """Independent reference: enumerate every allocation within bounds, keep the best feasible value."""
    best = -1
    ranges = [range(t.min_units, t.max_units + 1) for t in p.tasks]
    for units in itertools.product(*ranges):
        alloc = dict(zip(p.task_names, units, strict=True))
        if ap.score(p, alloc).valid:
            best = max(best, sum(t.value * x for t, x in zip(p.tasks, units, strict=True)))
    return best


@pytest.mark.parametrize("difficulty", ["easy", "medium"])
def test_solver_matches_brute_force(difficulty: str) -> None:
    for seed in range(25):
        p = ap.generate(random.Random(seed), difficulty)
        value, alloc = ap.solve(p)
        assert value == brute_force(p), (seed, p)
        assert ap.score(p, alloc).valid and ap.score(p, alloc).value == value


def test_hard_solution_is_feasible_and_no_better_random_allocation() -> None:
    p = ap.generate(random.Random(7), "hard")
    value, alloc = ap.solve(p)
    assert ap.score(p, alloc).valid and ap.score(p, alloc).value == value
    rng = random.Random(0)
    for _ in range(3000):
        cand = {t.name: rng.randint(t.min_units, t.max_units) for t in p.tasks}
        s = ap.score(p, cand)
        if s.valid:
            assert s.value <= value


def test_hand_computed_problem() -> None:
    # cpu 6: task_1 (value 5, cpu 3, <=2) and task_2 (value 4, cpu 2, <=3); exclusive pair absent.
    p = ap.Problem({"cpu": 6}, (ap.Task("task_1", 5, {"cpu": 3}, 2), ap.Task("task_2", 4, {"cpu": 2}, 3)))
    # options: 2x t1 = 10; 3x t2 = 12; 1 t1 + 1 t2 = 9 -> optimum 12
    assert ap.solve(p) == (12, {"task_1": 0, "task_2": 3})
    s = ap.score(p, {"task_1": 2, "task_2": 1})
    assert s.value == 14 and s.used == {"cpu": 8} and s.violations == ("cpu used 8, above its capacity 6",)
    assert s.utilization == 1.0
    half = ap.score(p, {"task_1": 1, "task_2": 0})
    assert half.valid and half.utilization == pytest.approx(0.5)


def test_constraints_min_units_and_exclusion() -> None:
    p = ap.Problem(
        {"cpu": 10},
        (
            ap.Task("task_1", 9, {"cpu": 1}, 3),
            ap.Task("task_2", 1, {"cpu": 1}, 2, min_units=1),
            ap.Task("task_3", 8, {"cpu": 1}, 3),
        ),
        (("task_1", "task_3"),),
    )
    value, alloc = ap.solve(p)
    assert value == 9 * 3 + 1 * 2 and alloc == {"task_1": 3, "task_2": 2, "task_3": 0}
    bad = ap.score(p, {"task_1": 1, "task_2": 0, "task_3": 1})
    assert len(bad.violations) == 2
    assert any("required minimum" in v for v in bad.violations)
    assert any("exclusive" in v for v in bad.violations)
    over = ap.score(p, {"task_1": 4, "task_2": 1})
    assert over.violations == ("task_1 gets 4 units, above its maximum 3",)


def test_generator_sizes_and_determinism() -> None:
    sizes = {"easy": (2, 3, 3, 0, 0), "medium": (3, 5, 4, 1, 1), "hard": (4, 7, 5, 2, 2)}
    for difficulty, (n_res, n_tasks, hi, n_req, n_excl) in sizes.items():
        p = ap.generate(random.Random(1), difficulty)
        assert len(p.capacities) == n_res and len(p.tasks) == n_tasks and len(p.exclusive) == n_excl
        assert sum(t.min_units > 0 for t in p.tasks) == n_req
        assert all(1 <= t.max_units <= hi for t in p.tasks)
        assert p == ap.generate(random.Random(1), difficulty)
        assert p == ap.generate(random.Random(1), ap.DIFFICULTIES[difficulty])
    assert ap.generate(random.Random(1), "easy") != ap.generate(random.Random(2), "easy")
    with pytest.raises(InvalidArgumentError, match="'extreme'"):
        ap.generate(random.Random(0), "extreme")


def test_generator_spec_ranges_and_capacity_rules() -> None:
    """A spec's demand and value ranges hold; ``half`` capacity follows from the tasks, ``random`` varies."""
    spec = ap.ProblemSpec(1, 5, 1, demand=(1, 1), values=(3, 4), capacity="random")
    caps = set()
    for seed in range(200):
        p = ap.generate(random.Random(seed), spec)
        assert [t.demand for t in p.tasks] == [{"cpu": 1}] * 5 and {t.max_units for t in p.tasks} == {1}
        assert {t.value for t in p.tasks} <= {3, 4}
        caps.add(p.capacities["cpu"])
        half = ap.generate(random.Random(seed), ap.ProblemSpec(1, 5, 1, demand=(1, 1)))
        assert half.capacities == {"cpu": 3}  # ceil(5 / 2): the same for every seed
    assert caps == {1, 2, 3, 4}  # uniform 1..total-1: every value shows up in 200 draws
    with pytest.raises(InvalidArgumentError, match="capacity rule 'tight'"):
        ap.generate(random.Random(0), ap.ProblemSpec(1, 3, 1, capacity="tight"))
    with pytest.raises(InvalidArgumentError, match="too few tasks"):
        ap.generate(random.Random(0), ap.ProblemSpec(1, 3, 1, num_required=2, num_exclusive=1))


def test_problem_dict_parts() -> None:
    p = ap.generate(random.Random(3), "medium")
    full = p.to_dict()
    assert p.to_dict(values=True, constraints=True) == full
    assert p.to_dict(values=True, constraints=False) == {
        "tasks": [{"name": t["name"], "value_per_unit": t["value_per_unit"]} for t in full["tasks"]]
    }
    no_values = p.to_dict(values=False)
    assert (
        no_values["resources"] == full["resources"]
        and no_values["exclusive_pairs"] == full["exclusive_pairs"]
    )
    restored = [
        {**t, "value_per_unit": f["value_per_unit"]}
        for t, f in zip(no_values["tasks"], full["tasks"], strict=True)
    ]
    assert restored == full["tasks"]
    assert all("value_per_unit" not in t for t in no_values["tasks"])
    assert p.to_dict(values=False, constraints=False) == {"tasks": [{"name": n} for n in p.task_names]}


NAMES = ["task_1", "task_2", "task_3"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("task_1: 3\ntask_2: 1\ntask_3: 0", {"task_1": 3, "task_2": 1, "task_3": 0}),
        ("Task 1 = 2 units, task #3 -> 1", {"task_1": 2, "task_2": 0, "task_3": 1}),
        ("I suggest task_2 gets 2", {"task_1": 0, "task_2": 2, "task_3": 0}),
        ('Plan: {"task_1": 1, "task_2": "2"}', {"task_1": 1, "task_2": 2, "task_3": 0}),
        ('{"allocation": {"1": 2, "task 3": 1.0}}', {"task_1": 2, "task_2": 0, "task_3": 1}),
        ("task_1: 1\ntask_1: 2", {"task_1": 2, "task_2": 0, "task_3": 0}),
        ("**task_1**: 2\n**Task 2** = 1", {"task_1": 2, "task_2": 1, "task_3": 0}),
        ("task_3 receives 2 units", {"task_1": 0, "task_2": 0, "task_3": 2}),
    ],
)
def test_parser_accepts_documented_forms(text: str, expected: dict) -> None:
    parsed = ap.parse_allocation(text, NAMES)
    assert parsed.error is None and parsed.allocation == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no idea",
        "{not json",
        '{"task_1": -1}',
        '{"task_1": 1.5}',
        "\x00\xff" * 50,
        # restating the problem is not an allocation (the numbers are values and costs, not units)
        "task_1: value 6 per unit, uses cpu 4, gpu 2\ntask_2: value 8 per",
        "- task_1: value 7 per unit, uses cpu 3, gpu 0 per unit, at most 2 units",
    ],
)
def test_parser_rejects_without_raising(text: str) -> None:
    parsed = ap.parse_allocation(text, NAMES)
    assert parsed.allocation is None and parsed.error


@pytest.mark.parametrize(
    ("text", "absent"),
    [
        ("task_1 value 7, task_2 value 3", True),
        ("", True),
        ("task_1: value 6 per unit", True),
        ("task_1: -2", False),  # an allocation with an unusable amount, not a message
        ('{"task_1": "many"}', False),
        ("task_1: 2", False),
    ],
)
def test_parser_tells_absent_allocation_from_unreadable(text: str, absent: bool) -> None:
    assert ap.parse_allocation(text, NAMES).absent is absent


def test_parser_reports_unknown_tasks() -> None:
    parsed = ap.parse_allocation("task_1: 1\ntask_9: 4", NAMES)
    assert parsed.allocation == {"task_1": 1, "task_2": 0, "task_3": 0} and parsed.unknown == ("task_9",)
    s = ap.score(ap.generate(random.Random(0), "easy"), parsed.allocation, parsed.unknown)
    assert "unknown task 'task_9'" in s.violations


@pytest.mark.parametrize(
    ("text", "score", "accept"),
    [
        ("score: 0.8, accept", 0.8, True),
        ("Score = 75%. Please revise task_2.", 0.75, False),
        ("score 7/10 - approve", 0.7, True),
        ('{"score": 0.9, "accept": false}', 0.9, False),
        ("score = 80/100 accepted", 0.8, True),
        ("I would not accept this; score: 0.2", 0.2, False),
        ("looks fine, accept", None, True),
        ("score: 1", 1.0, False),
        ("score: 0", 0.0, False),
        ("score: 100%", 1.0, False),
    ],
)
def test_evaluation_parser(text: str, score: float | None, accept: bool) -> None:
    got = ap.parse_evaluation(text)
    assert got.accept is accept and got.error is None
    assert got.score == (pytest.approx(score) if score is not None else None)


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ("score: 1.5 accept", "1.5"),
        ("score: 85 accepted", "85"),  # a bare number is a fraction; it used to be read as 85%
        ("score: 3.5", "3.5"),
        ("score: -0.2", "-0.2"),
        ("score: 120%", "120%"),
        ("score 11/10", "11/10"),
        ('{"score": 1.5, "accept": true}', "1.5"),
    ],
)
def test_evaluation_score_outside_0_1_is_an_error_not_clipped(text: str, written: str) -> None:
    got = ap.parse_evaluation(text)
    assert got.score is None and got.error == f"score {written} is outside 0..1"


@pytest.mark.parametrize(
    "text", ["task_" + "9" * 5000 + ": 1", '{"task_' + "9" * 5000 + '": 1}', "task_\u0663: 1"]
)
def test_a_task_number_of_many_or_non_ascii_digits_names_no_task_and_does_not_raise(text: str) -> None:
    """Python refuses int() of a number over 4300 digits (ValueError); a task number is at most 9 ASCII digits."""
    for parse in (ap.parse_allocation, ap.parse_names):
        parsed = parse(text, NAMES)
        assert parsed.allocation is None or not any(parsed.allocation.values()), (parse, parsed)


def test_max_capacity_caps_a_random_capacity_but_never_below_the_required_use():
    """``ProblemSpec.max_capacity`` (``private_allocation``'s ``pair``: 1..2) bounds the ``random`` draw from
    above, and a bound below what the required tasks use is raised to that use."""
    capped = ap.ProblemSpec(1, 5, 1, demand=(1, 1), capacity="random", max_capacity=2)
    assert {ap.generate(random.Random(s), capped).capacities["cpu"] for s in range(200)} == {1, 2}
    required = ap.ProblemSpec(1, 5, 1, num_required=3, demand=(1, 1), capacity="random", max_capacity=1)
    assert {ap.generate(random.Random(s), required).capacities["cpu"] for s in range(50)} == {3}
