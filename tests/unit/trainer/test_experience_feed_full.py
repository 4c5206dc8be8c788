"""ExperienceFeed inserts into a full table: backpressure, never reported as a service outage; the wait ends when
the job stops. A fake store raises the store's RateLimitedError; the reconnect wrapper is the real one."""

from __future__ import annotations

import threading

import pytest

from marti.errors import CancelledError, RateLimitedError, UnavailableError
from marti.trajectory import Trajectory
from services.trainer import experience_feed
from services.trainer.experience_feed import ExperienceFeed
from services.trainer.reconnect import Backoff, call_with_reconnect


class FullStore:
    """Every insert is refused as the store refuses one into a full table, until ``room`` is set."""

    def __init__(self) -> None:
        self.inserts = 0
        self.timeouts: list[float | None] = []
        self.room = threading.Event()

    def share_experience(self, trajectory, table=None, priority=1.0, timeout_s=None):
        self.inserts += 1
        self.timeouts.append(timeout_s)
        if self.room.is_set():
            return self.inserts
        raise RateLimitedError(
            f"insert on table {table!r} timed out waiting (size=4/4)", table=table, size=4, max_size=4
        )


def _reconnecting(fn, what):
    """The loop's wrapper with a short outage limit (a rate-limited insert must not be retried by it)."""
    return call_with_reconnect(fn, what, Backoff(initial_s=0.01, max_s=0.01, timeout_s=0.05))


def _feed(store, **kwargs) -> ExperienceFeed:
    return ExperienceFeed(store, "job", ["a"], {"a": 1}, 4, _reconnecting, **kwargs)


def _episode() -> dict[str, Trajectory]:
    return {"a": Trajectory(episode_id="ep-1", agent_id="a")}


def test_giving_up_on_a_full_table_names_the_table_and_the_learner_not_an_outage(monkeypatch):
    monkeypatch.setattr(experience_feed, "FULL_RETRY_PAUSE_S", 0.01)
    store = FullStore()
    feed = _feed(store, full_timeout_s=0.2)
    with pytest.raises(RateLimitedError) as info:
        feed.insert_episode(_episode(), external=True)
    err = info.value
    assert not isinstance(err, UnavailableError)
    text = str(err)
    assert "table 'job/a' is full (4/4 items)" in text and "learner is not consuming" in text
    assert "unreachable" not in text and "not an outage" in text
    assert (err.table, err.size, err.max_size) == ("job/a", 4, 4)
    assert store.inserts >= 2  # kept trying while it waited (backpressure, not one failed call)
    assert set(store.timeouts) == {experience_feed.INSERT_POLL_S}  # each store wait is short
    assert feed.inserted == 0


def test_an_insert_waits_while_the_table_is_full_and_lands_when_room_comes(monkeypatch):
    monkeypatch.setattr(experience_feed, "FULL_RETRY_PAUSE_S", 0.01)
    store = FullStore()
    feed = _feed(store, full_timeout_s=60.0)
    threading.Timer(0.1, store.room.set).start()
    feed.insert_episode(_episode())
    assert feed.inserted == 1 and store.inserts >= 2


@pytest.mark.parametrize("whose", ["job", "call"])
def test_a_wait_for_room_ends_when_the_job_or_the_gateway_stops(whose):
    store = FullStore()
    stop = threading.Event()
    feed = _feed(store, full_timeout_s=5.0, stop=stop if whose == "job" else None)
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(CancelledError, match=r"stopped while table 'job/a' is full \(4/4 items\)"):
        feed.insert_episode(_episode(), external=True, stop=stop if whose == "call" else None)
    assert feed.inserted == 0
