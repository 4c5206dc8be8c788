"""Write-ahead storage for the broker: nothing (in memory) or SQLite in WAL mode.

The broker core keeps all live state in memory and calls a :class:`Store` *before* it answers a call that
changes durable state, so an acknowledged Send is on disk and an acknowledged Ack has deleted its row.
On start, :meth:`Store.load` returns everything needed to rebuild the sessions: in-flight deliveries come
back as pending (they are delivered again, at-least-once), acked ones are gone.

Why SQLite (stdlib ``sqlite3``) in WAL mode: it ships with Python (no extra dependency, nothing to
operate), is one of the most tested storage engines there is, and WAL gives one fsync-free append per
commit with ``synchronous=NORMAL``; that survives a crash of the process (``kill -9``): committed
transactions are in the WAL file, which the OS holds. ``synchronous=FULL`` (``--fsync``) adds an fsync
per commit and also survives power loss. LMDB would be faster for point reads, but needs a native
dependency and gives us nothing the queue workload uses.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass, field

from marti.plumbing.dir_lock import DirLock, is_storage_full, opening_database, storage_full_error

from .types import AgentState, DeadLetter, Envelope


@dataclass(slots=True)
class StoredMessage:
    """A mailbox row as loaded from storage."""

    receiver: str
    position: int
    attempts: int
    expires_at: float
    envelope: Envelope


@dataclass(slots=True)
class StoredSession:
    """Everything stored for one session."""

    name: str
    created_at: float
    fixed_roster: bool
    dictionary: bytes
    agents: dict[str, set[str]] = field(default_factory=dict)
    messages: list[StoredMessage] = field(default_factory=list)
    states: list[AgentState] = field(default_factory=list)
    dedup: list[tuple[str, float]] = field(default_factory=list)
    last_seq: dict[str, int] = field(default_factory=dict)
    dead: list[DeadLetter] = field(default_factory=list)


class Store:
    """The in-memory store: every write is a no-op and :meth:`load` returns nothing.

    Without ``--data-dir`` the broker runs on this: fast, and everything is lost when the process exits.
    """

    durable = False

    def load(self) -> list[StoredSession]:
        """Returns the stored sessions (none for the in-memory store)."""
        return []

    def create_session(self, name: str, created_at: float, fixed_roster: bool, dictionary: bytes) -> None:
        """Records a new session."""

    def delete_session(self, name: str) -> None:
        """Deletes a session and everything in it."""

    def put_agent(self, session: str, agent: str, topics: set[str]) -> None:
        """Records an agent (mailbox) and its topic subscriptions."""

    def record_send(
        self,
        session: str,
        rows: list[StoredMessage],
        dedup: list[tuple[str, float]],
        last_seq: dict[str, int],
    ) -> None:
        """Records accepted messages (one row per receiver), their dedup ids and the senders' last seqs."""

    def delete_messages(self, session: str, receiver: str, message_ids: list[str]) -> None:
        """Deletes mailbox rows (acked or expired)."""

    def record_attempts(self, session: str, receiver: str, attempts: list[tuple[str, int]]) -> None:
        """Records delivery attempt counts of requeued messages."""

    def record_dead(self, session: str, dead: list[DeadLetter], keep: int) -> None:
        """Moves messages to the dead-letter table, keeping the newest ``keep`` of the session."""

    def delete_dead(self, session: str, count: int) -> None:
        """Deletes the oldest ``count`` dead letters of a session (after a destructive read)."""

    def put_state(self, session: str, state: AgentState) -> None:
        """Records the latest state of an agent."""

    def prune_dedup(self, session: str, seen_before: float) -> None:
        """Forgets dedup ids first seen before ``seen_before`` (wall-clock seconds)."""

    def close(self) -> None:
        """Closes the store."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (name TEXT PRIMARY KEY, created_at REAL, fixed_roster INTEGER,
    dictionary BLOB);
CREATE TABLE IF NOT EXISTS agents (session TEXT, agent TEXT, topics TEXT, PRIMARY KEY (session, agent));
CREATE TABLE IF NOT EXISTS messages (session TEXT, receiver TEXT, message_id TEXT, position INTEGER,
    attempts INTEGER, expires_at REAL, sender TEXT, sequence INTEGER, sent_at REAL, ttl_s REAL,
    content_type TEXT, payload BLOB, receivers TEXT, topic TEXT, broadcast INTEGER,
    PRIMARY KEY (session, receiver, message_id));
CREATE TABLE IF NOT EXISTS dedup (session TEXT, message_id TEXT, seen_at REAL, PRIMARY KEY (session, message_id));
CREATE INDEX IF NOT EXISTS dedup_seen ON dedup (session, seen_at);
CREATE TABLE IF NOT EXISTS senders (session TEXT, sender TEXT, last_seq INTEGER, PRIMARY KEY (session, sender));
CREATE TABLE IF NOT EXISTS states (session TEXT, agent TEXT, value BLOB, content_type TEXT, version INTEGER,
    updated_at REAL, PRIMARY KEY (session, agent));
CREATE TABLE IF NOT EXISTS dead (id INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT, receiver TEXT,
    attempts INTEGER, reason TEXT, dead_at REAL, message_id TEXT, sender TEXT, sequence INTEGER,
    sent_at REAL, ttl_s REAL, content_type TEXT, payload BLOB, receivers TEXT, topic TEXT, broadcast INTEGER);
CREATE INDEX IF NOT EXISTS dead_session ON dead (session, id);
"""

_ENV_COLS = "message_id, sender, sequence, sent_at, ttl_s, content_type, payload, receivers, topic, broadcast"


def _env_row(e: Envelope) -> tuple:
    return (
        e.message_id,
        e.sender,
        e.sequence,
        e.sent_at,
        e.ttl_s,
        e.content_type,
        e.payload,
        json.dumps(list(e.receivers), ensure_ascii=False),
        e.topic,
        int(e.broadcast),
    )


def _env_from(row: tuple) -> Envelope:
    mid, sender, seq, sent_at, ttl_s, ctype, payload, receivers, topic, broadcast = row
    return Envelope(
        message_id=mid,
        sender=sender,
        payload=bytes(payload),
        content_type=ctype,
        receivers=tuple(json.loads(receivers)),
        topic=topic,
        broadcast=bool(broadcast),
        sequence=seq,
        sent_at=sent_at,
        ttl_s=ttl_s,
    )


class SqliteStore(Store):
    """SQLite write-ahead log in ``DATA_DIR/broker.sqlite3`` (WAL mode).

    Args:
        data_dir: Folder for the database (created if missing).
        fsync: ``synchronous=FULL`` (fsync every commit; survives power loss) instead of ``NORMAL``
            (survives process crashes, not power loss).

    Raises:
        InvalidArgumentError: ``data_dir`` cannot be a folder (a file, a parent that is a file; named by
            :func:`marti.plumbing.dir_lock.ensure_folder`).
        FailedPreconditionError: another broker holds ``data_dir`` (an exclusive lock on ``<data_dir>/.lock``
            until :meth:`close` or the process ends); the folder and the holder's pid are named.
    """

    durable = True

    def __init__(self, data_dir: str, fsync: bool = False) -> None:
        self._dir_lock = DirLock(data_dir, "broker data dir", advice="give this broker another --data-dir")
        self._dir_lock.lock()
        self.path = os.path.join(data_dir, "broker.sqlite3")
        with opening_database(self.path, "broker database", self._dir_lock):
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={'FULL' if fsync else 'NORMAL'}")
            self._db.executescript(_SCHEMA)

    def _tx(self, statements: list[tuple[str, list[tuple] | tuple]]) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in statements:
                if isinstance(params, list):
                    db.executemany(sql, params)
                else:
                    db.execute(sql, params)
            db.execute("COMMIT")
        except BaseException as exc:
            if db.in_transaction:  # SQLite may have rolled back already (a full disk)
                db.execute("ROLLBACK")
            if is_storage_full(exc):
                raise storage_full_error(
                    "broker database", self.path, exc, "nothing of this call was stored or delivered"
                ) from exc
            raise

    def load(self) -> list[StoredSession]:
        """Reads every session with its agents, messages (in position order), states, dedup ids, dead letters."""
        db = self._db
        sessions = {
            name: StoredSession(name, created_at, bool(fixed), bytes(dictionary or b""))
            for name, created_at, fixed, dictionary in db.execute(
                "SELECT name, created_at, fixed_roster, dictionary FROM sessions"
            )
        }
        for session, agent, topics in db.execute("SELECT session, agent, topics FROM agents"):
            if session in sessions:
                sessions[session].agents[agent] = set(json.loads(topics))
        for row in db.execute(
            f"SELECT session, receiver, position, attempts, expires_at, {_ENV_COLS} FROM messages "
            "ORDER BY session, receiver, position"
        ):
            if row[0] in sessions:
                sessions[row[0]].messages.append(
                    StoredMessage(row[1], row[2], row[3], row[4], _env_from(row[5:]))
                )
        for session, agent, value, ctype, version, updated_at in db.execute(
            "SELECT session, agent, value, content_type, version, updated_at FROM states"
        ):
            if session in sessions:
                sessions[session].states.append(AgentState(agent, bytes(value), ctype, version, updated_at))
        for session, mid, seen_at in db.execute(
            "SELECT session, message_id, seen_at FROM dedup ORDER BY seen_at"
        ):
            if session in sessions:
                sessions[session].dedup.append((mid, seen_at))
        for session, sender, last_seq in db.execute("SELECT session, sender, last_seq FROM senders"):
            if session in sessions:
                sessions[session].last_seq[sender] = last_seq
        for row in db.execute(
            f"SELECT session, receiver, attempts, reason, dead_at, {_ENV_COLS} FROM dead ORDER BY id"
        ):
            if row[0] in sessions:
                sessions[row[0]].dead.append(DeadLetter(_env_from(row[5:]), row[1], row[2], row[3], row[4]))
        return list(sessions.values())

    def create_session(self, name: str, created_at: float, fixed_roster: bool, dictionary: bytes) -> None:
        """Inserts (or replaces) the session row."""
        self._tx(
            [
                (
                    "INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?)",
                    (name, created_at, int(fixed_roster), dictionary),
                )
            ]
        )

    def delete_session(self, name: str) -> None:
        """Deletes every row of the session in one transaction."""
        self._tx(
            [
                (f"DELETE FROM {t} WHERE {'name' if t == 'sessions' else 'session'}=?", (name,))
                for t in ("sessions", "agents", "messages", "dedup", "senders", "states", "dead")
            ]
        )

    def put_agent(self, session: str, agent: str, topics: set[str]) -> None:
        """Upserts the agent row with its topics (JSON list)."""
        self._tx(
            [
                (
                    "INSERT OR REPLACE INTO agents VALUES (?, ?, ?)",
                    (session, agent, json.dumps(sorted(topics), ensure_ascii=False)),
                )
            ]
        )

    def record_send(
        self,
        session: str,
        rows: list[StoredMessage],
        dedup: list[tuple[str, float]],
        last_seq: dict[str, int],
    ) -> None:
        """Inserts the mailbox rows, dedup ids and sender sequence numbers in one transaction."""
        self._tx(
            [
                (
                    f"INSERT OR REPLACE INTO messages (session, receiver, position, attempts, expires_at, {_ENV_COLS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (session, r.receiver, r.position, r.attempts, r.expires_at, *_env_row(r.envelope))
                        for r in rows
                    ],
                ),
                ("INSERT OR REPLACE INTO dedup VALUES (?, ?, ?)", [(session, m, t) for m, t in dedup]),
                (
                    "INSERT OR REPLACE INTO senders VALUES (?, ?, ?)",
                    [(session, s, q) for s, q in last_seq.items()],
                ),
            ]
        )

    def delete_messages(self, session: str, receiver: str, message_ids: list[str]) -> None:
        """Deletes the rows of acked or expired messages."""
        self._tx(
            [
                (
                    "DELETE FROM messages WHERE session=? AND receiver=? AND message_id=?",
                    [(session, receiver, m) for m in message_ids],
                )
            ]
        )

    def record_attempts(self, session: str, receiver: str, attempts: list[tuple[str, int]]) -> None:
        """Updates attempt counts of requeued messages."""
        self._tx(
            [
                (
                    "UPDATE messages SET attempts=? WHERE session=? AND receiver=? AND message_id=?",
                    [(a, session, receiver, m) for m, a in attempts],
                )
            ]
        )

    def record_dead(self, session: str, dead: list[DeadLetter], keep: int) -> None:
        """Deletes the mailbox rows, inserts dead-letter rows and trims to the newest ``keep``."""
        self._tx(
            [
                (
                    "DELETE FROM messages WHERE session=? AND receiver=? AND message_id=?",
                    [(session, d.receiver, d.envelope.message_id) for d in dead],
                ),
                (
                    f"INSERT INTO dead (session, receiver, attempts, reason, dead_at, {_ENV_COLS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (session, d.receiver, d.attempts, d.reason, d.dead_at, *_env_row(d.envelope))
                        for d in dead
                    ],
                ),
                (
                    "DELETE FROM dead WHERE session=? AND id NOT IN "
                    "(SELECT id FROM dead WHERE session=? ORDER BY id DESC LIMIT ?)",
                    (session, session, keep),
                ),
            ]
        )

    def delete_dead(self, session: str, count: int) -> None:
        """Deletes the oldest ``count`` dead letters of the session."""
        self._tx(
            [
                (
                    "DELETE FROM dead WHERE id IN (SELECT id FROM dead WHERE session=? ORDER BY id LIMIT ?)",
                    (session, count),
                )
            ]
        )

    def put_state(self, session: str, state: AgentState) -> None:
        """Upserts the agent's state row."""
        self._tx(
            [
                (
                    "INSERT OR REPLACE INTO states VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        session,
                        state.agent_id,
                        state.value,
                        state.content_type,
                        state.version,
                        state.updated_at,
                    ),
                )
            ]
        )

    def prune_dedup(self, session: str, seen_before: float) -> None:
        """Deletes dedup ids older than the window."""
        self._tx([("DELETE FROM dedup WHERE session=? AND seen_at<?", (session, seen_before))])

    def close(self) -> None:
        """Checkpoints nothing extra; closes the connection (the WAL is replayed on next open), releases the
        data dir."""
        self._db.close()
        self._dir_lock.unlock()
