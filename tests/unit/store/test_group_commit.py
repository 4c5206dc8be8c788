"""SQLite storage write path: group commit, ordering, failure isolation, WAL checkpoints off the commit path,
page size, schema migration and the settings that control them."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from marti.errors import InternalError, InvalidArgumentError, UnavailableError
from marti.types.experience import parse_table_config
from services.experience_store.__main__ import build_store
from services.experience_store.core.storage import ItemRecord, SqliteStorage
from services.experience_store.core.store import ExperienceStore
from services.experience_store.settings import StoreSettings

from .helpers import item


def rec(key: int, nbytes: int = 10) -> ItemRecord:
    return ItemRecord(key, "t", key, 1.0, 0, 0.0, f"ep{key}", "", "a1", "", 0, 0.0, 1, nbytes)


def wait_for(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


@pytest.mark.parametrize(("group_max_bytes", "grouped"), [(64 << 20, True), (1, False)])
def test_queued_operations_commit_together_up_to_group_max_bytes(tmp_path, group_max_bytes, grouped):
    st = SqliteStorage(tmp_path, group_max_bytes=group_max_bytes)
    before = st.stats()
    with st._write_lock:  # the writer stalls on its first group; the rest queue up behind it
        tickets = [st.submit("t", inserts=[(rec(k), b"p" * 100)]) for k in range(1, 11)]
        assert not any(t.done for t in tickets)
        assert st.get_payloads([3]) == {3: b"p" * 100}  # queued payloads are readable before the commit
    for t in tickets:
        t.wait()
    after = st.stats()
    assert after["operations"] - before["operations"] == 10
    txns = after["transactions"] - before["transactions"]
    if grouped:  # the stalled first operation, then the nine queued behind it
        assert txns <= 2
    else:  # each operation exceeds the cap on its own
        assert txns == 10
    assert set(st.get_payloads(range(1, 11))) == set(range(1, 11))
    st.close()


def test_a_failing_operation_fails_alone_and_order_is_kept(tmp_path):
    st = SqliteStorage(tmp_path)
    st.commit("t", inserts=[(rec(1), b"a")])
    with st._write_lock:
        good = st.submit("t", inserts=[(rec(2), b"b")])
        bad = st.submit("t", inserts=[(rec(1), b"dup")])  # key 1 exists: UNIQUE constraint
        upd = st.submit("t", updates=[(2, 7.0, 3)])  # after the insert of key 2 in submission order
        gone = st.submit("t", deletes=[1])
    good.wait()
    upd.wait()
    gone.wait()
    with pytest.raises(InternalError, match="storage commit failed"):
        bad.wait()
    st.close()
    st = SqliteStorage(tmp_path)
    items = {r.key: r for r in st.load().items}
    assert set(items) == {2} and (items[2].priority, items[2].times_sampled) == (7.0, 3)
    assert st.get_payloads([1, 2]) == {2: b"b"}
    st.close()


def test_close_commits_queued_operations_and_refuses_later_ones(tmp_path):
    st = SqliteStorage(tmp_path)
    tickets = [st.submit("t", inserts=[(rec(k), b"x")]) for k in range(1, 51)]
    st.close()
    assert all(t.done for t in tickets)
    with pytest.raises(UnavailableError, match="closed"):
        st.submit("t", inserts=[(rec(99), b"x")]).wait()
    st = SqliteStorage(tmp_path)
    assert [r.key for r in st.load().items] == list(range(1, 51))
    st.close()


def test_table_waits_for_its_commit_outside_its_lock(tmp_path):
    """Concurrent inserts into one table reach the writer together: the table does not hold its lock while
    its commit is pending."""
    st = SqliteStorage(tmp_path)
    store = ExperienceStore(st, [parse_table_config({"name": "q", "preset": "uniform"})], default_table=None)
    before = st.stats()
    results: list = []
    with st._write_lock:
        threads = [
            threading.Thread(target=lambda: results.append(store.insert("q", [item()], 1.0)))
            for _ in range(4)
        ]
        for th in threads:
            th.start()
        # all four inserts reach the storage while the stalled writer holds the first (a table holding its lock
        # until its commit would let one in at a time); the writer may have taken one or more of them already
        wait_for(lambda: len(st._pending) == 4)
        assert results == []  # nobody is answered before the commit
    for th in threads:
        th.join(10)
    assert len(results) == 4
    assert st.stats()["transactions"] - before["transactions"] in (1, 2)
    store.close()


@pytest.mark.parametrize(("checkpoint_mib", "checkpointed"), [(1.0, True), (1000.0, False)])
def test_wal_is_copied_in_the_background_every_checkpoint_mib(tmp_path, checkpoint_mib, checkpointed):
    st = SqliteStorage(tmp_path, checkpoint_mib=checkpoint_mib)
    payload = b"z" * (256 << 10)
    for k in range(1, 81):  # 20 MiB, one commit each
        st.commit("t", inserts=[(rec(k, len(payload)), payload)])
        if (
            checkpointed and k % 8 == 0
        ):  # let the background checkpoint finish so the writer can start the log over
            wait_for(
                lambda: st._bg_state != "running"
            )  # (a fixed 0.05 s could end first on a loaded machine)
    wal = tmp_path / "store.sqlite-wal"
    if checkpointed:
        wait_for(lambda: st.stats()["wal_checkpoints"] >= 2)
        assert wal.stat().st_size < 12 << 20  # the log was reused, not grown to 20 MiB
    else:
        assert st.stats()["wal_checkpoints"] == 0
        assert wal.stat().st_size > 20 << 20
    st.close()


def test_page_size_applies_to_new_databases_only(tmp_path):
    st = SqliteStorage(tmp_path / "a", page_size=8192)
    assert st.page_size == 8192
    st.close()
    st = SqliteStorage(tmp_path / "a", page_size=32768)  # existing database keeps its page size
    assert st.page_size == 8192
    st.close()
    st = SqliteStorage(tmp_path / "b")
    assert st.page_size == 16384
    st.close()
    for bad in ({"page_size": 1000}, {"group_max_bytes": 0}, {"checkpoint_mib": 0}, {"cache_mib": 0}):
        with pytest.raises(InvalidArgumentError, match=next(iter(bad))):
            SqliteStorage(tmp_path / "c", **bad)


def test_database_with_payloads_in_items_is_migrated(tmp_path):
    conn = sqlite3.connect(tmp_path / "store.sqlite")
    conn.executescript(
        """
        CREATE TABLE tables (name TEXT PRIMARY KEY, config TEXT NOT NULL, counters TEXT NOT NULL DEFAULT '{}');
        CREATE TABLE items (
            key INTEGER PRIMARY KEY, table_name TEXT NOT NULL, seq INTEGER NOT NULL, priority REAL NOT NULL,
            times_sampled INTEGER NOT NULL, inserted_at REAL NOT NULL, episode_id TEXT NOT NULL,
            session TEXT NOT NULL, agent_id TEXT NOT NULL, role TEXT NOT NULL, policy_version INTEGER NOT NULL,
            created_at REAL NOT NULL, num_turns INTEGER NOT NULL, num_bytes INTEGER NOT NULL,
            payload BLOB NOT NULL);
        INSERT INTO items VALUES (5, 't', 9, 2.5, 3, 1.0, 'ep', 's', 'a1', 'r', 4, 2.0, 1, 7, x'0102');
        """
    )
    conn.commit()
    conn.close()
    st = SqliteStorage(tmp_path)
    (r,) = st.load().items
    assert (r.key, r.seq, r.priority, r.times_sampled, r.policy_version, r.num_bytes) == (5, 9, 2.5, 3, 4, 7)
    assert st.get_payloads([5]) == {5: b"\x01\x02"}
    st.commit("t", inserts=[(rec(6), b"new")], deletes=[5])
    assert st.get_payloads([5, 6]) == {6: b"new"}
    st.close()
    cols = [c[1] for c in sqlite3.connect(tmp_path / "store.sqlite").execute("PRAGMA table_info(items)")]
    assert "payload" not in cols


def test_store_settings_reach_the_sqlite_storage(tmp_path):
    settings = StoreSettings(
        data_dir=str(tmp_path), sqlite_page_size=8192, group_commit_max_bytes=12345, wal_checkpoint_mib=3.0
    )
    store = build_store(settings)
    st = store.storage
    assert isinstance(st, SqliteStorage)
    assert (st.page_size, st.group_max_bytes, st.checkpoint_bytes) == (8192, 12345, 3 << 20)
    store.close()


def test_writer_survives_an_operation_that_cannot_be_written(tmp_path):
    st = SqliteStorage(tmp_path)
    with pytest.raises(InternalError, match="storage commit failed"):
        st.commit("t", inserts=[(rec(1), b"a")], counters={"inserts": object()})  # not JSON: TypeError
    st.commit("t", inserts=[(rec(2), b"b")])  # the writer thread still runs
    assert st.get_payloads([1, 2]) == {2: b"b"}  # the failed operation was rolled back as a whole
    st.close()
