"""Running reward moments (``algorithm.normalize_reward``) against the statistics module."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.trainer.learn.algo.running_moments import RunningMoments

finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False)


@given(st.lists(st.lists(finite, max_size=8), max_size=6))
def test_batches_combine_to_the_moments_of_all_values(batches):
    m = RunningMoments()
    for b in batches:
        m.update(b)
    flat = [v for b in batches for v in b]
    assert m.count == len(flat)
    if flat:
        assert m.mean == pytest.approx(statistics.fmean(flat), abs=1e-6)
        assert m.std == pytest.approx(statistics.pstdev(flat) if len(flat) > 1 else 0.0, abs=1e-5)


def test_normalize_updates_first_then_scales_and_keeps_unscored():
    m2 = RunningMoments()
    out = m2.normalize([1.0, None, 3.0])
    assert out[1] is None and out[0] == pytest.approx(-1.0) and out[2] == pytest.approx(1.0)
    again = m2.normalize([2.0])  # mean of 1, 3, 2 is 2
    assert again == [pytest.approx(0.0)]
    assert math.isfinite(RunningMoments().normalize([5.0])[0])  # one value: std 0, eps keeps it finite


def test_state_round_trips():
    m = RunningMoments()
    m.update([1.0, 2.0, 4.0])
    assert RunningMoments.from_state(m.state()) == m
