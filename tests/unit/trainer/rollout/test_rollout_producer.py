"""The asynchronous rollout producer: the staleness gate, summaries, errors and closing (no services)."""

from __future__ import annotations

import threading
import time

import pytest
from waits import until

from marti.errors import InvalidArgumentError
from services.trainer.rollout.episodes.producer import RolloutProducer


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
        return f"summary of step {step}"


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_step_starts_only_after_update_t_minus_k(k):
    learner = _Learner()
    producer = RolloutProducer(learner.play, start=0, stop=8, max_staleness=k).start()
    try:
        for step in range(8):
            assert producer.summary(step) == f"summary of step {step}"
            time.sleep(0.02)  # a slow update: the producer runs ahead as far as the gate lets it
            learner.updates = step + 1
            producer.updated(step + 1)
    finally:
        producer.close(timeout_s=10)
    for step, done in learner.started_at.items():
        assert done >= step - k, (step, done)  # every turn of step t is at most k updates old at update t
    assert any(learner.started_at[s] < s for s in range(1, 8))  # and rollouts did overlap updates


def test_the_gate_holds_the_producer_until_the_learner_reports_and_a_resume_counts_updates():
    learner = _Learner()
    producer = RolloutProducer(learner.play, start=4, stop=9, max_staleness=1).start()
    try:
        assert producer.summary(4)
        until(lambda: 5 in learner.started_at, "step 5 started")
        time.sleep(0.2)  # step 6 would have started by now (a later look only gives it more time)
        assert sorted(learner.started_at) == [4, 5]  # after 4 updates, steps 4 and 5 may run, not 6
        producer.updated(5)
        assert producer.summary(6) == "summary of step 6"
    finally:
        producer.close(timeout_s=10)


def test_a_failed_rollout_is_raised_unchanged_in_the_learner():
    def play(step: int) -> int:
        if step == 1:
            raise ConnectionError("env server gone")
        return step

    producer = RolloutProducer(play, start=0, stop=5, max_staleness=2).start()
    assert producer.summary(0) == 0
    with pytest.raises(ConnectionError, match="env server gone"):
        producer.summary(1)
    producer.close(timeout_s=10)


def test_bad_bounds_are_refused():
    with pytest.raises(InvalidArgumentError, match="max_staleness >= 1"):
        RolloutProducer(lambda s: s, start=0, stop=1, max_staleness=0)
    with pytest.raises(InvalidArgumentError, match="before its start"):
        RolloutProducer(lambda s: s, start=3, stop=1, max_staleness=1)
