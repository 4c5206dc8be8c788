"""Each selector's distribution against its definition, plus index bookkeeping."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from marti.errors import FailedPreconditionError, InvalidArgumentError
from services.experience_store.core.selectors import Candidate, PrioritizedSelector, make_selector

from .helpers import chi2, chi2_critical

N_DRAWS = 40_000


def fill(kind, priorities, **kw):
    s = make_selector(kind, **kw)
    for k, p in enumerate(priorities):
        s.insert(k, p, seq=k)
    return s


def test_uniform_distribution_chi_square():
    s = fill("uniform", [1.0] * 20)
    s.delete(3)
    s.delete(17)
    rng = random.Random(0)
    counts = Counter(s.select(rng)[0] for _ in range(N_DRAWS))
    keys = sorted(counts)
    assert 3 not in counts and 17 not in counts and len(keys) == 18
    assert chi2([counts[k] for k in keys], [N_DRAWS / 18] * 18) < chi2_critical(17)
    assert s.select(rng)[1] == pytest.approx(1 / 18)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0, 2.0])
def test_prioritized_distribution_chi_square(alpha):
    prios = [0.5, 1.0, 2.0, 4.0, 8.0, 0.1, 3.0, 0.0]
    s = fill("prioritized", prios, priority_exponent=alpha)
    s.update(5, 6.0)
    prios[5] = 6.0
    w = [p**alpha if alpha else 1.0 for p in prios]
    if alpha:
        w[7] = 0.0  # priority 0 is never selected when alpha > 0
    total = sum(w)
    rng = random.Random(1)
    draws = [s.select(rng) for _ in range(N_DRAWS)]
    counts = Counter(k for k, _ in draws)
    support = [k for k in range(len(prios)) if w[k] > 0]
    assert set(counts) == set(support)
    assert chi2([counts[k] for k in support], [N_DRAWS * w[k] / total for k in support]) < chi2_critical(
        len(support) - 1
    )
    for k, p in draws[:50]:
        assert p == pytest.approx(w[k] / total)


def test_prioritized_grows_and_reuses_slots_without_leaking_priority():
    s = PrioritizedSelector(1.0)
    for k in range(100):  # beyond the initial capacity of 16
        s.insert(k, 1.0, k)
    for k in range(0, 100, 2):
        s.delete(k)
    s.insert(1000, 50.0, 1000)  # reuses a freed slot
    rng = random.Random(2)
    counts = Counter(s.select(rng)[0] for _ in range(20_000))
    assert all(k % 2 == 1 or k == 1000 for k in counts)
    assert counts[1000] / 20_000 == pytest.approx(50 / 100, abs=0.02)


def test_importance_weights_formula():
    s = PrioritizedSelector(1.0, importance_beta=0.5)
    w = s.importance_weights([0.1, 0.4], [10, 10])
    raw = [(10 * 0.1) ** -0.5, (10 * 0.4) ** -0.5]
    assert w == pytest.approx([r / max(raw) for r in raw])
    assert make_selector("uniform").importance_weights([0.5], [2]) == [1.0]


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("fifo", [0, 1, 2, 3]), ("lifo", [3, 2, 1, 0]), ("max_heap", [2, 1, 3, 0]), ("min_heap", [0, 1, 3, 2])],
)
def test_deterministic_selectors_order(kind, expected):
    # priorities: key 0 -> 1, key 1 -> 5, key 2 -> 9, key 3 -> 5 (ties broken by age: 1 before 3)
    s = fill(kind, [1.0, 5.0, 9.0, 5.0])
    rng = random.Random(0)
    order = []
    while len(s):
        k, p = s.select(rng)
        assert p == 1.0
        order.append(k)
        s.delete(k)
    assert order == expected
    with pytest.raises(FailedPreconditionError):
        s.select(rng)


def test_heap_priority_updates():
    s = fill("max_heap", [1.0, 2.0, 3.0])
    s.update(0, 10.0)
    assert s.select(random.Random(0))[0] == 0
    for _ in range(500):  # many updates compact the lazy heap
        s.update(1, 20.0)
        s.update(1, 0.5)
    assert s.select(random.Random(0))[0] == 0
    m = fill("min_heap", [1.0, 2.0, 3.0])
    m.update(0, 10.0)
    assert m.select(random.Random(0))[0] == 1


@pytest.mark.parametrize("kind", ["uniform", "prioritized", "fifo", "lifo", "max_heap", "min_heap"])
def test_select_among_matches_definition(kind):
    cands = [Candidate(10, 1.0, 5), Candidate(11, 3.0, 2), Candidate(12, 2.0, 9)]
    s = make_selector(kind)
    rng = random.Random(3)
    picks = Counter(s.select_among(cands, rng)[0] for _ in range(9000))
    if kind == "uniform":
        assert all(abs(picks[k] - 3000) < 300 for k in (10, 11, 12))
    elif kind == "prioritized":
        assert picks[11] / 9000 == pytest.approx(0.5, abs=0.03)
    else:
        want = {"fifo": 11, "lifo": 12, "max_heap": 11, "min_heap": 10}[kind]
        assert set(picks) == {want}


def test_bad_selector_settings():
    with pytest.raises(InvalidArgumentError, match="bogus"):
        make_selector("bogus")
    with pytest.raises(InvalidArgumentError, match="priority_exponent"):
        PrioritizedSelector(-1.0)
    with pytest.raises(InvalidArgumentError, match="importance_beta"):
        PrioritizedSelector(1.0, 1.5)
