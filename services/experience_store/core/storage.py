"""Durable storage of tables and items: in-memory (tests, ephemeral runs) or SQLite in WAL mode.

Why SQLite (see docs/experience_store.md): it ships with Python, its write-ahead log makes every committed
transaction survive a killed process (``synchronous=NORMAL``; ``FULL`` adds power-loss durability at an fsync
per commit), readers never block the writer, and ``VACUUM INTO`` takes a consistent snapshot from a read
transaction while inserts continue.

Every table operation (a batch of inserts, a sample, a priority update) is submitted as one operation and the
caller waits for its :class:`CommitTicket` before it is answered, so a confirmed insert, a returned sample's count
and an acknowledged priority update are all on disk. :class:`SqliteStorage` applies operations in submission
order on one writer thread and commits every operation that queued up while the previous transaction ran in one
transaction (group commit: one commit, and under ``FULL`` one fsync, for many callers), and copies its
write-ahead log into the database on a background thread instead of in the committing call.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from marti.errors import InternalError, InvalidArgumentError, MartiError, UnavailableError
from marti.plumbing.dir_lock import DirLock, is_storage_full, opening_database, storage_full_error
from marti.plumbing.fsync import fsync_path
from marti.types.experience import CheckpointResult

log = logging.getLogger(__name__)


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
        group_id, group_size: From the trajectory (a whole-groups sample takes a group's members together).
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
    group_id: str = ""
    group_size: int = 0


@dataclass(slots=True)
class TableRow:
    """A persisted table: its config (JSON) and counters."""

    name: str
    config_json: str
    counters: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class LoadedState:
    """Everything :meth:`Storage.load` restores: tables and item records in insertion order.

    ``max_key`` and ``max_seq`` are the highest item key and sequence number ever committed (0 = none), kept even
    when those items were deleted, so that keys are never reused after a restart.
    """

    tables: list[TableRow]
    items: list[ItemRecord]
    max_key: int = 0
    max_seq: int = 0


class CommitTicket:
    """Completion handle of one submitted storage operation.

    :meth:`wait` returns once the operation is committed (as durable as the storage promises) or raises the error
    that stopped it. Thread-safe; waiting twice is fine.
    """

    __slots__ = ("_done", "_error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._error: MartiError | None = None

    def finish(self, error: MartiError | None = None) -> None:
        """Mark the operation committed (``error`` None) or failed, and wake every waiter."""
        self._error = error
        self._done.set()

    @property
    def done(self) -> bool:
        """Whether the operation is committed or failed."""
        return self._done.is_set()

    @property
    def failed(self) -> bool:
        """Whether the operation is done and failed (False while it is not done)."""
        return self._done.is_set() and self._error is not None

    def wait(self) -> None:
        """Block until the operation is committed.

        Raises:
            InternalError: when the storage could not commit it.
            UnavailableError: when the storage was closed before it was committed.
        """
        self._done.wait()
        if self._error is not None:
            raise self._error


def _finished() -> CommitTicket:
    t = CommitTicket()
    t.finish()
    return t


class Storage(ABC):
    """Where tables and items live. Every method is thread-safe; each operation is atomic.

    Operations are applied in the order :meth:`submit` is called, so a caller that submits under a table's lock
    gets the table's order on disk, and waiting for an operation's ticket implies every operation submitted
    before it is committed too.
    """

    @abstractmethod
    def load(self) -> LoadedState:
        """Return the persisted tables and items."""

    @abstractmethod
    def save_table(self, name: str, config_json: str) -> None:
        """Persist a new table (or a table's new config); returns once committed."""

    @abstractmethod
    def submit(
        self,
        table: str,
        inserts: Sequence[tuple[ItemRecord, bytes]] = (),
        deletes: Sequence[int] = (),
        updates: Sequence[tuple[int, float, int]] = (),
        counters: dict[str, int] | None = None,
    ) -> CommitTicket:
        """Queue one atomic operation: inserts, deletes, ``(key, priority, times_sampled)`` updates and the
        table's counters. Does not wait for the commit; payloads of queued inserts are readable with
        :meth:`get_payloads` at once. Insert records are read at submission: later changes to them are stored
        only by later operations."""

    def commit(
        self,
        table: str,
        inserts: Sequence[tuple[ItemRecord, bytes]] = (),
        deletes: Sequence[int] = (),
        updates: Sequence[tuple[int, float, int]] = (),
        counters: dict[str, int] | None = None,
    ) -> None:
        """:meth:`submit` and wait for the commit.

        Raises:
            InternalError, UnavailableError: as :meth:`CommitTicket.wait`.
        """
        self.submit(table, inserts, deletes, updates, counters).wait()

    @abstractmethod
    def get_payloads(self, keys: Iterable[int]) -> dict[int, bytes]:
        """Return the payloads of the given keys (keys that do not exist are absent)."""

    @abstractmethod
    def checkpoint(self) -> CheckpointResult:
        """Fold the write-ahead log into the database and write a snapshot, without stopping writers."""

    def stats(self) -> dict[str, int]:
        """Counters of the storage's own work (SQLite: ``transactions``, ``operations``, ``wal_checkpoints``,
        ``queued``); empty for storages without a writer."""
        return {}

    @abstractmethod
    def close(self) -> None:
        """Commit what is queued, then release files and connections."""


class MemoryStorage(Storage):
    """Payloads in a dict; nothing survives the process. Operations apply at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._payloads: dict[int, bytes] = {}

    def load(self) -> LoadedState:
        return LoadedState([], [])

    def save_table(self, name: str, config_json: str) -> None:
        return None

    def submit(self, table, inserts=(), deletes=(), updates=(), counters=None) -> CommitTicket:  # noqa: D102
        with self._lock:
            for rec, payload in inserts:
                self._payloads[rec.key] = payload
            for key in deletes:
                self._payloads.pop(key, None)
        return _DONE

    def get_payloads(self, keys: Iterable[int]) -> dict[int, bytes]:
        with self._lock:
            return {k: self._payloads[k] for k in keys if k in self._payloads}

    def checkpoint(self) -> CheckpointResult:
        return CheckpointResult("", 0.0, 0)

    def close(self) -> None:
        with self._lock:
            self._payloads.clear()


_DONE = _finished()
#: Suffix of a snapshot being written (renamed without it once complete).
_PARTIAL = ".partial"


_NOT_WRITTEN = "no snapshot was written; every commit is still in the store's database"
_WRITTEN = (
    "the snapshot was written and is complete, but older snapshots beyond keep_snapshots may remain; every commit "
    "is still in the store's database"
)


def _snapshot_error(target: Path, exc: Exception, outcome: str = _NOT_WRITTEN) -> MartiError:
    """A failed checkpoint's error: ResourceExhaustedError when the disk is full, else InternalError; both name
    the snapshot ``target`` and the ``outcome`` (what was and was not written)."""
    if is_storage_full(exc):
        return storage_full_error("store snapshot", target, exc, outcome)
    return InternalError(f"store snapshot {target} failed ({exc}): {outcome}")


# Item metadata and payloads are separate tables, so that a sample's or a priority update's row changes rewrite
# small metadata pages only, and a restart reads metadata without touching payload pages.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS tables (
    name TEXT PRIMARY KEY, config TEXT NOT NULL, counters TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS items (
    key INTEGER PRIMARY KEY, table_name TEXT NOT NULL, seq INTEGER NOT NULL, priority REAL NOT NULL,
    times_sampled INTEGER NOT NULL, inserted_at REAL NOT NULL, episode_id TEXT NOT NULL, session TEXT NOT NULL,
    agent_id TEXT NOT NULL, role TEXT NOT NULL, policy_version INTEGER NOT NULL, created_at REAL NOT NULL,
    num_turns INTEGER NOT NULL, num_bytes INTEGER NOT NULL, group_id TEXT NOT NULL DEFAULT '',
    group_size INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS payloads (key INTEGER PRIMARY KEY, payload BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
# High-water marks of item keys and sequence numbers, raised in the transaction that inserts the items, so that a
# restart continues above them even when the items holding them were deleted (keys are never reused).
_RAISE_MARK = (
    "INSERT INTO counters(name, value) VALUES (?, ?) "
    "ON CONFLICT(name) DO UPDATE SET value = MAX(value, excluded.value)"
)
_V1_COLS = (
    "key, table_name, seq, priority, times_sampled, inserted_at, episode_id, session, agent_id, role, "
    "policy_version, created_at, num_turns, num_bytes"
)
_ITEM_COLS = _V1_COLS + ", group_id, group_size"
# Databases written before whole-groups samples lack the group columns; they are added with their defaults.
_MIGRATE_V2 = (
    "ALTER TABLE items ADD COLUMN group_id TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE items ADD COLUMN group_size INTEGER NOT NULL DEFAULT 0",
)
# Databases written before the payloads table existed kept the payload as the last column of ``items``.
_MIGRATE_V1 = f"""
CREATE TABLE payloads (key INTEGER PRIMARY KEY, payload BLOB NOT NULL);
INSERT INTO payloads(key, payload) SELECT key, payload FROM items;
CREATE TABLE items_v2 (
    key INTEGER PRIMARY KEY, table_name TEXT NOT NULL, seq INTEGER NOT NULL, priority REAL NOT NULL,
    times_sampled INTEGER NOT NULL, inserted_at REAL NOT NULL, episode_id TEXT NOT NULL, session TEXT NOT NULL,
    agent_id TEXT NOT NULL, role TEXT NOT NULL, policy_version INTEGER NOT NULL, created_at REAL NOT NULL,
    num_turns INTEGER NOT NULL, num_bytes INTEGER NOT NULL);
INSERT INTO items_v2({_V1_COLS}) SELECT {_V1_COLS} FROM items;
DROP TABLE items;
ALTER TABLE items_v2 RENAME TO items;
"""
_INSERT_ITEM = f"INSERT INTO items({_ITEM_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
_ROW_BYTES = 128  # what one metadata row counts towards an operation's size (group and checkpoint limits)
#: Page sizes, bytes, a new database may have.
PAGE_SIZES = (4096, 8192, 16384, 32768, 65536)
#: SQLite ``synchronous`` modes the store runs with: NORMAL survives kill -9, FULL also a power loss.
SYNCHRONOUS_MODES = ("NORMAL", "FULL")


class _Op:
    """One submitted operation (see :meth:`Storage.submit`); ``config`` set = a :meth:`save_table`.

    Insert rows are copied out of the records at submission, so later changes to the records (a sample, a
    priority update) reach the database only through their own operations.
    """

    __slots__ = ("table", "item_rows", "payload_rows", "deletes", "updates", "counters", "config", "nbytes",
                 "ticket")  # fmt: skip

    def __init__(self, table, inserts, deletes, updates, counters, config=None) -> None:
        self.table, self.deletes, self.updates, self.counters, self.config = (
            table, deletes, updates, counters, config,
        )  # fmt: skip
        self.item_rows = [
            (r.key, r.table, r.seq, r.priority, r.times_sampled, r.inserted_at, r.episode_id, r.session,
             r.agent_id, r.role, r.policy_version, r.created_at, r.num_turns, r.num_bytes, r.group_id,
             r.group_size)
            for r, _ in inserts
        ]  # fmt: skip
        self.payload_rows = [(r.key, p) for r, p in inserts]
        self.nbytes = sum(len(p) for _, p in inserts) + _ROW_BYTES * (
            len(inserts) + len(deletes) + len(updates) + 1
        )
        self.ticket = CommitTicket()


class SqliteStorage(Storage):
    """SQLite database ``<data_dir>/store.sqlite`` in WAL mode, snapshots in ``<data_dir>/snapshots/``.

    One writer thread owns the write connection: it takes every operation queued while its previous transaction
    ran (up to ``group_max_bytes``) and commits them in one transaction, then finishes their tickets. SQLite's
    automatic WAL checkpoint (which copies the log into the database inside a committing call) is off: after
    ``checkpoint_mib`` MiB of committed operations a background thread copies the log on its own connection, and
    the writer then folds in only what was written meanwhile, so the log is reused instead of growing.

    Args:
        data_dir: Folder for the database (created if missing).
        synchronous: ``NORMAL`` (survives kill -9; default) or ``FULL`` (also survives power loss).
        keep_snapshots: Number of snapshot files kept (>= 1; older ones are deleted).
        cache_mib: SQLite page cache size in MiB (>= 1).
        page_size: Page size in bytes of a new database (4096, 8192, 16384, 32768 or 65536); an existing
            database keeps the size it was created with.
        group_max_bytes: Largest group commit, in bytes of payload (plus 128 per row); one operation larger than
            this is committed alone (>= 1).
        checkpoint_mib: MiB of committed operations after which the write-ahead log is copied into the database
            in the background (> 0).

    Raises:
        InvalidArgumentError: naming a bad ``synchronous``, ``keep_snapshots``, ``cache_mib``, ``page_size``,
            ``group_max_bytes`` or ``checkpoint_mib``.
        FailedPreconditionError: another store holds ``data_dir`` (an exclusive lock on ``<data_dir>/.lock``
            until :meth:`close` or the process ends); the folder and the holder's pid are named.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        synchronous: str = "NORMAL",
        keep_snapshots: int = 2,
        cache_mib: int = 64,
        page_size: int = 16384,
        group_max_bytes: int = 64 * 1024 * 1024,
        checkpoint_mib: float = 32.0,
    ) -> None:
        if synchronous not in SYNCHRONOUS_MODES:
            raise InvalidArgumentError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        if keep_snapshots < 1:
            raise InvalidArgumentError(f"keep_snapshots must be >= 1, got {keep_snapshots}")
        if cache_mib < 1:
            raise InvalidArgumentError(f"cache_mib must be >= 1, got {cache_mib}")
        if page_size not in PAGE_SIZES:
            raise InvalidArgumentError(f"page_size must be one of {PAGE_SIZES}, got {page_size}")
        if group_max_bytes < 1:
            raise InvalidArgumentError(f"group_max_bytes must be >= 1, got {group_max_bytes}")
        if not checkpoint_mib > 0:
            raise InvalidArgumentError(f"checkpoint_mib must be > 0, got {checkpoint_mib}")
        self.data_dir = Path(data_dir)
        self._dir_lock = DirLock(self.data_dir, "store data dir", advice="give this store another --data-dir")
        self._dir_lock.lock()
        self.path = self.data_dir / "store.sqlite"
        self.snapshot_dir = self.data_dir / "snapshots"
        self.keep_snapshots = keep_snapshots
        self.group_max_bytes = group_max_bytes
        self.checkpoint_bytes = int(checkpoint_mib * 1024 * 1024)
        self._synchronous = synchronous
        self._ckpt_lock = threading.Lock()
        with opening_database(self.path, "store database", self._dir_lock):
            self._wconn = self._connect(cache_mib, page_size)
            self._wconn.execute("PRAGMA wal_autocheckpoint=0")
            self._migrate()
            self._rconn = self._connect(cache_mib)
        self._rlock = threading.Lock()
        # queue of operations, payloads not yet committed, counters; all under _cond
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[_Op] = deque()
        self._pending: dict[int, bytes] = {}
        self._closing = False
        self._stats = {"transactions": 0, "operations": 0, "wal_checkpoints": 0}
        self._write_lock = threading.Lock()  # held by the writer while it applies a group
        self._since_ckpt = 0
        self._bg_state = "idle"  # idle -> running -> done (the writer then folds in the tail) -> idle
        self._bg_wanted = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="store-writer", daemon=True)
        self._bg = threading.Thread(target=self._checkpoint_loop, name="store-wal-checkpoint", daemon=True)
        self._writer.start()
        self._bg.start()

    def _connect(self, cache_mib: int = 8, page_size: int | None = None) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=60.0)
        if page_size is not None:
            conn.execute(f"PRAGMA page_size={page_size}")  # only takes effect on a new database
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute(f"PRAGMA cache_size=-{cache_mib * 1024}")
        return conn

    def _migrate(self) -> None:
        conn = self._wconn
        cols = [r[1] for r in conn.execute("PRAGMA table_info(items)")]
        if "payload" in cols:
            log.info("moving payloads of %s into their own table", self.path)
            conn.execute("BEGIN IMMEDIATE")
            try:
                for stmt in _MIGRATE_V1.strip().split(";"):
                    if stmt.strip():
                        conn.execute(stmt)
                conn.execute("COMMIT")
            except sqlite3.Error as e:
                conn.execute("ROLLBACK")
                raise InternalError(f"could not migrate {self.path}: {e}") from e
        conn.executescript(_SCHEMA)
        if "group_id" not in [r[1] for r in conn.execute("PRAGMA table_info(items)")]:
            for stmt in _MIGRATE_V2:
                conn.execute(stmt)

    @property
    def page_size(self) -> int:
        """Page size of the database file in bytes."""
        with self._rlock:
            return self._rconn.execute("PRAGMA page_size").fetchone()[0]

    def load(self) -> LoadedState:
        with self._rlock:
            tables = [
                TableRow(name, cfg, json.loads(counters))
                for name, cfg, counters in self._rconn.execute("SELECT name, config, counters FROM tables")
            ]
            rows = self._rconn.execute(f"SELECT {_ITEM_COLS} FROM items ORDER BY seq").fetchall()
            marks = dict(self._rconn.execute("SELECT name, value FROM counters").fetchall())
        items = [ItemRecord(*row) for row in rows]
        # a database written before the marks existed: its items are the best lower bound there is
        max_key = max([marks.get("max_key", 0), *(r.key for r in items)])
        max_seq = max([marks.get("max_seq", 0), *(r.seq for r in items)])
        return LoadedState(tables, items, max_key, max_seq)

    def save_table(self, name: str, config_json: str) -> None:
        self._enqueue(_Op(name, (), (), (), None, config_json)).wait()

    def submit(self, table, inserts=(), deletes=(), updates=(), counters=None) -> CommitTicket:  # noqa: D102
        if not (inserts or deletes or updates or counters is not None):
            return _DONE
        return self._enqueue(_Op(table, inserts, deletes, updates, counters))

    def _enqueue(self, op: _Op) -> CommitTicket:
        with self._cond:
            if self._closing:
                op.ticket.finish(UnavailableError(f"storage {self.path} is closed"))
                return op.ticket
            self._pending.update(op.payload_rows)
            self._queue.append(op)
            self._cond.notify()
        return op.ticket

    # ---- writer thread ----------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return  # closing, everything committed
                group = [self._queue.popleft()]
                size = group[0].nbytes
                while self._queue and size + self._queue[0].nbytes <= self.group_max_bytes:
                    op = self._queue.popleft()
                    group.append(op)
                    size += op.nbytes
            with self._write_lock:
                errors = self._commit_group(group)
            with self._cond:
                for op in group:
                    for key, _ in op.payload_rows:
                        self._pending.pop(key, None)
            for op, err in zip(group, errors, strict=True):
                op.ticket.finish(err)
            self._after_commit(size)

    def _commit_group(self, group: list[_Op]) -> list[MartiError | None]:
        """Commit the group in one transaction; if that fails, each operation alone (so one bad operation
        fails only its own caller). Never raises: the writer thread must outlive any bad operation."""
        try:
            self._transaction(group)
            return [None] * len(group)
        except Exception as e:  # sqlite3.Error or a bad value: reported to the callers
            if len(group) == 1:
                return [self._commit_error(group[0].table, e)]
        errors: list[MartiError | None] = []
        for op in group:
            try:
                self._transaction([op])
                errors.append(None)
            except Exception as e:
                errors.append(self._commit_error(op.table, e))
        return errors

    def _commit_error(self, table: str, exc: Exception) -> MartiError:
        """A failed commit's error for its caller: ResourceExhaustedError when the disk is full, else InternalError;
        both name the table."""
        if is_storage_full(exc):
            outcome = (
                "this commit did not reach the database (its inserted items leave the table again and the items "
                "it evicted come back: send them again once there is room; the items an insert committed before "
                "it waited for room mid-call are in, with their keys; what a sample, delete or priority update "
                "changed stays in memory until a restart undoes it)"
            )
            return storage_full_error(f"table {table!r}: store database", self.path, exc, outcome)
        return InternalError(f"storage commit failed for table {table!r}: {exc}")

    def _transaction(self, ops: list[_Op]) -> None:
        conn = self._wconn
        # counters are cumulative: only the last of a table in a transaction needs writing (unless a config row,
        # which resets the table's row, comes in between)
        last_counters = {op.table: i for i, op in enumerate(ops) if op.counters is not None}
        any_config = any(op.config is not None for op in ops)
        conn.execute("BEGIN")
        try:
            for i, op in enumerate(ops):
                if op.config is not None:
                    conn.execute(
                        "INSERT OR REPLACE INTO tables(name, config) VALUES (?, ?)", (op.table, op.config)
                    )
                if op.item_rows:
                    conn.executemany(_INSERT_ITEM, op.item_rows)
                    conn.executemany("INSERT INTO payloads(key, payload) VALUES (?, ?)", op.payload_rows)
                    conn.execute(_RAISE_MARK, ("max_key", max(r[0] for r in op.item_rows)))
                    conn.execute(_RAISE_MARK, ("max_seq", max(r[2] for r in op.item_rows)))
                if op.updates:
                    conn.executemany(
                        "UPDATE items SET priority = ?, times_sampled = ? WHERE key = ?",
                        [(p, n, k) for k, p, n in op.updates],
                    )
                if op.deletes:
                    keys = [(k,) for k in op.deletes]
                    conn.executemany("DELETE FROM items WHERE key = ?", keys)
                    conn.executemany("DELETE FROM payloads WHERE key = ?", keys)
                if op.counters is not None and (any_config or last_counters[op.table] == i):
                    conn.execute(
                        "UPDATE tables SET counters = ? WHERE name = ?", (json.dumps(op.counters), op.table)
                    )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        with self._cond:
            self._stats["transactions"] += 1
            self._stats["operations"] += len(ops)

    def _after_commit(self, size: int) -> None:
        """Start a background WAL checkpoint every ``checkpoint_bytes``; once it is done, fold in the tail of the
        log written meanwhile (short), so that the next transaction starts the log over."""
        self._since_ckpt += size
        if self._bg_state == "done":
            try:
                self._wconn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.Error as e:
                log.warning("WAL checkpoint failed (retried later): %s", e)
            self._bg_state = "idle"
        if self._bg_state == "idle" and self._since_ckpt >= self.checkpoint_bytes:
            self._since_ckpt = 0
            self._bg_state = "running"
            self._bg_wanted.set()

    def _checkpoint_loop(self) -> None:
        conn = self._connect()
        try:
            while True:
                self._bg_wanted.wait()
                self._bg_wanted.clear()
                if self._closing:
                    return
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                    with self._cond:
                        self._stats["wal_checkpoints"] += 1
                except sqlite3.Error as e:
                    log.warning("background WAL checkpoint failed (retried later): %s", e)
                finally:
                    self._bg_state = "done"
        finally:
            conn.close()

    # ---- reads, snapshots -------------------------------------------------------------------------------

    def get_payloads(self, keys: Iterable[int]) -> dict[int, bytes]:
        keys = list(keys)
        if not keys:
            return {}
        out: dict[int, bytes] = {}
        with self._cond:  # queued inserts first; a key missing here was committed before this check
            for k in keys:
                p = self._pending.get(k)
                if p is not None:
                    out[k] = p
        rest = [k for k in keys if k not in out]
        if rest:
            marks = ",".join("?" * len(rest))
            with self._rlock:
                out.update(
                    self._rconn.execute(f"SELECT key, payload FROM payloads WHERE key IN ({marks})", rest)
                )
        return out

    def stats(self) -> dict[str, int]:
        """``transactions`` committed, ``operations`` they held, background ``wal_checkpoints`` run, and
        operations ``queued`` for the writer now."""
        with self._cond:
            return {**self._stats, "queued": len(self._queue)}

    def checkpoint(self) -> CheckpointResult:
        """Passive WAL checkpoint plus ``VACUUM INTO`` a snapshot, on a separate connection.

        Both run as readers of the WAL database, so inserts and samples proceed while the checkpoint runs (a
        passive checkpoint never waits for writers). The snapshot holds every operation committed before it
        started. It is written as ``snapshot-<ns>.sqlite.partial``, synced (``fsync``), renamed once complete and
        its folder synced, so a file named ``snapshot-*.sqlite`` is always a complete store, after a killed
        process and, with the syncs, after a power loss (the rename cannot reach the disk before the data); what
        a failed or killed checkpoint left is removed (then, or by the next checkpoint).

        Raises:
            ResourceExhaustedError: the disk is full, naming the snapshot (no partial snapshot is left; the
                store's data is untouched). InternalError: any other storage failure, naming the snapshot (also
                one after the snapshot was written: reading its size or removing snapshots beyond
                ``keep_snapshots``, said so).
        """
        with self._ckpt_lock:
            start = time.monotonic()
            target = self.snapshot_dir / f"snapshot-{time.time_ns()}.sqlite"
            try:
                self._write_snapshot(target)
            except (sqlite3.Error, OSError) as e:
                self._clear_failed_snapshot(target, e)
                raise _snapshot_error(target, e) from None
            try:
                size = target.stat().st_size
                for old in sorted(self.snapshot_dir.glob("snapshot-*.sqlite"))[: -self.keep_snapshots]:
                    old.unlink(missing_ok=True)
            except OSError as e:
                raise _snapshot_error(target, e, _WRITTEN) from None
            return CheckpointResult(str(target), time.monotonic() - start, size)

    def _write_snapshot(self, target: Path) -> None:
        """Write the snapshot ``target`` through its ``.partial`` file, synced before the rename and its folder
        after it (``VACUUM INTO`` does not sync its output). Raises sqlite3.Error or OSError."""
        partial = target.with_name(target.name + _PARTIAL)
        conn = self._connect()
        try:
            self.snapshot_dir.mkdir(exist_ok=True)
            self._clear_partial_snapshots()  # what a checkpoint killed mid-write left
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            conn.execute("VACUUM INTO ?", (str(partial),))
        finally:
            conn.close()
        fsync_path(partial)
        os.replace(partial, target)
        fsync_path(self.snapshot_dir)

    def _clear_failed_snapshot(self, target: Path, error: Exception) -> None:
        """Remove what a failed checkpoint wrote: its partial snapshot, and ``target`` when only the folder's sync
        after the rename failed. A failure to remove them is logged (with the ``error`` that failed the
        checkpoint), so that it cannot hide that error; the next checkpoint removes a partial one again."""
        try:
            self._clear_partial_snapshots()
            target.unlink(missing_ok=True)
        except OSError as e:
            log.warning("could not remove what the failed checkpoint of %s wrote (%s): %s", target, error, e)

    def _clear_partial_snapshots(self) -> None:
        """Remove the snapshots a checkpoint began and did not finish (``*.sqlite.partial`` and its journal)."""
        for path in self.snapshot_dir.glob(f"snapshot-*.sqlite{_PARTIAL}*"):
            path.unlink(missing_ok=True)

    def close(self) -> None:
        """Commit every queued operation, stop the writer and checkpoint threads, close the connections.
        Operations submitted afterwards fail with UnavailableError."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        self._writer.join()
        self._bg_wanted.set()
        self._bg.join()
        with self._rlock:
            self._rconn.close()
        self._wconn.close()
        self._dir_lock.unlock()
