"""The watchdog that bounds waits without a timeout of their own, and the clients' deadline check."""

from __future__ import annotations

import math
import threading
import time

import pytest
from waits import until

from marti.errors import InvalidArgumentError
from marti.rpc.client import watchdog
from marti.rpc.client.channel import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S, check_timeout_s
from marti.rpc.client.watchdog import Watchdog


def test_a_deadline_that_passes_fires_once_and_disarm_then_says_so():
    dog, fired = Watchdog(), threading.Event()
    owner = object()
    t0 = time.monotonic()
    dog.arm(owner, 0.1, fired.set)
    assert fired.wait(30) and time.monotonic() - t0 >= 0.09
    assert dog.disarm(owner) is False


def test_a_disarmed_deadline_never_fires():
    dog, calls = Watchdog(), []
    kept = object()
    dog.arm(kept, 0.1, lambda: calls.append("kept"))
    assert dog.disarm(kept) is True
    time.sleep(0.4)  # past kept's deadline (a later look only gives it more time to fire)
    assert calls == []


def test_an_earlier_deadline_wakes_the_thread():
    """The thread sleeps until the late deadline (60 s; nothing else is armed, so no idle look wakes it): only
    the wake-up an earlier arm gives it can fire the early deadline within the 10 s waited for here."""
    waits = []

    class Counting(threading.Condition):
        def wait(self, timeout=None):
            waits.append(timeout)  # under the lock, which the wait below releases: arm waits until then
            return super().wait(timeout)

    dog, calls = Watchdog(), []
    dog._cond = Counting()
    late, early = object(), object()
    dog.arm(late, 60.0, lambda: calls.append("late"))
    until(lambda: waits, "the thread asleep until the late deadline")
    dog.arm(early, 0.05, lambda: calls.append("early"))  # earlier than the thread's wake-up: it is woken
    until(lambda: calls, "the early deadline fired", timeout_s=10.0)
    assert calls == ["early"]
    assert dog.disarm(late) is True


def test_re_arming_replaces_the_owners_deadline_and_a_raising_callback_does_not_stop_the_others():
    dog, calls = Watchdog(), []
    a, b = object(), object()
    dog.arm(a, 0.05, lambda: 1 / 0)
    dog.arm(b, 0.05, lambda: calls.append("b1"))
    dog.arm(b, 0.2, lambda: calls.append("b2"))  # replaces b's first deadline
    until(lambda: calls, "b's deadline fired")
    assert calls == ["b2"]  # not b1, which was due first


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, MAX_TIMEOUT_S * 2, "5", True])
def test_check_timeout_s_refuses_naming_the_value(bad):
    with pytest.raises(InvalidArgumentError, match="timeout_s must be"):
        check_timeout_s(bad)


def test_check_timeout_s_defaults_and_accepts_its_edges():
    assert check_timeout_s(None) == DEFAULT_TIMEOUT_S
    assert check_timeout_s(MAX_TIMEOUT_S) == MAX_TIMEOUT_S and check_timeout_s(1e-3) == 1e-3


def test_many_short_calls_with_the_same_timeout_do_not_wake_the_thread_each_time(monkeypatch):
    """Idle looks every 5 s, for long: the count of wake-ups over the loop does not grow with how long a loaded
    machine makes it last (at 0.05 s a look, 20 looks, a loop past 1 s woke the thread at each call after)."""
    monkeypatch.setattr(watchdog, "IDLE_TICK_S", 5.0)
    monkeypatch.setattr(watchdog, "IDLE_TICKS", 1000)

    class Counting(threading.Condition):
        waits = 0

        def wait(self, timeout=None):
            Counting.waits += 1
            return super().wait(timeout)

    dog = Watchdog()
    dog._cond = Counting()
    owner = object()
    for _ in range(500):
        dog.arm(owner, 30.0, lambda: None)
        assert dog.disarm(owner)  # a quick call ...
        time.sleep(0.001)  # ... then a pause, in which the thread finds nothing armed
    # the thread woke about every IDLE_TICK_S over the loop, not once per call
    assert Counting.waits < 20, Counting.waits


def test_a_stream_answer_that_arrives_as_its_deadline_fires_counts_as_late():
    """The watchdog's cancel may land just after the answer arrived: the call must then fail as late (and the
    stream count as broken), never return a success on a stream that is being cancelled."""
    from marti.api.env.v1 import env_pb2 as pb
    from marti.clients.env import SessionStream
    from marti.errors import DeadlineExceededError

    class Responses:
        cancelled = False

        def __next__(self):
            time.sleep(0.3)  # the deadline (0.05 s) passes and the watchdog cancels; this answer still comes
            return pb.SessionResponse()

        def cancel(self):
            Responses.cancelled = True

        def done(self):
            return Responses.cancelled

    class Stub:
        def Session(self, requests):  # noqa: N802 - the gRPC method's name
            return Responses()

    stream = SessionStream(Stub(), timeout_s=0.05)
    with pytest.raises(DeadlineExceededError, match="within timeout_s=0.05 s"):
        stream._roundtrip(close=pb.CloseSessionRequest(session_id="s"))
    assert Responses.cancelled and stream.broken
