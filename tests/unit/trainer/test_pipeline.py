"""The asynchronous rollout pipeline: the staleness gate, ordering, errors and closing (no services)."""

from __future__ import annotations

import threading
import time

import pytest

from marti.errors import InvalidArgumentError
from services.trainer.pipeline import RolloutPipeline


class _Learner:
    """A fake learner: counts finished updates; a rollout records how many updates were done when it began."""

    def __init__(self) -> None:
        self.updates = 0
        self.started_at: dict[int, int] = {}
        self.lock = threading.Lock()

    def play(self, step: int) -> str:
        with self.lock:
            self.started_at[step] = self.updates
        time.sleep(0.01)
        return f"episodes of step {step}"


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_step_starts_only_after_update_t_minus_k_and_results_come_in_order(k):
    learner = _Learner()
    pipe = RolloutPipeline(learner.play, start=0, stop=8, max_staleness=k).start()
    try:
        for step in range(8):
            assert pipe.get(step, timeout_s=10) == f"episodes of step {step}"
            time.sleep(0.02)  # a slow update: the producer runs ahead as far as the gate lets it
            learner.updates = step + 1
            pipe.updated(step + 1)
    finally:
        pipe.close(timeout_s=10)
    for step, done in learner.started_at.items():
        assert done >= step - k, (step, done)  # every turn of step t is at most k updates old at update t
    assert any(learner.started_at[s] < s for s in range(1, 8))  # and rollouts did overlap updates


def test_the_gate_holds_the_producer_until_the_learner_reports():
    learner = _Learner()
    pipe = RolloutPipeline(learner.play, start=0, stop=5, max_staleness=1).start()
    try:
        assert pipe.get(0, timeout_s=10)
        time.sleep(0.2)
        assert sorted(learner.started_at) == [0, 1]  # step 2 waits for update 1
        assert pipe.get(1, timeout_s=10) == "episodes of step 1"
        with pytest.raises(TimeoutError):
            pipe.get(2, timeout_s=0.2)
        pipe.updated(1)
        assert pipe.get(2, timeout_s=10) == "episodes of step 2"
    finally:
        pipe.close(timeout_s=10)


def test_a_resumed_pipeline_counts_the_updates_already_done():
    learner = _Learner()
    pipe = RolloutPipeline(learner.play, start=4, stop=7, max_staleness=1).start()
    try:
        assert pipe.get(4, timeout_s=10) == "episodes of step 4"
        time.sleep(0.1)
        assert sorted(learner.started_at) == [4, 5]  # after 4 updates, steps 4 and 5 may run, not 6
    finally:
        pipe.close(timeout_s=10)


def test_a_failed_rollout_is_raised_by_get_unchanged_and_stops_the_producer():
    calls = []

    def play(step: int) -> int:
        calls.append(step)
        if step == 1:
            raise ConnectionError("env server gone")
        return step

    pipe = RolloutPipeline(play, start=0, stop=5, max_staleness=3).start()
    try:
        assert pipe.get(0, timeout_s=10) == 0
        with pytest.raises(ConnectionError, match="env server gone"):
            pipe.get(1, timeout_s=10)
        pipe.updated(5)
        time.sleep(0.1)
        assert calls == [0, 1]
    finally:
        pipe.close(timeout_s=10)


def test_steps_are_handed_out_once_in_order_within_range():
    pipe = RolloutPipeline(lambda s: s, start=0, stop=2, max_staleness=1).start()
    try:
        with pytest.raises(InvalidArgumentError, match="expected step 0"):
            pipe.get(1, timeout_s=1)
        assert pipe.get(0, timeout_s=10) == 0
        with pytest.raises(InvalidArgumentError, match="expected step 1"):
            pipe.get(0, timeout_s=1)
        assert pipe.get(1, timeout_s=10) == 1
        with pytest.raises(InvalidArgumentError, match="last 1"):
            pipe.get(2, timeout_s=1)
    finally:
        pipe.close(timeout_s=10)


def test_close_starts_nothing_new_and_waits_for_the_rollout_in_flight():
    started, finished = [], []

    def play(step: int) -> int:
        started.append(step)
        time.sleep(0.3)
        finished.append(step)
        return step

    pipe = RolloutPipeline(play, start=0, stop=10, max_staleness=5).start()
    time.sleep(0.1)
    pipe.close(timeout_s=10)
    assert started == finished == [0]


@pytest.mark.parametrize(
    "kwargs", [{"start": 0, "stop": 3, "max_staleness": 0}, {"start": 3, "stop": 2, "max_staleness": 1}]
)
def test_invalid_settings_are_named(kwargs):
    with pytest.raises(InvalidArgumentError) as err:
        RolloutPipeline(lambda s: s, **kwargs)
    assert ("max_staleness" in str(err.value)) or ("stop step 2" in str(err.value))
