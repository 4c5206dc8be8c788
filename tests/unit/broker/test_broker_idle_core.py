"""The SDK's ``send_when_idle`` bookkeeping in :class:`~marti.clients.broker.core._Core` (no I/O): when the
flush timer finds the buffers due, when the end of a batch in flight must wake it, and what a fork forgets.

The behaviour this drives, against a real broker: ``tests/integration/broker/test_broker_send_when_idle.py``.
"""

from __future__ import annotations

from marti.api.broker.v1 import broker_pb2
from marti.clients.broker import DEFAULT_LINGER_S
from marti.clients.broker.core import _Core


def core(send_when_idle: bool = True, linger_s: float = 10.0) -> _Core:
    return _Core("a", "s", 128, 1 << 20, linger_s, 3, True, 1 << 20, 0, send_when_idle)


def buffer(c: _Core, text: str = "x") -> None:
    c.buffer_add(broker_pb2.Envelope(message_id=text, payload=text.encode()), broadcast=False)


def test_send_when_idle_is_the_default():
    c = _Core("a", "s", 128, 1 << 20, DEFAULT_LINGER_S, 3, True, 1 << 20, 0)
    assert c.send_when_idle and c.in_flight == 0


def test_buffered_message_is_due_at_once_while_no_batch_is_in_flight():
    c = core()
    assert c.flush_delay() is None  # nothing buffered: the timer sleeps
    buffer(c)
    assert c.flush_delay() == 0.0  # idle: no linger


def test_while_a_batch_is_in_flight_the_linger_bounds_the_wait():
    c = core(linger_s=10.0)
    c.begin_send()
    buffer(c)
    assert 9.0 < c.flush_delay() <= 10.0
    assert c.end_send() is True  # the batch ended with a message buffered: wake the timer
    assert c.flush_delay() == 0.0


def test_end_send_wakes_the_timer_only_when_it_has_something_to_send_at_once():
    c = core()
    c.begin_send()
    assert c.end_send() is False  # nothing buffered meanwhile
    c.begin_send()
    c.begin_send()
    buffer(c)
    assert c.end_send() is False  # another batch still in flight
    assert c.end_send() is True
    off = core(send_when_idle=False)
    off.begin_send()
    buffer(off)
    assert off.end_send() is False  # without send_when_idle only the linger sends it


def test_without_send_when_idle_a_lone_message_waits_the_linger():
    c = core(send_when_idle=False, linger_s=10.0)
    buffer(c)
    assert 9.0 < c.flush_delay() <= 10.0


def test_a_forked_child_forgets_the_parents_batches_in_flight():
    c = core()
    c.begin_send()  # the parent's timer was in a Send when the process forked: it never ends in the child
    buffer(c)
    c.after_fork()
    assert c.in_flight == 0 and c.flush_delay() == 0.0
