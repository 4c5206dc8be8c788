"""call_with_reconnect: which errors are retried, the backoff schedule and the overall limit (fake clock)."""

from __future__ import annotations

import pytest

from marti.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    SessionLostError,
    UnavailableError,
)
from services.trainer.job.connections.reconnect import Backoff, call_with_reconnect, is_outage


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s

    def clock(self) -> float:
        return self.now


def _failing(errors: list[Exception], result: str = "ok"):
    calls = []

    def fn():
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return result

    return fn, calls


def test_outages_are_retried_with_doubling_waits_capped_at_max():
    t = FakeTime()
    fn, calls = _failing([UnavailableError("down")] * 6)
    seen = []
    out = call_with_reconnect(
        fn,
        "rollout",
        Backoff(0.5, 4.0, 120.0),
        on_retry=lambda a, e: seen.append(a),
        sleep=t.sleep,
        clock=t.clock,
    )
    assert out == "ok" and len(calls) == 7
    assert t.sleeps == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert seen == [1, 2, 3, 4, 5, 6]


def test_non_outage_errors_are_raised_at_once():
    t = FakeTime()
    fn, calls = _failing([InvalidArgumentError("bad action 'x'")])
    with pytest.raises(InvalidArgumentError, match="bad action"):
        call_with_reconnect(fn, "rollout", Backoff(), sleep=t.sleep, clock=t.clock)
    assert len(calls) == 1 and t.sleeps == []


def test_gives_up_after_timeout_naming_the_phase_and_last_error():
    t = FakeTime()
    fn, calls = _failing([DeadlineExceededError("no answer")] * 100)
    with pytest.raises(UnavailableError) as info:
        call_with_reconnect(fn, "exchange of agent_1", Backoff(1.0, 2.0, 5.0), sleep=t.sleep, clock=t.clock)
    msg = str(info.value)
    assert "exchange of agent_1" in msg and "DeadlineExceededError: no answer" in msg and "5s" in msg
    assert isinstance(info.value.__cause__, DeadlineExceededError)
    assert sum(t.sleeps) == pytest.approx(
        5.0
    )  # waited exactly the budget, the last wait cut to what was left


def test_zero_timeout_fails_at_the_first_outage():
    t = FakeTime()
    fn, calls = _failing([UnavailableError("down")])
    with pytest.raises(UnavailableError, match="after 1 attempts"):
        call_with_reconnect(fn, "rollout", Backoff(timeout_s=0.0), sleep=t.sleep, clock=t.clock)
    assert len(calls) == 1


def test_lost_sessions_count_as_outages_but_other_not_found_do_not():
    assert is_outage(SessionLostError("unknown session 'abc' (closed, reaped or never created)"))
    assert is_outage(SessionLostError("session 'ep-1' not found", session_id="ep-1"))
    assert not is_outage(NotFoundError("session 'ep-1' not found"))  # by type, never by message text
    assert not is_outage(NotFoundError("unknown env id 'nope'"))
    assert not is_outage(NotFoundError("no table 'agent_9'"))
    assert is_outage(UnavailableError("x")) and is_outage(DeadlineExceededError("x"))


def test_a_rate_limited_insert_is_not_an_outage_and_a_cancel_while_stopping_is_not_retried():
    """A full table (RateLimitedError, a DeadlineExceededError) is backpressure: raised at once, never called
    "unreachable"; a CancelledError raised because the job is stopping is not retried either."""
    import threading

    from marti.errors import CancelledError, RateLimitedError

    assert not is_outage(RateLimitedError("full", table="t", size=1, max_size=1))
    assert is_outage(DeadlineExceededError("slow"))
    t = FakeTime()
    fn, calls = _failing([RateLimitedError("full", table="t", size=1, max_size=1)])
    with pytest.raises(RateLimitedError):
        call_with_reconnect(fn, "insert", Backoff(), sleep=t.sleep, clock=t.clock)
    assert len(calls) == 1 and t.sleeps == []
    stop = threading.Event()
    stop.set()
    fn, calls = _failing([CancelledError("stopped")])
    with pytest.raises(CancelledError):
        call_with_reconnect(fn, "rollout", Backoff(), sleep=t.sleep, clock=t.clock, stop=stop)
    assert len(calls) == 1
    fn, calls = _failing([CancelledError("torn down")])  # not stopping: a torn-down stream is an outage
    assert (
        call_with_reconnect(fn, "rollout", Backoff(), sleep=t.sleep, clock=t.clock, stop=threading.Event())
        == "ok"
    )
    assert len(calls) == 2
