"""EpisodeWriter inserts into a full table: backpressure, never reported as a service outage; the wait ends when
the job stops. A fake store raises the store's RateLimitedError; the reconnect wrapper is the real one."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from marti.errors import CancelledError, RateLimitedError, UnavailableError
from marti.types.trajectory import Trajectory
from services.trainer.data import episode_writer
from services.trainer.data.episode_writer import EpisodeWriter
from services.trainer.data.external import ExternalEpisodes
from services.trainer.job.connections.reconnect import Backoff, call_with_reconnect


class FullStore:
    """Every insert is refused as the store refuses one into a full table, until ``room`` is set."""

    def __init__(self) -> None:
        self.inserts = 0
        self.timeouts: list[float | None] = []
        self.room = threading.Event()

    def insert(self, table, trajectories, timeout_s=None):
        self.inserts += 1
        self.timeouts.append(timeout_s)
        if self.room.is_set():
            return [SimpleNamespace(key=self.inserts, duplicate=False)]
        raise RateLimitedError(
            f"insert on table {table!r} timed out waiting (size=4/4)", table=table, size=4, max_size=4
        )


def _reconnecting(fn, what):
    """The loop's wrapper with a short outage limit (a rate-limited insert must not be retried by it)."""
    return call_with_reconnect(fn, what, Backoff(initial_s=0.01, max_s=0.01, timeout_s=0.05))


def _feed(store, **kwargs) -> EpisodeWriter:
    return EpisodeWriter(store, {"a": "job/a"}, _reconnecting, ExternalEpisodes(["a"]), **kwargs)


def _episode() -> dict[str, Trajectory]:
    return {"a": Trajectory(episode_id="ep-1", agent_id="a")}


def test_giving_up_on_a_full_table_names_the_table_and_the_learner_not_an_outage(monkeypatch):
    monkeypatch.setattr(episode_writer, "FULL_RETRY_PAUSE_S", 0.01)
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
    assert set(store.timeouts) == {episode_writer.INSERT_POLL_S}  # each store wait is short
    assert feed.inserted == 0


def test_an_insert_waits_while_the_table_is_full_and_lands_when_room_comes(monkeypatch):
    monkeypatch.setattr(episode_writer, "FULL_RETRY_PAUSE_S", 0.01)
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


class TwoTables:
    """Tables ``job/a`` and ``job/b`` (limit 4): ``sizes`` says what :meth:`info` reports, ``refuse`` how many
    more inserts into a table are refused as full, ``down`` tables whose inserts fail as an outage."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = dict(sizes)
        self.refuse: dict[str, int] = {}
        self.down: set[str] = set()
        self.items: dict[str, list[str]] = {"job/a": [], "job/b": []}

    def info(self, table):
        return SimpleNamespace(size=self.sizes[table], config=SimpleNamespace(max_size=4))

    def insert(self, table, trajectories, timeout_s=None):
        if table in self.down:
            raise UnavailableError(f"the experience store is unavailable ({table})")
        if self.refuse.get(table, 0) > 0:
            self.refuse[table] -= 1
            raise RateLimitedError(f"insert on table {table!r} timed out", table=table, size=4, max_size=4)
        self.items[table].extend(t.episode_id for t in trajectories)
        self.sizes[table] += len(trajectories)
        return [SimpleNamespace(key=1, duplicate=False) for _ in trajectories]

    def delete(self, table, episode_ids):
        kept = [e for e in self.items[table] if e not in episode_ids]
        deleted, self.items[table] = len(self.items[table]) - len(kept), kept
        self.sizes[table] -= deleted
        return deleted


def _two(store, **kwargs) -> EpisodeWriter:
    tables = {"a": "job/a", "b": "job/b"}
    return EpisodeWriter(store, tables, _reconnecting, ExternalEpisodes(["a", "b"]), **kwargs)


def _both(eid: str = "ep-1") -> dict[str, Trajectory]:
    return {agent: Trajectory(episode_id=eid, agent_id=agent) for agent in ("a", "b")}


def test_a_stop_while_one_agents_table_is_full_leaves_the_episode_out_of_every_table(monkeypatch):
    monkeypatch.setattr(episode_writer, "ROOM_POLL_S", 0.01)
    store = TwoTables({"job/a": 0, "job/b": 4})
    stop = threading.Event()
    feed = _two(store, full_timeout_s=30.0)
    threading.Timer(0.2, stop.set).start()
    with pytest.raises(CancelledError, match=r"table 'job/b' is full \(4/4 items\): stopped before any item"):
        feed.insert_episode(_both(), external=True, stop=stop)
    assert store.items == {"job/a": [], "job/b": []} and feed.inserted == 0


def test_an_episode_waits_for_room_in_every_table_and_then_goes_in_whole_even_if_stop_comes(monkeypatch):
    """Room came in both tables, but job/b filled again before its item: once job/a has the episode, the stop
    event does not cut it; job/b's item waits for room and lands."""
    monkeypatch.setattr(episode_writer, "ROOM_POLL_S", 0.01)
    monkeypatch.setattr(episode_writer, "FULL_RETRY_PAUSE_S", 0.01)
    store = TwoTables({"job/a": 4, "job/b": 0})
    store.refuse["job/b"] = 3
    stop = threading.Event()
    feed = _two(store, full_timeout_s=30.0)

    def room_then_stop():
        store.sizes["job/a"] = 3
        stop.set()

    threading.Timer(0.1, room_then_stop).start()
    feed.insert_episode(_both(), external=True, stop=stop)
    assert store.items == {"job/a": ["ep-1"], "job/b": ["ep-1"]} and feed.inserted == 2


def test_waiting_for_room_in_every_table_gives_up_naming_the_full_one(monkeypatch):
    monkeypatch.setattr(episode_writer, "ROOM_POLL_S", 0.01)
    store = TwoTables({"job/a": 0, "job/b": 4})
    with pytest.raises(
        RateLimitedError, match=r"table 'job/b' is full \(4/4 items\) and stayed full"
    ) as info:
        _two(store, full_timeout_s=0.1).insert_episode(_both(), external=True)
    assert (info.value.table, info.value.size, info.value.max_size) == ("job/b", 4, 4)
    assert store.items == {"job/a": [], "job/b": []}


def test_an_insert_failing_after_another_agents_item_went_in_says_which_tables_got_the_episode():
    store = TwoTables({"job/a": 0, "job/b": 0})
    store.down.add("job/b")
    with pytest.raises(
        UnavailableError,
        match=r"episode ep-1 is only partly inserted: it is in \['job/a'\] but not in \['job/b'\].*unavailable",
    ):
        _two(store).insert_episode(_both(), external=True)
    assert store.items == {"job/a": ["ep-1"], "job/b": []}


def test_a_built_in_episode_asks_no_table_for_room_and_a_failed_attempt_is_retracted():
    """Built-in rollouts skip the room look (it costs one table-info call per agent per episode): a failure part-way
    still says which tables got the episode, and the loop retracts the attempt: the store deletes what went in (over a
    real store: tests/integration/trainer/test_agent_tables.py's retraction tests)."""

    class Counting(TwoTables):
        infos = 0

        def info(self, table):
            Counting.infos += 1
            return super().info(table)

    store = Counting({"job/a": 0, "job/b": 0})
    feed = _two(store)
    feed.begin_attempt()
    feed.insert_episode(_both("ok"))
    store.down.add("job/b")
    with pytest.raises(UnavailableError, match=r"episode cut is only partly inserted"):
        feed.insert_episode(_both("cut"))
    feed.retract_attempt()
    assert Counting.infos == 0 and store.items == {"job/a": [], "job/b": []}  # the attempt's episodes deleted
    store.down.clear()
    feed.insert_episode(_both("again"), external=True)  # an external episode does look
    assert Counting.infos == 2
