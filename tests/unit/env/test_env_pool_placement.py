"""The env pool's placement of new sessions (no servers): fewest live sessions first, a server whose create failed
placed last for a cooldown that doubles with each failure in a row and starts over after a success."""

from __future__ import annotations

import pytest

from marti.clients.env import placement as placement_mod
from marti.clients.env.placement import DOWN_COOLDOWN_S, MAX_DOWN_COOLDOWN_S, _place, _Placement
from marti.errors import InvalidArgumentError, UnavailableError

ADDRESSES = ("a:1", "b:1")


@pytest.fixture
def clock(monkeypatch):
    """A fake ``time.monotonic`` for the pool module; ``clock[0]`` is now, in seconds."""
    now = [1000.0]
    monkeypatch.setattr(placement_mod.time, "monotonic", lambda: now[0])
    return now


def _down_then_up(down: set[int], calls: list[int]):
    """A create that fails with UNAVAILABLE on the servers in ``down`` and records every server it is asked."""

    def create(i: int) -> str:
        calls.append(i)
        if i in down:
            raise UnavailableError(f"server {i} is away")
        return f"session-on-{i}"

    return create


def test_the_cooldown_doubles_with_each_failure_in_a_row_up_to_the_cap(clock):
    placement = _Placement(2)
    got = [placement.avoid(0) for _ in range(6)]
    assert got == [DOWN_COOLDOWN_S, 2 * DOWN_COOLDOWN_S, 4 * DOWN_COOLDOWN_S, 8 * DOWN_COOLDOWN_S,
                   MAX_DOWN_COOLDOWN_S, MAX_DOWN_COOLDOWN_S]  # fmt: skip
    assert placement.avoid(1) == DOWN_COOLDOWN_S  # counted per server


def test_a_success_starts_the_cooldown_over(clock):
    placement = _Placement(2)
    for _ in range(3):
        placement.avoid(0)
    placement.created(0)
    assert placement.avoid(0) == DOWN_COOLDOWN_S


def test_a_server_that_stays_down_is_tried_first_less_and_less_often(clock):
    """Server 0 is away. Each create while it cools down goes straight to server 1; once its cooldown ends it is
    tried first again (it has the fewest live sessions), fails over, and then stays last twice as long."""
    placement, calls = _Placement(2), []
    create = _down_then_up({0}, calls)
    assert _place(placement, ADDRESSES, create) == (1, "session-on-1")
    assert calls == [0, 1]

    calls.clear()
    clock[0] += DOWN_COOLDOWN_S - 0.1  # still cooling down: not asked
    assert _place(placement, ADDRESSES, create)[0] == 1
    assert calls == [1]

    calls.clear()
    clock[0] += 0.2  # first cooldown over: tried first again, fails, now placed last for twice as long
    assert _place(placement, ADDRESSES, create)[0] == 1
    assert calls == [0, 1]

    calls.clear()
    clock[0] += 2 * DOWN_COOLDOWN_S - 0.1  # with a fixed cooldown it would have been tried again by now
    _place(placement, ADDRESSES, create)
    assert calls == [1]

    calls.clear()
    clock[0] += 0.2
    _place(placement, ADDRESSES, create)
    assert calls == [0, 1]


def test_a_server_back_up_is_placed_normally_and_its_next_failure_cools_down_briefly(clock):
    placement, calls = _Placement(2), []
    down = {0}
    create = _down_then_up(down, calls)
    for _ in range(3):  # three failures in a row: 5, 10, 20 s
        clock[0] += MAX_DOWN_COOLDOWN_S
        _place(placement, ADDRESSES, create)
    down.clear()
    clock[0] += MAX_DOWN_COOLDOWN_S
    assert _place(placement, ADDRESSES, create)[0] == 0  # back: placed on it (fewest live sessions)
    placement.release(0), placement.release(1)
    down.add(0)
    _place(placement, ADDRESSES, create)  # fails once more: the cooldown starts over at DOWN_COOLDOWN_S
    calls.clear()
    clock[0] += DOWN_COOLDOWN_S + 0.1
    _place(placement, ADDRESSES, create)
    assert calls[0] == 0


def test_an_error_that_is_not_about_the_server_counts_no_failure(clock):
    placement = _Placement(2)

    def create(i: int) -> str:
        raise InvalidArgumentError("bad config")

    with pytest.raises(InvalidArgumentError):
        _place(placement, ADDRESSES, create)
    assert placement.avoid(0) == DOWN_COOLDOWN_S  # the first failure in a row
    assert placement.live() == [0, 0]
