"""SQLite write-ahead store: a core rebuilt from the same data dir continues where the old one stopped."""

from __future__ import annotations

from services.comm_broker.core import Broker, BrokerLimits, Envelope, SqliteStore


def env(mid: str, seq: int = 0, **kw) -> Envelope:
    return Envelope(message_id=mid, sender="a", payload=mid.encode(), receivers=("b",), sequence=seq, **kw)


def crashed(store: SqliteStore) -> None:
    """What a crash leaves: the database as committed; the kernel drops the data dir's lock with the process."""
    store._dir_lock.unlock()


def test_restart_keeps_unacked_drops_acked_and_keeps_states(tmp_path):
    store = SqliteStore(str(tmp_path))
    b = Broker(BrokerLimits(), store)
    b.create_session("s", ["a", "b"], dictionary=b"dict-bytes")
    b.send("s", "a", [env("m1", 1), env("m2", 2), env("m3", 3)])
    b.receive("s", "b", 2)
    b.ack("s", "b", ["m1"])  # m2 in flight, m3 pending
    b.put_state("s", "a", b'{"turn": 3}')
    b.join("s", "b", ["news"])
    crashed(store)  # no close(): the WAL holds every committed transaction
    b2 = Broker(BrokerLimits(), SqliteStore(str(tmp_path)))
    got = b2.receive("s", "b", 10)
    assert [(d.envelope.message_id, d.envelope.payload, d.attempt) for d in got] == [
        ("m2", b"m2", 1),  # attempts are persisted on ack timeout, not on every delivery
        ("m3", b"m3", 1),
    ]
    assert b2.send("s", "a", [env("m1", 1)]).duplicates == 1  # dedup survives the restart
    st = b2.get_states("s", "b")
    assert [(s.agent_id, s.value, s.version) for s in st] == [("a", b'{"turn": 3}', 1)]
    assert b2.sessions["s"].dictionary == b"dict-bytes"
    assert b2.sessions["s"].topics == {"news": {"b"}}
    assert b2.send("s", "a", [env("m9")]).sequences == (4,)  # broker-assigned sequence continues


def test_dead_letters_and_session_expiry_persist(tmp_path):
    clock = [0.0]
    limits = BrokerLimits(ack_timeout_s=1, max_delivery_attempts=1, session_idle_s=100)
    store = SqliteStore(str(tmp_path))
    b = Broker(limits, store, clock=lambda: clock[0])
    b.send("s", "a", [env("m1")])
    b.send("gone", "a", [env("m1")])
    b.receive("s", "b", 1)
    clock[0] = 2
    b.tick()
    crashed(store)
    store = SqliteStore(str(tmp_path))
    b2 = Broker(limits, store, clock=lambda: clock[0])
    assert [d.envelope.message_id for d in b2.read_dead_letters("s", 10)] == ["m1"]
    assert b2.receive("s", "b", 10) == []
    clock[0] = 500
    b2.read_dead_letters("s", 10, remove=True)
    b2.session("s")  # touch s only
    b2.tick()
    crashed(store)
    b3 = Broker(limits, SqliteStore(str(tmp_path)), clock=lambda: clock[0])
    assert set(b3.sessions) == {"s"}
    assert b3.read_dead_letters("s", 10) == []


def test_a_send_on_a_full_disk_is_resource_exhausted_and_delivers_nothing(tmp_path):
    """A full disk (SQLite's SQLITE_FULL, made here with ``PRAGMA max_page_count``) was an INTERNAL error with a
    server traceback: now RESOURCE_EXHAUSTED naming the database, and the refused send is in no mailbox and no
    dedup id, so the same message sent again once there is room is delivered, not called a duplicate."""
    import pytest

    from marti.errors import ResourceExhaustedError

    store = SqliteStore(str(tmp_path))
    b = Broker(BrokerLimits(), store)
    b.create_session("s", ["a", "b"])
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]
    store._db.execute(f"PRAGMA max_page_count = {pages}")
    big = Envelope(message_id="m1", sender="a", payload=b"x" * 200_000, receivers=("b",))
    said = r"broker database .*broker\.sqlite3 is full \(database or disk is full\): nothing of this call was stored"
    with pytest.raises(ResourceExhaustedError, match=said):
        b.send("s", "a", [big])
    assert b.receive("s", "b", 10) == []
    store._db.execute("PRAGMA max_page_count = 1073741823")  # room again
    assert b.send("s", "a", [big]).duplicates == 0
    assert [d.envelope.message_id for d in b.receive("s", "b", 10)] == ["m1"]
    store.close()
