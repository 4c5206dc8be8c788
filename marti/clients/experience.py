"""Typed clients of the experience store: ``ExperienceSharingClient`` (sync) and its async twin.

Agents call :meth:`share_experience` with their trajectory of an episode; trainers call :meth:`sample` or read
everything back with :meth:`get_trajectories` / :meth:`get_all_experiences`. Trajectories are serialized and
zstd-compressed here, on the client, so the server only stores and forwards bytes. Every gRPC error becomes the
matching :class:`marti.errors.MartiError` subclass.
"""

from __future__ import annotations

import numbers
import queue
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from marti.api.experience.v1 import experience_pb2 as pb
from marti.api.experience.v1 import experience_service_pb2 as spb
from marti.api.experience.v1 import experience_service_pb2_grpc as sgrpc
from marti.arguments import checked, is_finite
from marti.codec import experience as convert
from marti.codec.chunks import DEFAULT_CHUNK_BYTES
from marti.errors import DeadlineExceededError, InvalidArgumentError, MartiError
from marti.experience_types import CheckpointResult, SampledTrajectory, TableConfig, parse_table_config
from marti.rpc.calls import acall, call, rpc_errors
from marti.rpc.channel import DEFAULT_TIMEOUT_S, check_channel, make_channel
from marti.rpc.errors import from_status_proto
from marti.trajectory import AgentTurn, Trajectory, merge_by_step

SERVICE = "marti.api.experience.v1.ExperienceService"
_IDEMPOTENT = [
    (SERVICE, m) for m in ("GetTableInfo", "ListTables", "CreateTable", "UpdatePriorities", "Delete")
]
#: Largest decompressed trajectory a client accepts, bytes.
MAX_ITEM_BYTES = 64 * 1024 * 1024

__all__ = [
    "AsyncExperienceSharingClient",
    "Inserted",
    "ExperienceSharingClient",
    "SampleBatch",
    "SampledTrajectory",
    "StoredTrajectory",
    "TableInfo",
]


@dataclass(frozen=True, slots=True)
class StoredTrajectory:
    """A stored item as read back by ``get_items``.

    Attributes:
        key: Item key.  table: Its table.  priority: Current priority.
        times_sampled: Samples so far.  trajectory: The trajectory.
    """

    key: int
    table: str
    priority: float
    times_sampled: int
    trajectory: Trajectory


@dataclass(frozen=True, slots=True)
class SampleBatch:
    """What one :meth:`ExperienceSharingClient.sample_batch` call consumed from a table.

    Attributes:
        items: The trajectories returned, in selection order.
        stale_keys: Keys of items the table removed instead of returning, because their ``policy_version`` was
            more than the table's ``max_policy_lag`` behind the caller's ``current_policy_version``. Each took one
            of the ``batch_size`` slots: ``len(items) + len(stale_keys)`` items were consumed.
        stale_episode_ids: The episode id of each ``stale_keys`` entry, in the same order.
        dropped_keys: ``whole_groups``: keys of fresh items removed with their group because another member was
            stale; each took one slot.
        dropped_episode_ids: The episode id of each ``dropped_keys`` entry, in the same order.
    """

    items: list[SampledTrajectory]
    stale_keys: list[int]
    stale_episode_ids: list[str] = field(default_factory=list)
    dropped_keys: list[int] = field(default_factory=list)
    dropped_episode_ids: list[str] = field(default_factory=list)

    @property
    def consumed(self) -> int:
        """Items taken from the table: returned plus removed as stale or dropped with their group."""
        return len(self.items) + len(self.stale_keys) + len(self.dropped_keys)


@dataclass(frozen=True, slots=True)
class Inserted:
    """One item of :meth:`ExperienceSharingClient.insert`.

    Attributes:
        key: The new item's key; for a duplicate, the key of the episode's item still in the table (0 once taken).
        duplicate: The table already held or had taken this episode: nothing was inserted.
    """

    key: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class TableInfo:
    """Live state of a table (see the proto ``TableInfo`` for each field)."""

    name: str
    size: int
    num_bytes: int
    inserts: int
    samples: int
    deletes: int
    evictions: int
    priority_updates: int
    priority_updates_missing: int
    waiting_inserts: int
    waiting_samples: int
    rate_limiter_diff: float
    config: TableConfig
    stale_removed: int = 0


def _info(m: pb.TableInfo) -> TableInfo:
    return TableInfo(
        m.name, m.size, m.num_bytes, m.inserts, m.samples, m.deletes, m.evictions, m.priority_updates,
        m.priority_updates_missing, m.waiting_inserts, m.waiting_samples, m.rate_limiter_diff,
        convert.table_config_from_proto(m.config), m.stale_removed,
    )  # fmt: skip


#: Longest wait a call may ask for, seconds: the protocol carries waits as uint32 milliseconds (about 49.7 days).
MAX_TIMEOUT_S = (2**32 - 1) / 1000.0


def _timeout_ms(timeout_s: float) -> int:
    """A wait in seconds as the protocol's milliseconds.

    Raises:
        InvalidArgumentError: ``timeout_s`` not a number, not finite, <= 0 or above :data:`MAX_TIMEOUT_S`.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real):
        raise InvalidArgumentError(f"timeout_s must be a number of seconds, got {timeout_s!r}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:  # NaN and infinity fail too; a huge int is compared exactly
        raise InvalidArgumentError(f"timeout_s must be finite, > 0 and <= {MAX_TIMEOUT_S}, got {timeout_s}")
    return max(1, int(timeout_s * 1000))


_UINT32, _INT64 = 2**32 - 1, 2**63 - 1


def _in_range(value: int, name: str, lo: int, hi: int) -> None:
    """Refuse an integer argument outside ``[lo, hi]`` (the range its request field carries).

    Raises:
        InvalidArgumentError: naming ``name`` and the value (also for a non-integer or a bool).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not lo <= int(value) <= hi:
        raise InvalidArgumentError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")


def _sized(value: Any) -> bool:
    """Whether ``value`` is a sized iterable (a list, tuple or numpy array)."""
    return hasattr(value, "__len__") and hasattr(value, "__iter__")


def _wait_s(timeout_s: float | None, default_s: float) -> float:
    """The wait of one call: ``timeout_s``, or the client's default when it is None (0 is refused, not the
    default)."""
    return default_s if timeout_s is None else timeout_s  # checked by _timeout_ms


_ACK = spb.SampleRequest(ack=True)


class _SampleRun:
    """What one confirmed ``Sample`` stream delivered so far, and when the client acks and closes its side.

    The SDK asks for ``confirm`` delivery: the store commits a take only after the client acknowledged it, and
    puts the items back when the stream ends, breaks or is cancelled before that (a deadline, Ctrl-C, a crash);
    without ``allow_partial`` it also asks for ``whole_batch`` (a batch it cannot fill takes nothing).
    """

    def __init__(self) -> None:
        self.out: list[SampledTrajectory] = []
        self.stale: list[int] = []
        self.stale_ids: list[str] = []
        self.dropped: list[int] = []
        self.dropped_ids: list[str] = []
        self.err: MartiError | None = None

    def add(self, resp: spb.SampleResponse) -> bool:
        """Decode one response; True when the client must ack now: the store sent everything it took and waits
        for the ack to commit it (sent only once every item is decoded, so nothing acked can be lost here)."""
        self.err = _Base._sampled(resp, self.out, self.stale, self.stale_ids) or self.err
        self.dropped.extend(resp.dropped_keys)
        self.dropped_ids.extend(resp.dropped_episode_ids)
        return resp.needs_ack

    def batch(self, batch_size: int, allow_partial: bool, table: str) -> SampleBatch:
        """The finished call's :class:`SampleBatch` (see :meth:`_Base._finish_sample` for its errors)."""
        out = _Base._finish_sample(
            self.out, self.err, batch_size, allow_partial, table, self.stale + self.dropped
        )
        return SampleBatch(out, self.stale, self.stale_ids, self.dropped, self.dropped_ids)


class _Base:
    """Request building and response parsing shared by the sync and async clients."""

    def __init__(self, agent_id: str, chunk_bytes: int) -> None:
        if not isinstance(agent_id, str) or not agent_id:
            raise InvalidArgumentError(f"agent_id must be a non-empty string, got {agent_id!r}")
        _in_range(chunk_bytes, "chunk_bytes", 1, 2**31 - 1)
        self.agent_id = agent_id
        self.chunk_bytes = chunk_bytes

    def _items(
        self,
        trajectories: Sequence[Trajectory],
        table: str | None,
        priorities: Sequence[float] | None,
        batch_items: int = 1,
        idempotent: bool = False,
    ) -> list[pb.InsertItem]:
        if isinstance(batch_items, bool) or not isinstance(batch_items, numbers.Integral) or batch_items < 1:
            raise InvalidArgumentError(f"batch_items must be an integer >= 1, got {batch_items!r}")
        if priorities is not None and (
            isinstance(priorities, (str, bytes, Mapping)) or not _sized(priorities)
        ):
            raise InvalidArgumentError(
                f"priorities must be a sequence of numbers or None, got {priorities!r:.80}"
            )
        if priorities is not None and len(priorities) != len(trajectories):
            raise InvalidArgumentError(f"{len(priorities)} priorities for {len(trajectories)} trajectories")
        for i, p in enumerate(() if priorities is None else priorities):
            if isinstance(p, bool) or not isinstance(p, numbers.Real):
                raise InvalidArgumentError(f"priority {i} is {p!r}, not a number")
            if not is_finite(p):
                raise InvalidArgumentError(f"priority {i} is {p!r}, not a finite number")
        items = []
        for i, t in enumerate(trajectories):
            if not t.agent_id:
                t.agent_id = self.agent_id
            enc = convert.encode_proto(convert.trajectory_to_proto(t), self.chunk_bytes)
            p = 1.0 if priorities is None else priorities[i]
            items.append(
                pb.InsertItem(table=table or "", priority=p, encoded=enc, client_seq=i, idempotent=idempotent)
            )
        return items

    @staticmethod
    def _keys(responses: Iterable[spb.InsertResponse], trajectories: Sequence[Trajectory]) -> list[Inserted]:
        """The keys (and duplicate flags) of an insert stream's items, in order; or the error of the first item that failed (by
        position), its message prefixed with that item's position, episode and agent and how many of the
        others were inserted, and the same in ``metadata`` (``item``, ``episode_id``, ``inserted``,
        ``inserted_keys``: the keys of the items that were inserted, comma-separated, in item order)."""
        n = len(trajectories)
        keys: list[int | None] = [None] * n
        dups: set[int] = set()
        errors: dict[int, MartiError] = {}
        for resp in responses:
            for c in resp.confirmations:
                err = from_status_proto(c.status)
                if err is not None:
                    errors.setdefault(c.client_seq, err)
                else:
                    keys[c.client_seq] = c.key
                    if c.duplicate:
                        dups.add(c.client_seq)
        if errors:
            i = min(errors)
            err, t = errors[i], trajectories[i]
            inserted = [k for k in keys if k is not None]
            err.message = f"item {i} of {n} (episode {t.episode_id!r}, agent {t.agent_id!r}): {err.message}"
            if n > 1:
                err.message += (
                    f"; {len(inserted)} of the other {n - 1} items were inserted (their keys are in "
                    "metadata['inserted_keys'])"
                )
            err.args = (err.message,)
            err.metadata.update(
                item=str(i),
                episode_id=t.episode_id,
                inserted=str(len(inserted)),
                inserted_keys=",".join(map(str, inserted)),
            )
            raise err
        return [Inserted(k, i in dups) for i, k in enumerate(keys) if k is not None]

    def _insert_reqs(self, trajectories, table, priorities, timeout_s, batch_items, idempotent=False):
        """The InsertRequests of one insert stream (``batch_items`` items each)."""
        items = self._items(trajectories, table, priorities, batch_items, idempotent)
        t_ms = _timeout_ms(_wait_s(timeout_s, self.timeout_s))
        return [
            spb.InsertRequest(items=items[i : i + batch_items], timeout_ms=t_ms)
            for i in range(0, len(items), batch_items)
        ]

    @staticmethod
    def _delete_req(table: str, episode_ids: Sequence[str]) -> spb.DeleteRequest:
        if isinstance(episode_ids, str) or not all(isinstance(e, str) for e in episode_ids):
            raise InvalidArgumentError(f"episode_ids must be a sequence of strings, got {episode_ids!r}")
        return spb.DeleteRequest(table=table, episode_ids=list(episode_ids))

    @staticmethod
    def _sample_req(
        table,
        batch_size,
        timeout_s,
        agent_ids,
        roles,
        min_policy_version,
        max_age_s,
        current_policy_version=None,
        allow_partial=False,
        whole_groups=False,
    ):
        _in_range(batch_size, "batch_size", 1, _UINT32)
        _in_range(min_policy_version, "min_policy_version", 0, _INT64)
        if current_policy_version is not None:
            _in_range(current_policy_version, "current_policy_version", 0, _INT64)
        f = pb.SampleFilter(
            agent_ids=list(agent_ids or ()), roles=list(roles or ()), min_policy_version=min_policy_version,
            max_age_s=max_age_s,
        )  # fmt: skip
        req = spb.SampleRequest(
            table=table, num_samples=batch_size, timeout_ms=_timeout_ms(timeout_s), filter=f,
            format=pb.PAYLOAD_FORMAT_ENCODED, whole_batch=not allow_partial, confirm=True,
            whole_groups=whole_groups,
        )  # fmt: skip
        if current_policy_version is not None:
            req.current_policy_version = current_policy_version
        return req

    @staticmethod
    def _sampled(
        resp: spb.SampleResponse,
        out: list[SampledTrajectory],
        stale: list[int] | None = None,
        stale_ids: list[str] | None = None,
    ) -> MartiError | None:
        if stale is not None:
            stale.extend(resp.stale_keys)
        if stale_ids is not None:
            stale_ids.extend(resp.stale_episode_ids)
        for m in resp.items:
            t = convert.trajectory_from_proto(convert.decode_encoded(m.encoded, MAX_ITEM_BYTES))
            out.append(
                SampledTrajectory(
                    m.key,
                    m.table,
                    m.priority,
                    m.probability,
                    m.importance_weight,
                    m.times_sampled,
                    m.table_size,
                    t,
                )
            )
        return from_status_proto(resp.status)

    @staticmethod
    def _finish_sample(out, err, batch_size, allow_partial, table, stale=()):
        consumed = len(out) + len(stale)
        if consumed < batch_size and not (allow_partial and consumed):
            if err is not None:
                raise err
            raise DeadlineExceededError(
                f"sample from table {table!r} returned {len(out)} of {batch_size} items"
            )
        return out

    @staticmethod
    def _getall_req(episode_id, session, agent_id, policy_version, tables):
        if policy_version is not None:
            _in_range(policy_version, "policy_version", 0, _INT64)
        req = spb.GetAllExperiencesRequest(
            episode_id=episode_id or "", session=session or "", agent_id=agent_id or "",
            tables=list(tables or ()), format=pb.PAYLOAD_FORMAT_ENCODED,
        )  # fmt: skip
        if policy_version is not None:
            req.policy_version = policy_version
        return req

    @staticmethod
    def _stored(resp: spb.GetAllExperiencesResponse, out: list[StoredTrajectory]) -> None:
        for m in resp.items:
            t = convert.trajectory_from_proto(convert.decode_encoded(m.encoded, MAX_ITEM_BYTES))
            out.append(StoredTrajectory(m.key, m.table, m.priority, m.times_sampled, t))

    @staticmethod
    def _table_config(config: TableConfig | dict[str, Any] | None, name: str, kwargs: dict[str, Any]):
        if isinstance(config, TableConfig):
            return config
        return parse_table_config({"name": name, **(config or {}), **kwargs})

    @staticmethod
    def _updates(table: str, priorities: dict[int, float]) -> spb.UpdatePrioritiesRequest:
        if not isinstance(priorities, Mapping):
            raise InvalidArgumentError(
                f"priorities must be a mapping of item key to priority, got {priorities!r:.80}"
            )
        for k, p in priorities.items():
            if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= int(k) < 2**64:
                raise InvalidArgumentError(f"item keys are integers in [0, 2**64), got {k!r}")
            if isinstance(p, bool) or not isinstance(p, numbers.Real):
                raise InvalidArgumentError(f"the priority of key {k} is {p!r}, not a number")
            if not is_finite(p):
                raise InvalidArgumentError(f"the priority of key {k} is {p!r}, not a finite number")
        return spb.UpdatePrioritiesRequest(
            table=table, updates=[spb.PriorityUpdate(key=k, priority=p) for k, p in priorities.items()]
        )


class ExperienceSharingClient(_Base):
    """Sync client of the experience store.

    Args:
        agent_id: The agent sharing experience (fills ``Trajectory.agent_id`` when empty).
        address: ``host:port`` of the store.
        token: Bearer token, if the store requires one; ``None`` reads ``MARTI_STORE_TOKEN``, then
            ``MARTI_TOKEN`` (as the store itself does); ``""`` sends none.
        tls_ca_file: PEM CA file; enables TLS.
        timeout_s: Default deadline of unary calls and waits, seconds.
        chunk_bytes: Uncompressed bytes per compressed chunk.
        channel: An open channel to the store to use instead of dialing (``address``, ``token`` and
            ``tls_ca_file`` are then unused; a ``grpc.aio`` one for the async client), shared with other
            clients; not closed by :meth:`close`.

    Raises:
        InvalidArgumentError: The token (given or from the environment) is not printable ASCII; raised at
            construction, before any rpc, naming the position of the bad character but not the token.
    """

    def __init__(
        self,
        agent_id: str,
        address: str,
        token: str | None = None,
        tls_ca_file: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        *,
        channel: grpc.Channel | None = None,
    ) -> None:
        super().__init__(agent_id, chunk_bytes)
        _timeout_ms(timeout_s)  # refuse a bad default now, not at the first call
        self.timeout_s = float(timeout_s)
        self._own_channel = check_channel(channel) is None
        self._channel = channel or make_channel(
            address, token=token, tls_ca_file=tls_ca_file, idempotent_methods=_IDEMPOTENT, service="store"
        )
        self._stub = sgrpc.ExperienceServiceStub(self._channel)

    @checked(own=("priority", "timeout_s"))
    def share_experience(
        self,
        trajectory: Trajectory,
        table: str | None = None,
        priority: float = 1.0,
        timeout_s: float | None = None,
    ) -> int:
        """Insert one trajectory and return its key once the store confirmed it (committed to disk when the store
        has a data dir).

        Args:
            trajectory: The agent's trajectory of an episode.
            table: Target table (None = the store's default table).
            priority: Finite, >= 0.
            timeout_s: Longest wait for the table's rate limiter, seconds.

        Raises:
            InvalidArgumentError: bad priority or trajectory/signature mismatch (naming the field).
            ResourceExhaustedError: the item exceeds the table byte cap.
            NotFoundError: unknown table.  DeadlineExceededError: the wait ran out.
        """
        return self.share_experiences([trajectory], table, [priority], timeout_s)[0]

    @checked(own=("priorities", "timeout_s", "batch_items"))
    def share_experiences(
        self,
        trajectories: Sequence[Trajectory],
        table: str | None = None,
        priorities: Sequence[float] | None = None,
        timeout_s: float | None = None,
        batch_items: int = 64,
    ) -> list[int]:
        """Insert many trajectories over one stream (``batch_items`` per message) and return their keys.

        Raises:
            InvalidArgumentError: before anything is sent, for ``batch_items`` < 1 or a priority count that is
                not the trajectory count.
            The first failed item's error, after every other item was processed, naming the item (position,
            episode, agent) and carrying the keys of the items that were inserted in
            ``metadata["inserted_keys"]`` (see :meth:`share_experience`).
        """
        reqs = self._insert_reqs(trajectories, table, priorities, timeout_s, batch_items)
        with rpc_errors():
            return [r.key for r in self._keys(self._stub.Insert(iter(reqs)), trajectories)]

    @checked(own=("timeout_s", "batch_items"))
    def insert(
        self,
        table: str,
        trajectories: Sequence[Trajectory],
        timeout_s: float | None = None,
        batch_items: int = 64,
    ) -> list[Inserted]:
        """Insert trajectories at most once per ``(table, episode_id)``: an episode the table holds, or took
        (sampled out, removed as stale or dropped, deleted) within the store's ``taken_ids_window``, is answered
        as a duplicate and not inserted again, so a call retried after its answer was lost is safe.

        Args:
            table: Target table.
            trajectories: One per episode (a table holds one item per episode for this to mean "once").
            timeout_s: Longest wait for room or the rate limiter, seconds.
            batch_items: Items per stream message (>= 1).

        Returns:
            One :class:`Inserted` per trajectory, in order.

        Raises:
            As :meth:`share_experiences`.
        """
        reqs = self._insert_reqs(trajectories, table, None, timeout_s, batch_items, idempotent=True)
        with rpc_errors():
            return self._keys(self._stub.Insert(iter(reqs)), trajectories)

    @checked
    def delete(self, table: str, episode_ids: Sequence[str], timeout_s: float | None = None) -> int:
        """Delete every item of these episodes from ``table`` and return how many were deleted (ids with no item
        are skipped; an idempotent insert of a deleted id later is a duplicate). Retried on UNAVAILABLE.

        Raises:
            InvalidArgumentError: ``episode_ids`` is not a sequence of strings.  NotFoundError: unknown table.
        """
        req = self._delete_req(table, episode_ids)
        return call(self._stub.Delete, req, _wait_s(timeout_s, self.timeout_s)).deleted

    @checked(own=("batch_size", "timeout_s", "min_policy_version"))
    def sample(
        self,
        table: str,
        batch_size: int,
        timeout_s: float | None = None,
        agent_ids: Sequence[str] | None = None,
        roles: Sequence[str] | None = None,
        min_policy_version: int = 0,
        max_age_s: float = 0.0,
        allow_partial: bool = False,
    ) -> list[SampledTrajectory]:
        """Sample ``batch_size`` trajectories (with replacement unless the table removes sampled items).

        Args:
            table: Table name.
            batch_size: Items wanted (the server never sends more).
            timeout_s: Longest wait for each item, seconds.
            agent_ids, roles, min_policy_version, max_age_s: Filters (empty = any).
            allow_partial: Return the items that came within ``timeout_s`` instead of raising when fewer came.

        Returns:
            Items with key, priority, probability, importance weight and the trajectory.

        No taken item is lost: without ``allow_partial`` the store takes the whole batch or nothing, and it
        commits a sample only once this client acknowledged every item (a call cancelled, interrupted or killed
        before that leaves the items in the table for the next caller).

        Raises:
            InvalidArgumentError: an argument of the wrong type or out of its range, naming it.
            OutOfRangeError: ``batch_size`` above the store's ``max_sample_items`` or ``timeout_s`` above its
                ``max_wait_ms`` (refused before anything is taken).
            NotFoundError: unknown table.  DeadlineExceededError: fewer than ``batch_size`` items in time (then
                nothing was taken: a queue keeps its items).
        """
        return self.sample_batch(
            table, batch_size, timeout_s, agent_ids, roles, min_policy_version, max_age_s, allow_partial
        ).items

    @checked(own=("batch_size", "timeout_s", "min_policy_version", "current_policy_version"))
    def sample_batch(
        self,
        table: str,
        batch_size: int,
        timeout_s: float | None = None,
        agent_ids: Sequence[str] | None = None,
        roles: Sequence[str] | None = None,
        min_policy_version: int = 0,
        max_age_s: float = 0.0,
        allow_partial: bool = False,
        current_policy_version: int | None = None,
        whole_groups: bool = False,
    ) -> SampleBatch:
        """Consume ``batch_size`` items as :meth:`sample` does, stating the caller's policy version.

        With ``current_policy_version`` and a table ``max_policy_lag``, a selected item more than the lag
        behind is removed by the store instead of returned and reported in :attr:`SampleBatch.stale_keys`; it
        takes one of the ``batch_size`` slots (a learner reading a queue table consumes it in order).

        Args:
            table, batch_size, timeout_s, agent_ids, roles, min_policy_version, max_age_s, allow_partial: As
                :meth:`sample` (``allow_partial`` counts stale items as consumed).
            current_policy_version: The caller's policy version (>= 0); None = no staleness check.
            whole_groups: Take whole groups (``Trajectory.group_id`` with ``group_size`` >= 2): a group is taken
                once all its members are in the table, may carry the batch past ``batch_size``, and is dropped
                whole (:attr:`SampleBatch.dropped_keys`) when a member is stale.

        Returns:
            A :class:`SampleBatch`.

        Raises:
            InvalidArgumentError: ``batch_size < 1`` or ``current_policy_version < 0``.
            NotFoundError: unknown table.  DeadlineExceededError: fewer than ``batch_size`` items in time.
        """
        req = self._sample_req(
            table, batch_size, _wait_s(timeout_s, self.timeout_s), agent_ids, roles, min_policy_version, max_age_s,
            current_policy_version, allow_partial, whole_groups,
        )  # fmt: skip
        run = _SampleRun()
        requests: queue.SimpleQueue = queue.SimpleQueue()
        requests.put(req)
        stream = self._stub.Sample(iter(requests.get, None))
        try:
            with rpc_errors():
                for resp in stream:
                    if run.add(resp):
                        requests.put(_ACK)
                        requests.put(None)  # close our side; the stream ends once the store committed
        finally:
            requests.put(None)
            stream.cancel()  # a no-op after the end; before it, the store puts unacknowledged items back
        return run.batch(batch_size, allow_partial, table)

    @checked(own=("policy_version",))
    def get_trajectories(
        self,
        episode_id: str | None = None,
        session: str | None = None,
        agent_id: str | None = None,
        policy_version: int | None = None,
        tables: Sequence[str] | None = None,
    ) -> list[Trajectory]:
        """Every stored trajectory matching the query, in insertion order (not counted as samples).

        Raises:
            InvalidArgumentError: when no criterion is given.  NotFoundError: unknown table.
        """
        return [s.trajectory for s in self.get_items(episode_id, session, agent_id, policy_version, tables)]

    @checked(own=("policy_version",))
    def get_items(
        self,
        episode_id: str | None = None,
        session: str | None = None,
        agent_id: str | None = None,
        policy_version: int | None = None,
        tables: Sequence[str] | None = None,
    ) -> list[StoredTrajectory]:
        """Like :meth:`get_trajectories`, with each item's key, table, priority and sample count."""
        req = self._getall_req(episode_id, session, agent_id, policy_version, tables)
        out: list[StoredTrajectory] = []
        with rpc_errors():
            for resp in self._stub.GetAllExperiences(req, timeout=self.timeout_s):
                self._stored(resp, out)
        return out

    @checked
    def get_all_experiences(
        self, episode_id: str | None = None, session: str | None = None
    ) -> list[AgentTurn]:
        """Every agent's turns of an episode (or session), merged by time step.

        Raises:
            InvalidArgumentError: when neither is given.
        """
        if not episode_id and not session:
            raise InvalidArgumentError("get_all_experiences needs an episode_id or a session")
        return merge_by_step(self.get_trajectories(episode_id=episode_id, session=session))

    @checked
    def create_table(
        self, name: str, config: TableConfig | dict[str, Any] | None = None, **fields: Any
    ) -> TableInfo:
        """Create a table (idempotent for an identical config), e.g. ``create_table("agent_1", preset="queue")``.

        Raises:
            InvalidArgumentError: bad config (naming the field).  AlreadyExistsError: other config exists.
        """
        cfg = convert.table_config_to_proto(self._table_config(config, name, fields))
        return _info(call(self._stub.CreateTable, spb.CreateTableRequest(config=cfg), self.timeout_s).info)

    @checked(own=("priorities",))
    def update_priorities(self, table: str, priorities: dict[int, float]) -> tuple[int, int]:
        """Set priorities by key; returns ``(updated, missing)`` (missing keys are skipped, not errors)."""
        resp = call(self._stub.UpdatePriorities, self._updates(table, priorities), self.timeout_s)
        return resp.updated, resp.missing

    @checked
    def info(self, table: str) -> TableInfo:
        """Return the table's live state (NotFoundError for an unknown table)."""
        return _info(call(self._stub.GetTableInfo, spb.GetTableInfoRequest(table=table), self.timeout_s).info)

    def list_tables(self) -> list[TableInfo]:
        """Return every table's live state, sorted by name."""
        return [_info(m) for m in call(self._stub.ListTables, spb.ListTablesRequest(), self.timeout_s).tables]

    def checkpoint(self) -> CheckpointResult:
        """Ask the store for a snapshot; returns its path, duration and size."""
        r = call(self._stub.Checkpoint, spb.CheckpointRequest(), max(self.timeout_s, 600.0))
        return CheckpointResult(r.path, r.duration_s, r.num_bytes)

    def close(self) -> None:
        """Close the channel (when this client dialed it)."""
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> ExperienceSharingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncExperienceSharingClient(_Base):
    """Async twin of :class:`ExperienceSharingClient` (same arguments, token fallback and errors; ``await``
    every method)."""

    def __init__(
        self,
        agent_id: str,
        address: str,
        token: str | None = None,
        tls_ca_file: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        *,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        super().__init__(agent_id, chunk_bytes)
        _timeout_ms(timeout_s)  # refuse a bad default now, not at the first call
        self.timeout_s = float(timeout_s)
        self._own_channel = check_channel(channel) is None
        self._channel = channel or make_channel(
            address,
            token=token,
            tls_ca_file=tls_ca_file,
            aio=True,
            idempotent_methods=_IDEMPOTENT,
            service="store",
        )
        self._stub = sgrpc.ExperienceServiceStub(self._channel)

    @checked(own=("priority", "timeout_s"))
    async def share_experience(
        self,
        trajectory: Trajectory,
        table: str | None = None,
        priority: float = 1.0,
        timeout_s: float | None = None,
    ) -> int:
        """See :meth:`ExperienceSharingClient.share_experience`."""
        return (await self.share_experiences([trajectory], table, [priority], timeout_s))[0]

    @checked(own=("priorities", "timeout_s", "batch_items"))
    async def share_experiences(
        self,
        trajectories: Sequence[Trajectory],
        table: str | None = None,
        priorities: Sequence[float] | None = None,
        timeout_s: float | None = None,
        batch_items: int = 64,
    ) -> list[int]:
        """See :meth:`ExperienceSharingClient.share_experiences`."""
        reqs = self._insert_reqs(trajectories, table, priorities, timeout_s, batch_items)
        with rpc_errors():
            responses = [r async for r in self._stub.Insert(iter(reqs))]
        return [r.key for r in self._keys(responses, trajectories)]

    @checked(own=("timeout_s", "batch_items"))
    async def insert(
        self,
        table: str,
        trajectories: Sequence[Trajectory],
        timeout_s: float | None = None,
        batch_items: int = 64,
    ) -> list[Inserted]:
        """See :meth:`ExperienceSharingClient.insert`."""
        reqs = self._insert_reqs(trajectories, table, None, timeout_s, batch_items, idempotent=True)
        with rpc_errors():
            responses = [r async for r in self._stub.Insert(iter(reqs))]
        return self._keys(responses, trajectories)

    @checked
    async def delete(self, table: str, episode_ids: Sequence[str], timeout_s: float | None = None) -> int:
        """See :meth:`ExperienceSharingClient.delete`."""
        req = self._delete_req(table, episode_ids)
        return (await acall(self._stub.Delete, req, _wait_s(timeout_s, self.timeout_s))).deleted

    @checked(own=("batch_size", "timeout_s", "min_policy_version"))
    async def sample(
        self,
        table: str,
        batch_size: int,
        timeout_s: float | None = None,
        agent_ids: Sequence[str] | None = None,
        roles: Sequence[str] | None = None,
        min_policy_version: int = 0,
        max_age_s: float = 0.0,
        allow_partial: bool = False,
    ) -> list[SampledTrajectory]:
        """See :meth:`ExperienceSharingClient.sample`."""
        batch = await self.sample_batch(
            table, batch_size, timeout_s, agent_ids, roles, min_policy_version, max_age_s, allow_partial
        )
        return batch.items

    @checked(own=("batch_size", "timeout_s", "min_policy_version", "current_policy_version"))
    async def sample_batch(
        self,
        table: str,
        batch_size: int,
        timeout_s: float | None = None,
        agent_ids: Sequence[str] | None = None,
        roles: Sequence[str] | None = None,
        min_policy_version: int = 0,
        max_age_s: float = 0.0,
        allow_partial: bool = False,
        current_policy_version: int | None = None,
        whole_groups: bool = False,
    ) -> SampleBatch:
        """See :meth:`ExperienceSharingClient.sample_batch`."""
        req = self._sample_req(
            table, batch_size, _wait_s(timeout_s, self.timeout_s), agent_ids, roles, min_policy_version, max_age_s,
            current_policy_version, allow_partial, whole_groups,
        )  # fmt: skip
        run = _SampleRun()
        stream = self._stub.Sample()
        try:
            with rpc_errors():
                await stream.write(req)
                while (resp := await stream.read()) is not grpc.aio.EOF:
                    if run.add(resp):
                        await stream.write(_ACK)
                        await stream.done_writing()  # the stream ends once the store committed
        finally:
            stream.cancel()  # a no-op after the end; before it, the store puts unacknowledged items back
        return run.batch(batch_size, allow_partial, table)

    @checked(own=("policy_version",))
    async def get_trajectories(
        self,
        episode_id: str | None = None,
        session: str | None = None,
        agent_id: str | None = None,
        policy_version: int | None = None,
        tables: Sequence[str] | None = None,
    ) -> list[Trajectory]:
        """See :meth:`ExperienceSharingClient.get_trajectories`."""
        items = await self.get_items(episode_id, session, agent_id, policy_version, tables)
        return [s.trajectory for s in items]

    @checked(own=("policy_version",))
    async def get_items(
        self,
        episode_id: str | None = None,
        session: str | None = None,
        agent_id: str | None = None,
        policy_version: int | None = None,
        tables: Sequence[str] | None = None,
    ) -> list[StoredTrajectory]:
        """See :meth:`ExperienceSharingClient.get_items`."""
        req = self._getall_req(episode_id, session, agent_id, policy_version, tables)
        out: list[StoredTrajectory] = []
        with rpc_errors():
            async for resp in self._stub.GetAllExperiences(req, timeout=self.timeout_s):
                self._stored(resp, out)
        return out

    @checked
    async def get_all_experiences(
        self, episode_id: str | None = None, session: str | None = None
    ) -> list[AgentTurn]:
        """See :meth:`ExperienceSharingClient.get_all_experiences`."""
        if not episode_id and not session:
            raise InvalidArgumentError("get_all_experiences needs an episode_id or a session")
        return merge_by_step(await self.get_trajectories(episode_id=episode_id, session=session))

    @checked
    async def create_table(
        self, name: str, config: TableConfig | dict[str, Any] | None = None, **fields: Any
    ) -> TableInfo:
        """See :meth:`ExperienceSharingClient.create_table`."""
        cfg = convert.table_config_to_proto(self._table_config(config, name, fields))
        return _info(
            (await acall(self._stub.CreateTable, spb.CreateTableRequest(config=cfg), self.timeout_s)).info
        )

    @checked(own=("priorities",))
    async def update_priorities(self, table: str, priorities: dict[int, float]) -> tuple[int, int]:
        """See :meth:`ExperienceSharingClient.update_priorities`."""
        resp = await acall(self._stub.UpdatePriorities, self._updates(table, priorities), self.timeout_s)
        return resp.updated, resp.missing

    @checked
    async def info(self, table: str) -> TableInfo:
        """See :meth:`ExperienceSharingClient.info`."""
        return _info(
            (await acall(self._stub.GetTableInfo, spb.GetTableInfoRequest(table=table), self.timeout_s)).info
        )

    async def list_tables(self) -> list[TableInfo]:
        """See :meth:`ExperienceSharingClient.list_tables`."""
        return [
            _info(m)
            for m in (await acall(self._stub.ListTables, spb.ListTablesRequest(), self.timeout_s)).tables
        ]

    async def checkpoint(self) -> CheckpointResult:
        """See :meth:`ExperienceSharingClient.checkpoint`."""
        r = await acall(self._stub.Checkpoint, spb.CheckpointRequest(), max(self.timeout_s, 600.0))
        return CheckpointResult(r.path, r.duration_s, r.num_bytes)

    async def close(self) -> None:
        """Close the channel (when this client dialed it)."""
        if self._own_channel:
            await self._channel.close()

    async def __aenter__(self) -> AsyncExperienceSharingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
