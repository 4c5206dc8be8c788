"""A table's accounting after an insert whose commit failed (a full disk): the items evicted to make room come
back at once and are not counted as evicted, and no key is remembered as withdrawn beyond the take that holds it."""

from __future__ import annotations

import threading
import time

from marti.errors import ResourceExhaustedError
from marti.types.experience import parse_table_config
from marti.types.trajectory import summarize
from services.experience_store.core.storage import SqliteStorage
from services.experience_store.core.store import ExperienceStore
from services.experience_store.core.table_records import NewItem

from .helpers import item, make_traj


def _fill_the_disk(storage: SqliteStorage) -> None:
    """Let the database grow no further: SQLite then refuses a write with ``SQLITE_FULL`` ("database or disk is
    full"), the error a full disk gives (``PRAGMA max_page_count``, so no real disk has to fill up)."""
    pages = storage._wconn.execute("PRAGMA page_count").fetchone()[0]
    storage._wconn.execute(f"PRAGMA max_page_count = {pages}")


def _room_again(storage: SqliteStorage) -> None:
    storage._wconn.execute("PRAGMA max_page_count = 1073741823")


def _big(episode: str) -> NewItem:
    """An item too big for a full database's free pages."""
    return NewItem(b"x" * 200_000, summarize(make_traj(episode=episode)), 1.0)


def _episodes(store: ExperienceStore, table: str) -> list[str]:
    return [r.episode_id for r in store.table(table).records()]


def test_items_evicted_for_a_failed_insert_come_back_at_once_and_are_counted_once_across_a_restart(tmp_path):
    """An insert into a full ``evict`` table evicted an item, then its commit failed: the evicted item stayed out
    of the table (its delete never reached the database) until a restart brought it back, while its eviction was
    counted in memory and committed with the next operation's counters, so after the restart the table fitted it
    by evicting again: one item, two evictions. Now the failed commit puts it back and uncounts it at once."""
    config = parse_table_config({"name": "t", "preset": "uniform", "max_size": 3})
    s = ExperienceStore(SqliteStorage(tmp_path), [config], seed=0)
    s.insert("t", [item(episode=f"e{i}") for i in range(3)], 0)
    counters = s.table("t").info()["counters"]
    _fill_the_disk(s.storage)
    (res,) = s.insert("t", [_big("big")], 0)
    assert isinstance(res, ResourceExhaustedError)
    assert _episodes(s, "t") == ["e0", "e1", "e2"]  # e0, evicted for room, is back
    assert s.table("t").info()["counters"] == counters
    _room_again(s.storage)
    assert isinstance(s.insert("t", [_big("big")], 0)[0], int)
    assert _episodes(s, "t") == ["e1", "e2", "big"]
    assert s.table("t").info()["counters"]["evictions"] == 1
    assert (s.table("t")._in_flight, s.table("t")._evicted_in_flight) == ({}, set())  # nothing kept after
    s.close()
    s2 = ExperienceStore(SqliteStorage(tmp_path), [config], seed=0)  # reopened from the database
    assert _episodes(s2, "t") == ["e1", "e2", "big"]
    info = s2.table("t").info()["counters"]
    assert (info["evictions"], info["inserts"], info["deletes"]) == (1, 4, 1)
    s2.close()


def test_an_item_evicted_by_a_later_item_of_its_own_failed_commit_is_not_counted_either(tmp_path):
    """Items of one commit: the first evicted the stored item, the second evicted the first (never stored). When
    the commit fails, neither item is answered with a key, the stored item comes back, and no counter keeps an
    insert, delete or eviction of theirs."""
    config = parse_table_config({"name": "t", "preset": "uniform", "max_size": 1})
    s = ExperienceStore(SqliteStorage(tmp_path), [config], seed=0)
    s.insert("t", [item(episode="e0")], 0)
    counters = s.table("t").info()["counters"]
    _fill_the_disk(s.storage)
    results = s.insert("t", [_big("a"), _big("b")], 0)
    assert all(isinstance(r, ResourceExhaustedError) for r in results) and len(results) == 2
    assert _episodes(s, "t") == ["e0"]
    assert s.table("t").info()["counters"] == counters
    s.close()


def test_an_item_whose_insert_failed_is_not_put_back_by_the_failed_insert_that_evicted_it(tmp_path):
    """Two inserts into a full ``evict`` table of ``max_size`` 1, both failing on a full disk: the first evicted
    the stored item, the second evicted the first's (not committed yet). The second's failure put the first's
    item back although that item's own insert had failed: an item no restart would bring, answered as a
    duplicate when sent again. Now only the stored item comes back, and the counters are as before both."""
    config = parse_table_config({"name": "t", "preset": "uniform", "max_size": 1})
    s = ExperienceStore(SqliteStorage(tmp_path), [config], seed=0)
    table, storage = s.table("t"), s.storage
    s.insert("t", [item(episode="e0")], 0)
    counters = table.info()["counters"]
    _fill_the_disk(storage)
    results: list = []
    storage._write_lock.acquire()  # the writer holds both inserts until both are queued
    inserters = []
    for episode in ("a", "b"):
        inserters.append(
            threading.Thread(target=lambda e=episode: results.extend(table.insert([_big(e)], 0)))
        )
        inserters[-1].start()
        while _episodes(s, "t") != [episode]:
            time.sleep(0.01)
    storage._write_lock.release()
    for t in inserters:
        t.join(10)
    assert len(results) == 2 and all(isinstance(r, ResourceExhaustedError) for r in results)
    assert _episodes(s, "t") == ["e0"]
    assert table.info()["counters"] == counters
    assert (table._in_flight, table._evicted_in_flight) == ({}, set())
    s.close()
    assert _reopened(tmp_path, 1) == ["e0"]


def _evicting_insert_fails_around(tmp_path, action, submitted) -> tuple[ExperienceStore, list, list]:
    """A table of ``e0``, ``e1`` at its ``max_size`` 2 on a full disk: an insert of a big item evicts ``e0`` and
    its commit is held back (the writer's lock) until ``action(table)``, run on another thread, has submitted its
    own operation (``submitted(table)`` true); then the insert's commit fails. Returns the store, the insert's
    results and what ``action`` returned (or raised)."""
    config = parse_table_config({"name": "t", "preset": "uniform", "max_size": 2})
    s = ExperienceStore(SqliteStorage(tmp_path), [config], seed=0)
    table, storage = s.table("t"), s.storage
    s.insert("t", [item(episode=f"e{i}") for i in range(2)], 0)
    _fill_the_disk(storage)
    results, done = [], []
    storage._write_lock.acquire()
    inserter = threading.Thread(target=lambda: results.extend(table.insert([_big("big")], 0)))
    inserter.start()
    while "big" not in _episodes(s, "t"):
        time.sleep(0.01)
    other = threading.Thread(target=lambda: done.append(_returned(action, table)))
    other.start()
    while not submitted(table):
        time.sleep(0.01)
    table.info()  # takes the table's lock: ``action`` left it, its operation submitted
    storage._write_lock.release()
    inserter.join(10)
    other.join(10)
    assert len(results) == 1 and isinstance(results[0], ResourceExhaustedError)
    return s, results, done


def _reopened(tmp_path, max_size: int = 2) -> list[str]:
    """The episodes of table ``t`` (of ``max_size``) once the store is reopened from its database."""
    config = parse_table_config({"name": "t", "preset": "uniform", "max_size": max_size})
    s2 = ExperienceStore(SqliteStorage(tmp_path), [config], seed=0)
    try:
        return _episodes(s2, "t")
    finally:
        s2.close()


def test_an_eviction_before_a_reset_is_not_undone_into_the_reset_table(tmp_path):
    """A table reset while a failed insert's commit was queued: the items that insert evicted are not put back
    into the emptied table (nor uncounted from its zeroed counters); their delete is sent again instead, so a
    restart does not bring them back either."""
    s, _, resets = _evicting_insert_fails_around(tmp_path, lambda t: t.reset(), lambda t: not len(t))
    assert resets == [2]  # e1 and big; the insert's failure comes after
    assert len(s.table("t")) == 0 and min(s.table("t").info()["counters"].values()) >= 0
    s.close()
    assert _reopened(tmp_path) == []


def test_an_evicted_item_whose_episode_was_deleted_meanwhile_does_not_come_back(tmp_path):
    """The episode of an item a failed insert evicted was deleted while the insert's commit was queued (the
    delete found nothing in the table): the item is not put back, and its delete is sent again, so a restart
    does not bring it back either."""
    s, _, deleted = _evicting_insert_fails_around(
        tmp_path, lambda t: t.delete(["e0"]), lambda t: t.episodes.was_deleted("e0")
    )
    assert deleted == [0]
    assert _episodes(s, "t") == ["e1"]
    s.close()
    assert _reopened(tmp_path) == ["e1"]


def test_a_failed_insert_remembers_no_key_that_no_open_take_holds(tmp_path):
    """A failed insert whose item had already left the table another way (deleted, evicted, or sampled out and
    committed) while some other sample's take was open remembered the key as withdrawn, for a release that never
    came: one key kept forever per such failure. Now only a key an open take holds is remembered, and its take's
    commit or release forgets it."""
    s = ExperienceStore(SqliteStorage(tmp_path), seed=0)
    s.create_table(parse_table_config({"name": "q", "preset": "queue"}))
    table, storage = s.table("q"), s.storage
    s.insert("q", [item(episode="held")], 0)
    take = table.take(1, 5)  # an open take: it holds "held"
    _fill_the_disk(storage)
    results, deleted = [], []
    for n in range(3):  # repeated failures
        storage._write_lock.acquire()  # the writer holds the insert until its item was deleted
        inserter = threading.Thread(target=lambda n=n: results.extend(table.insert([_big(f"k{n}")], 0)))
        inserter.start()
        while not len(table):
            time.sleep(0.01)
        deleter = threading.Thread(target=lambda n=n: deleted.append(_returned(table.delete, [f"k{n}"])))
        deleter.start()
        while len(table):
            time.sleep(0.01)
        storage._write_lock.release()
        inserter.join(10)
        deleter.join(10)
    assert all(isinstance(r, ResourceExhaustedError) for r in results) and len(results) == 3
    assert table._withdrawn == set()
    table.release(take)
    assert _episodes(s, "q") == ["held"] and table._withdrawn == set()
    s.close()


def _returned(fn, *args):
    """What ``fn(*args)`` returned, or the exception it raised."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        return e


def test_an_insert_into_closed_storage_is_answered_unavailable_per_item_and_leaves_nothing(tmp_path):
    """Storage closed before the commit: each item's result is the UnavailableError naming the storage (the call
    does not raise), and the items leave the table uncounted."""
    from marti.errors import UnavailableError

    s = ExperienceStore(SqliteStorage(tmp_path), seed=0)
    s.create_table(parse_table_config({"name": "t", "preset": "uniform"}))
    counters = s.table("t").info()["counters"]
    s.storage.close()
    results = s.insert("t", [item(episode="e0"), item(episode="e1")], 0)
    assert len(results) == 2 and all(isinstance(r, UnavailableError) for r in results)
    assert "is closed" in str(results[0])
    assert len(s.table("t")) == 0 and s.table("t").info()["counters"] == counters
    s.close()
