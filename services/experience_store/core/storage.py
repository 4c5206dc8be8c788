"""Durable storage of tables and items: in-memory (tests, ephemeral runs) or SQLite in WAL mode.

Why SQLite (see docs/experience_store.md): it ships with Python, its write-ahead log makes every committed
transaction survive a killed process (``synchronous=NORMAL``; ``FULL`` adds power-loss durability at an fsync
per commit), readers never block the writer, and ``VACUUM INTO`` takes a consistent snapshot from a read
transaction while inserts continue. Each table operation (a batch of inserts, a sample, a priority update) is one
transaction, committed before the caller is answered, so a confirmed insert, a returned sample's count and an
acknowledged priority update are all on disk.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from marti.errors import InternalError, InvalidArgumentError
from marti.experience_types import CheckpointResult


@dataclass(slots=True)
class ItemRecord:
    """An item's metadata, kept in memory; its payload stays in storage.

    Attributes:
        key: Unique, never reused item key.
        table: Owning table name.
        seq: Insertion sequence number within the store (larger = newer).
        priority: Current priority (finite, >= 0).
        times_sampled: How often the item has been returned by a sample.
        inserted_at: Unix time (s) of the insert.
        episode_id, session, agent_id, role, policy_version, created_at: From the trajectory.
        num_turns: Number of turns of the trajectory.
        num_bytes: Stored payload size in bytes (compressed).
    """

    key: int
    table: str
    seq: int
    priority: float
    times_sampled: int
    inserted_at: float
    episode_id: str
    session: str
    agent_id: str
    role: str
    policy_version: int
    created_at: float
    num_turns: int
    num_bytes: int


@dataclass(slots=True)
class TableRow:
    """A persisted table: its config (JSON) and counters."""

    name: str
    config_json: str
    counters: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class LoadedState:
    """Everything :meth:`Storage.load` restores: tables and item records in insertion order."""

    tables: list[TableRow]
    items: list[ItemRecord]


class Storage(ABC):
    """Where tables and items live. Every method is thread-safe; each ``commit`` is atomic."""

    @abstractmethod
    def load(self) -> LoadedState:
        """Return the persisted tables and items."""

    @abstractmethod
    def save_table(self, name: str, config_json: str) -> None:
        """Persist a new table."""

    @abstractmethod
    def commit(
        self,
        table: str,
        inserts: Sequence[tuple[ItemRecord, bytes]] = (),
        deletes: Sequence[int] = (),
        updates: Sequence[tuple[int, float, int]] = (),
        counters: dict[str, int] | None = None,
    ) -> None:
        """Atomically apply inserts, deletes, ``(key, priority, times_sampled)`` updates and table counters."""

    @abstractmethod
    def get_payloads(self, keys: Iterable[int]) -> dict[int, bytes]:
        """Return the payloads of the given keys (keys that do not exist are absent)."""

    @abstractmethod
    def checkpoint(self) -> CheckpointResult:
        """Fold the write-ahead log into the database and write a snapshot, without stopping writers."""

    @abstractmethod
    def close(self) -> None:
        """Release files and connections."""


class MemoryStorage(Storage):
    """Payloads in a dict; nothing survives the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._payloads: dict[int, bytes] = {}

    def load(self) -> LoadedState:
        return LoadedState([], [])

    def save_table(self, name: str, config_json: str) -> None:
        return None

    def commit(self, table, inserts=(), deletes=(), updates=(), counters=None) -> None:  # noqa: D102
        with self._lock:
            for rec, payload in inserts:
                self._payloads[rec.key] = payload
            for key in deletes:
                self._payloads.pop(key, None)

    def get_payloads(self, keys: Iterable[int]) -> dict[int, bytes]:
        with self._lock:
            return {k: self._payloads[k] for k in keys if k in self._payloads}

    def checkpoint(self) -> CheckpointResult:
        return CheckpointResult("", 0.0, 0)

    def close(self) -> None:
        with self._lock:
            self._payloads.clear()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tables (
    name TEXT PRIMARY KEY, config TEXT NOT NULL, counters TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS items (
    key INTEGER PRIMARY KEY, table_name TEXT NOT NULL, seq INTEGER NOT NULL, priority REAL NOT NULL,
    times_sampled INTEGER NOT NULL, inserted_at REAL NOT NULL, episode_id TEXT NOT NULL, session TEXT NOT NULL,
    agent_id TEXT NOT NULL, role TEXT NOT NULL, policy_version INTEGER NOT NULL, created_at REAL NOT NULL,
    num_turns INTEGER NOT NULL, num_bytes INTEGER NOT NULL, payload BLOB NOT NULL);
"""
_ITEM_COLS = (
    "key, table_name, seq, priority, times_sampled, inserted_at, episode_id, session, agent_id, role, "
    "policy_version, created_at, num_turns, num_bytes"
)


class SqliteStorage(Storage):
    """SQLite database ``<data_dir>/store.sqlite`` in WAL mode, snapshots in ``<data_dir>/snapshots/``.

    Args:
        data_dir: Folder for the database (created if missing).
        synchronous: ``NORMAL`` (survives kill -9; default) or ``FULL`` (also survives power loss).
        keep_snapshots: Number of snapshot files kept (>= 1; older ones are deleted).
        cache_mib: SQLite page cache size in MiB.

    Raises:
        InvalidArgumentError: naming a bad ``synchronous`` or ``keep_snapshots``.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        synchronous: str = "NORMAL",
        keep_snapshots: int = 2,
        cache_mib: int = 64,
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise InvalidArgumentError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        if keep_snapshots < 1:
            raise InvalidArgumentError(f"keep_snapshots must be >= 1, got {keep_snapshots}")
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.data_dir / "store.sqlite"
        self.snapshot_dir = self.data_dir / "snapshots"
        self.keep_snapshots = keep_snapshots
        self._synchronous = synchronous
        self._lock = threading.RLock()
        self._ckpt_lock = threading.Lock()
        self._conn = self._connect(cache_mib)
        self._conn.executescript(_SCHEMA)

    def _connect(self, cache_mib: int = 8) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=60.0)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute(f"PRAGMA cache_size=-{cache_mib * 1024}")
        return conn

    def load(self) -> LoadedState:
        with self._lock:
            tables = [
                TableRow(name, cfg, json.loads(counters))
                for name, cfg, counters in self._conn.execute("SELECT name, config, counters FROM tables")
            ]
            rows = self._conn.execute(f"SELECT {_ITEM_COLS} FROM items ORDER BY seq").fetchall()
        return LoadedState(tables, [ItemRecord(*row) for row in rows])

    def save_table(self, name: str, config_json: str) -> None:
        with self._lock:
            self._conn.execute(
                "INSERT OR REPLACE INTO tables(name, config) VALUES (?, ?)", (name, config_json)
            )

    def commit(self, table, inserts=(), deletes=(), updates=(), counters=None) -> None:  # noqa: D102
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN")
            try:
                if inserts:
                    conn.executemany(
                        f"INSERT INTO items({_ITEM_COLS}, payload) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        [
                            (
                                r.key,
                                r.table,
                                r.seq,
                                r.priority,
                                r.times_sampled,
                                r.inserted_at,
                                r.episode_id,
                                r.session,
                                r.agent_id,
                                r.role,
                                r.policy_version,
                                r.created_at,
                                r.num_turns,
                                r.num_bytes,
                                payload,
                            )
                            for r, payload in inserts
                        ],
                    )
                if updates:
                    conn.executemany(
                        "UPDATE items SET priority = ?, times_sampled = ? WHERE key = ?",
                        [(p, n, k) for k, p, n in updates],
                    )
                if deletes:
                    conn.executemany("DELETE FROM items WHERE key = ?", [(k,) for k in deletes])
                if counters is not None:
                    conn.execute(
                        "UPDATE tables SET counters = ? WHERE name = ?", (json.dumps(counters), table)
                    )
                conn.execute("COMMIT")
            except sqlite3.Error as e:
                conn.execute("ROLLBACK")
                raise InternalError(f"storage commit failed for table {table!r}: {e}") from e

    def get_payloads(self, keys: Iterable[int]) -> dict[int, bytes]:
        keys = list(keys)
        if not keys:
            return {}
        marks = ",".join("?" * len(keys))
        with self._lock:
            rows = self._conn.execute(
                f"SELECT key, payload FROM items WHERE key IN ({marks})", keys
            ).fetchall()
        return dict(rows)

    def checkpoint(self) -> CheckpointResult:
        """Passive WAL checkpoint plus ``VACUUM INTO`` a snapshot, on a separate connection.

        Both run as readers of the WAL database, so inserts and samples on the main connection proceed while the
        checkpoint runs (a passive checkpoint never waits for writers).
        """
        with self._ckpt_lock:
            start = time.monotonic()
            self.snapshot_dir.mkdir(exist_ok=True)
            target = self.snapshot_dir / f"snapshot-{time.time_ns()}.sqlite"
            conn = self._connect()
            try:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                conn.execute("VACUUM INTO ?", (str(target),))
            finally:
                conn.close()
            snaps = sorted(self.snapshot_dir.glob("snapshot-*.sqlite"))
            for old in snaps[: -self.keep_snapshots]:
                old.unlink(missing_ok=True)
            return CheckpointResult(str(target), time.monotonic() - start, target.stat().st_size)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
