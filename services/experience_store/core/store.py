"""The experience store: named tables over one storage, with the agents' sharing semantics.

``ExperienceStore`` owns the tables and the storage, restores both on start, allocates item keys that are never
reused, runs periodic snapshots, and answers cross-table queries (every item of an episode or a session).
:class:`LocalExperienceClient` wraps it with the same dataclass-level API as the gRPC SDK, for in-process use.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from marti.codec.chunks import (
    DEFAULT_CHUNK_BYTES,
    JsonTrajectoryCodec,
    TrajectoryCodec,
    decode_payload,
    encode_payload,
)
from marti.errors import AlreadyExistsError, InvalidArgumentError, MartiError, NotFoundError
from marti.types.experience import (
    CheckpointResult,
    SampledTrajectory,
    SampleFilter,
    TableConfig,
    parse_table_config,
    table_config_errors,
)
from marti.types.trajectory import AgentTurn, Trajectory, merge_by_step, summarize

from .storage import ItemRecord, MemoryStorage, Storage
from .table import TAKEN_IDS_WINDOW, Table
from .table_records import Duplicate, NewItem, SampledItem
from .table_sampling import NO_FILTER

log = logging.getLogger(__name__)

DEFAULT_TABLE = "default"


def default_table_config(name: str = DEFAULT_TABLE) -> TableConfig:
    """The table every store has unless told otherwise: uniform sampling, FIFO eviction at 1M items."""
    return parse_table_config({"name": name, "preset": "uniform", "max_size": 1_000_000})


def _flat(data: dict, prefix: str = "") -> dict[str, object]:
    """``{dotted key: value}`` of a nested dict (``rate_limiter.kind``)."""
    out: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_conflict(existing: TableConfig, asked: TableConfig) -> str:
    """The refusal of creating table ``asked.name`` with a config other than the one it has.

    Returns:
        E.g. ``table 'neg5/seller' already exists with another config: max_policy_lag is 0 there, 1 asked; ...``
        and the ways out (the store keeps a table's config while it holds the table).
    """
    old, new = _flat(existing.model_dump(mode="json")), _flat(asked.model_dump(mode="json"))
    diffs = [
        f"{k} is {old.get(k)!r} there, {new.get(k)!r} asked" for k in sorted(old) if old.get(k) != new.get(k)
    ]
    return (
        f"table {asked.name!r} already exists with another config: {'; '.join(diffs)}. The store keeps a table's "
        "config while it holds it: use another table name, or restart the store with a --config tables YAML that "
        f"defines {asked.name!r} with the new config (its items are kept) or with another --data-dir"
    )


@dataclass(frozen=True, slots=True)
class ItemQuery:
    """Selects items across tables for :meth:`ExperienceStore.query`. Empty fields match everything.

    Attributes:
        episode_id: Only this episode.
        session: Only this session.
        agent_id: Only this agent.
        min_policy_version: Only ``policy_version >= min_policy_version``.
        policy_version: Only exactly this policy version (-1 = any).
        tables: Only these tables (empty = all).
    """

    episode_id: str = ""
    session: str = ""
    agent_id: str = ""
    min_policy_version: int = 0
    policy_version: int = -1
    tables: tuple[str, ...] = ()

    def matches(self, r: ItemRecord) -> bool:
        """Whether an item record matches."""
        return (
            (not self.episode_id or r.episode_id == self.episode_id)
            and (not self.session or r.session == self.session)
            and (not self.agent_id or r.agent_id == self.agent_id)
            and r.policy_version >= self.min_policy_version
            and (self.policy_version < 0 or r.policy_version == self.policy_version)
        )


def _stored_config(name: str, config_json: str) -> TableConfig:
    """The config a data dir holds for table ``name``.

    Raises:
        InvalidArgumentError: the stored config is one this version refuses (written by an older, laxer one, e.g.
            an infinite ``priority_exponent``), naming the table, each bad field and value, and the fix: a
            ``--config`` that gives the table a valid config, which replaces the stored one.
    """
    try:
        return TableConfig.model_validate_json(config_json)
    except ValidationError as e:
        raise InvalidArgumentError(
            f"the stored config of table {name!r} is refused by this version: {table_config_errors(e)}; start "
            f"the store with --config giving table {name!r} a valid config (it replaces the stored one)"
        ) from None


class ExperienceStore:
    """Tables of experience over one storage.

    Args:
        storage: Where data lives (default: in memory).
        tables: Tables to create; a table of the same name restored from storage takes this config (items are
            re-indexed under it).
        default_table: Name of a uniform table created when missing (None = no default table).
        seed: Seeds every table's sampler (tests); None = OS entropy.
        max_query_items: Most items one :meth:`query` may return.
        taken_ids_window: Per table, taken ids remembered for idempotent inserts (``(episode_id, agent_id)`` of
            taken items, deleted episode ids; >= 0; in memory: a restart forgets them).

    A restored table holding more than its ``max_size`` or ``max_bytes`` allows (the store restarted with smaller
    ones) is brought within them at once: an ``evict`` table evicts the excess in its remover's order, logging a
    warning that names the table and the count; a ``block`` table is refused.

    Raises:
        InvalidArgumentError: on a bad persisted or given table config, or a ``block`` table restored over its
            ``max_size`` or ``max_bytes`` (naming the table, what it holds and the limits).
    """

    def __init__(
        self,
        storage: Storage | None = None,
        tables: Sequence[TableConfig] = (),
        default_table: str | None = DEFAULT_TABLE,
        seed: int | None = None,
        max_query_items: int = 1_000_000,
        taken_ids_window: int = TAKEN_IDS_WINDOW,
    ) -> None:
        self.storage = storage or MemoryStorage()
        self.taken_ids_window = taken_ids_window
        self.max_query_items = max_query_items
        self._seed = seed
        self._lock = threading.Lock()
        self._tables: dict[str, Table] = {}
        self._stop = threading.Event()
        self._snapshot_thread: threading.Thread | None = None
        state = self.storage.load()
        self._next_key: Callable[[], int] = itertools.count(state.max_key + 1).__next__
        self._next_seq: Callable[[], int] = itertools.count(state.max_seq + 1).__next__
        given = {t.name: t for t in tables}
        by_table: dict[str, list[ItemRecord]] = {}
        for rec in state.items:
            by_table.setdefault(rec.table, []).append(rec)
        for row in state.tables:
            cfg = given.pop(row.name, None) or _stored_config(row.name, row.config_json)
            table = self._new_table(cfg, row.counters)
            table.restore(by_table.pop(row.name, []))
            self._fit(table)  # before the new config is saved: a refused one leaves the stored one as it was
            if cfg.model_dump_json() != row.config_json:
                self.storage.save_table(cfg.name, cfg.model_dump_json())
        for cfg in given.values():
            self._add(cfg)
        if default_table and default_table not in self._tables:
            self._add(default_table_config(default_table))
        if by_table:
            log.warning("items of unknown tables ignored: %s", sorted(by_table))

    @staticmethod
    def _fit(table: Table) -> None:
        """Evict a restored table's items beyond its (smaller) limits now, with a warning that names the table
        and the count (:meth:`Table.fit_to_limits`; a ``block`` table is refused there)."""
        held = len(table)
        evicted = table.fit_to_limits()
        if evicted:
            log.warning(
                "table %r held %d items over its limits (max_size %d, max_bytes %d) when restored: evicted %d by "
                "its remover %s",
                table.name, held, table.config.max_size, table.config.max_bytes, evicted, table.config.remover,
            )  # fmt: skip

    def _new_table(self, cfg: TableConfig, counters: dict[str, int] | None = None) -> Table:
        seed = None if self._seed is None else hash((self._seed, cfg.name)) & 0xFFFFFFFF
        table = Table(
            cfg, self.storage, self._next_key, self._next_seq, seed=seed, counters=counters,
            taken_ids_window=self.taken_ids_window,
        )  # fmt: skip
        self._tables[cfg.name] = table
        return table

    def _add(self, cfg: TableConfig) -> Table:
        self.storage.save_table(cfg.name, cfg.model_dump_json())
        return self._new_table(cfg)

    # ---- tables -----------------------------------------------------------------------------------------

    def create_table(self, config: TableConfig) -> Table:
        """Create a table; creating one that exists with the same config is a no-op.

        Raises:
            AlreadyExistsError: when a table of that name exists with another config; the message names each
                differing field with both values (:func:`config_conflict`) and what to do.
        """
        with self._lock:
            existing = self._tables.get(config.name)
            if existing is not None:
                if existing.config == config:
                    return existing
                raise AlreadyExistsError(config_conflict(existing.config, config))
            return self._add(config)

    def table(self, name: str) -> Table:
        """Return a table by name.

        Raises:
            NotFoundError: naming the table and the existing ones.
        """
        try:
            return self._tables[name]
        except KeyError:
            raise NotFoundError(f"unknown table {name!r}; tables: {sorted(self._tables)}") from None

    def table_names(self) -> list[str]:
        """Return the table names, sorted."""
        return sorted(self._tables)

    # ---- data -------------------------------------------------------------------------------------------

    def insert(
        self,
        table: str,
        items: Sequence[NewItem],
        timeout_s: float,
        abandoned: threading.Event | None = None,
    ) -> list[int | Duplicate | MartiError]:
        """Insert into a table; see :meth:`Table.insert` (``abandoned``: set, then :meth:`notify`, when the
        caller went away). Raises NotFoundError for an unknown table."""
        return self.table(table).insert(items, timeout_s, abandoned)

    def sample(
        self,
        table: str,
        num_samples: int,
        timeout_s: float,
        filt: SampleFilter = NO_FILTER,
        current_policy_version: int | None = None,
    ) -> list[SampledItem]:
        """Sample from a table; see :meth:`Table.sample`. Raises NotFoundError for an unknown table."""
        return self.table(table).sample(num_samples, timeout_s, filt, current_policy_version)

    def delete(self, table: str, episode_ids: Sequence[str]) -> int:
        """Delete a table's items of these episodes; see :meth:`Table.delete`. Raises NotFoundError for an unknown
        table."""
        return self.table(table).delete(episode_ids)

    def reset(self, table: str) -> int:
        """Empty a table and start it over; see :meth:`Table.reset`. Raises NotFoundError for an unknown table."""
        return self.table(table).reset()

    def update_priorities(self, table: str, updates: dict[int, float]) -> tuple[int, int]:
        """Update priorities; see :meth:`Table.update_priorities`."""
        return self.table(table).update_priorities(updates)

    def query(self, q: ItemQuery) -> list[tuple[ItemRecord, bytes]]:
        """Return every matching item with its payload, across tables, in insertion order.

        Raises:
            NotFoundError: for an unknown table in ``q.tables``.
            InvalidArgumentError: when more than ``max_query_items`` items match.
        """
        tables = [self.table(n) for n in q.tables] if q.tables else list(self._tables.values())
        recs = sorted((r for t in tables for r in t.records(q.matches)), key=lambda r: r.seq)
        if len(recs) > self.max_query_items:
            raise InvalidArgumentError(
                f"query matches {len(recs)} items, more than max_query_items={self.max_query_items}; narrow it"
            )
        payloads = self.storage.get_payloads(r.key for r in recs)
        return [(r, payloads[r.key]) for r in recs if r.key in payloads]

    # ---- durability -------------------------------------------------------------------------------------

    def checkpoint(self) -> CheckpointResult:
        """Write a snapshot without stopping inserts and samples (see :meth:`Storage.checkpoint`)."""
        return self.storage.checkpoint()

    def start_snapshots(self, interval_s: float) -> None:
        """Take a checkpoint every ``interval_s`` seconds in a background thread (no-op when <= 0). A failed one is
        logged (any exception, with its traceback when it is not a MartiError) and the next is taken at the next
        interval: the thread runs until :meth:`close`."""
        if interval_s <= 0 or self._snapshot_thread is not None:
            return

        def loop() -> None:
            while not self._stop.wait(interval_s):
                try:
                    self.checkpoint()
                except MartiError as e:  # keep snapshotting; the WAL still holds every commit
                    log.error("periodic checkpoint failed: %s", e)
                except Exception:  # a bug must not end the thread either: later snapshots may still succeed
                    log.exception("periodic checkpoint failed unexpectedly")

        self._snapshot_thread = threading.Thread(target=loop, name="store-snapshots", daemon=True)
        self._snapshot_thread.start()

    def notify(self) -> None:
        """Wake every caller waiting on any table (each checks its condition again, see :meth:`Table.notify`)."""
        for t in list(self._tables.values()):
            t.notify()

    def close(self) -> None:
        """Stop snapshots, end every waiting insert and sample (UnavailableError) and close storage."""
        self._stop.set()
        if self._snapshot_thread is not None:
            self._snapshot_thread.join(timeout=30)
        for t in self._tables.values():
            t.close()  # waiting inserts and samples end now with UnavailableError
        self.storage.close()


class LocalExperienceClient:
    """The SDK's API on an in-process :class:`ExperienceStore` (no network).

    Args:
        agent_id: Agent on whose behalf trajectories are shared (filled in when a trajectory has none).
        store: The store.
        codec: Trajectory serialization (JSON by default).
        chunk_bytes: Payload chunk size in bytes.
    """

    def __init__(
        self,
        agent_id: str,
        store: ExperienceStore,
        codec: TrajectoryCodec | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    ) -> None:
        self.agent_id = agent_id
        self.store = store
        self.codec = codec or JsonTrajectoryCodec()
        self.chunk_bytes = chunk_bytes

    def share_experience(
        self, trajectory: Trajectory, table: str | None = None, priority: float = 1.0, timeout_s: float = 30.0
    ) -> int:
        """Insert one trajectory (default table: the store's default) and return its key.

        Raises:
            InvalidArgumentError, ResourceExhaustedError, DeadlineExceededError, NotFoundError: as the table.
        """
        if not trajectory.agent_id:
            trajectory.agent_id = self.agent_id
        trajectory.validate()
        item = NewItem(
            encode_payload(trajectory, self.codec, self.chunk_bytes), summarize(trajectory), priority
        )
        (result,) = self.store.insert(table or DEFAULT_TABLE, [item], timeout_s)
        if isinstance(result, MartiError):
            raise result
        return result

    def get_all_experiences(self, episode_id: str = "", session: str = "") -> list[AgentTurn]:
        """Every agent's turns of an episode (or a session), merged by time step (see ``merge_by_step``).

        Raises:
            InvalidArgumentError: when neither ``episode_id`` nor ``session`` is given.
        """
        if not episode_id and not session:
            raise InvalidArgumentError("get_all_experiences needs an episode_id or a session")
        items = self.store.query(ItemQuery(episode_id=episode_id, session=session))
        return merge_by_step(_dedupe([decode_payload(p, self.codec) for _, p in items]))

    def sample(
        self, table: str, batch_size: int, timeout_s: float = 30.0, filt: SampleFilter = NO_FILTER
    ) -> list[SampledTrajectory]:
        """Sample up to ``batch_size`` trajectories (at least one; see :meth:`Table.sample`)."""
        out = []
        for s in self.store.sample(table, batch_size, timeout_s, filt):
            if s.stale:
                continue
            r = s.record
            out.append(
                SampledTrajectory(
                    r.key,
                    table,
                    r.priority,
                    s.probability,
                    s.importance_weight,
                    r.times_sampled,
                    s.table_size,
                    decode_payload(s.payload, self.codec),
                )
            )
        return out


def _dedupe(trajectories: list[Trajectory]) -> list[Trajectory]:
    """Drop repeated copies of the same agent's trajectory of an episode (shared into several tables)."""
    seen: set[tuple[str, str, float]] = set()
    out = []
    for t in trajectories:
        k = (t.episode_id, t.agent_id, t.created_at)
        if k not in seen:
            seen.add(k)
            out.append(t)
    return out
