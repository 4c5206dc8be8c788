"""What the sync and async experience clients share: the service's names, argument checks, request building and
response decoding (:class:`_Base`, the clients' base), and the bookkeeping of one confirmed ``Sample`` stream
(:class:`_SampleRun`) and of one ``Insert`` stream (:class:`_InsertRun`)."""

from __future__ import annotations

import numbers
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from marti.api.experience.v1 import experience_pb2 as pb
from marti.api.experience.v1 import experience_service_pb2 as spb
from marti.api.experience.v1 import experience_service_pb2_grpc as sgrpc
from marti.codec import experience as convert
from marti.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    MartiError,
    ResourceExhaustedError,
)
from marti.plumbing.arguments import check_text, is_finite
from marti.rpc.client.calls import rpc_errors
from marti.rpc.client.channel import check_channel, make_channel
from marti.rpc.client.guard import ClientChannel
from marti.rpc.errors import from_status_proto
from marti.rpc.paging import item_bytes, message_budget, pages
from marti.types.experience import SampledTrajectory, TableConfig, parse_table_config
from marti.types.trajectory import Trajectory

from .types import Inserted, SampleBatch, StoredTrajectory, TableInfo

SERVICE = "marti.api.experience.v1.ExperienceService"
_IDEMPOTENT = [
    (SERVICE, m) for m in ("GetTableInfo", "ListTables", "CreateTable", "UpdatePriorities", "Delete", "Reset")
]
#: Largest trajectory a client accepts (decompressed, or as it comes when typed), bytes.
MAX_ITEM_BYTES = 64 * 1024 * 1024
#: How a refusal of an item over :data:`MAX_ITEM_BYTES` names that limit.
ITEM_LIMIT = "marti.clients.experience.MAX_ITEM_BYTES"


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


#: Least time an ``Insert`` or ``Sample`` stream gets past the waits it asked the store for, seconds (see
#: ``_stream_deadline_s``).
MIN_STREAM_ALLOWANCE_S = 10.0


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


class _InsertRun:
    """What one insert stream confirmed so far: each item's key (and duplicate flag) or error, by position.

    Args:
        trajectories: The stream's trajectories, in item order (``client_seq``).
    """

    def __init__(self, trajectories: Sequence[Trajectory]) -> None:
        self.trajectories = trajectories
        self.keys: list[int | None] = [None] * len(trajectories)
        self.dups: set[int] = set()
        self.errors: dict[int, MartiError] = {}

    def add(self, resp: spb.InsertResponse) -> None:
        """Record one response's confirmations (a key, or the first error of each item)."""
        for c in resp.confirmations:
            err = from_status_proto(c.status)
            if err is not None:
                self.errors.setdefault(c.client_seq, err)
            else:
                self.keys[c.client_seq] = c.key
                if c.duplicate:
                    self.dups.add(c.client_seq)

    def _carry_inserted(self, err: MartiError, of: str | None) -> None:
        """Put the keys of the items confirmed so far in ``err.metadata`` (``inserted``: how many,
        ``inserted_keys``: the keys, comma-separated, in item order) and, with ``of`` (``"the other 3"``), say so
        in its message."""
        inserted = [k for k in self.keys if k is not None]
        if of is not None:
            err.message += (
                f"; {len(inserted)} of {of} items were inserted (their keys are in metadata['inserted_keys'])"
            )
        err.args = (err.message,)
        err.metadata.update(inserted=str(len(inserted)), inserted_keys=",".join(map(str, inserted)))

    def result(self) -> list[Inserted]:
        """The keys (and duplicate flags) of the items, in order, once the stream ended.

        Raises:
            MartiError: The error of the first item that failed (by position), its message prefixed with that
                item's position, episode and agent and how many of the others were inserted, and the same in
                ``metadata`` (``item``, ``episode_id``, and ``inserted``/``inserted_keys`` as
                :meth:`_carry_inserted` puts them).
        """
        if self.errors:
            i = min(self.errors)
            err, t, n = self.errors[i], self.trajectories[i], len(self.trajectories)
            err.message = f"item {i} of {n} (episode {t.episode_id!r}, agent {t.agent_id!r}): {err.message}"
            err.metadata.update(item=str(i), episode_id=t.episode_id)
            self._carry_inserted(err, f"the other {n - 1}" if n > 1 else None)
            raise err
        return [Inserted(k, i in self.dups) for i, k in enumerate(self.keys) if k is not None]

    def cut_off(self, err: MartiError) -> None:
        """Add to ``err``, the error that ended the stream early, the keys of the items confirmed before it (in
        its message and ``metadata``, as :meth:`_carry_inserted` puts them)."""
        self._carry_inserted(err, f"the {len(self.trajectories)}")


class _Base:
    """Request building and response parsing shared by the sync and async clients."""

    #: The client's channel (made by the sync or async subclass).
    _channel: ClientChannel

    def __init__(self, agent_id: str, chunk_bytes: int, max_message_bytes: int) -> None:
        if not isinstance(agent_id, str) or not agent_id:
            raise InvalidArgumentError(f"agent_id must be a non-empty string, got {agent_id!r}")
        check_text(agent_id, "agent_id")
        _in_range(chunk_bytes, "chunk_bytes", 1, 2**31 - 1)
        _in_range(max_message_bytes, "max_message_bytes", 1, 2**31 - 1)
        self.agent_id = agent_id
        self.chunk_bytes = chunk_bytes
        self.max_message_bytes = max_message_bytes

    def _dial(
        self,
        address: str,
        token: str | None,
        tls_ca_file: str | None,
        timeout_s: float,
        channel: Any,
        aio: bool,
    ) -> None:
        """Set the default deadline and the channel and stub: ``channel`` when given (shared, never closed by
        this client), else one dialed to ``address`` (a ``grpc.aio`` one when ``aio``).

        Raises:
            InvalidArgumentError: ``timeout_s`` is not a positive number within the limit, ``channel`` is not a
                channel, or the token is not printable ASCII (before any rpc).
        """
        _timeout_ms(timeout_s)  # refuse a bad default now, not at the first call
        self.timeout_s = float(timeout_s)
        self._own_channel = check_channel(channel) is None
        dialed = channel or make_channel(
            address,
            token=token,
            tls_ca_file=tls_ca_file,
            aio=aio,
            max_message_bytes=self.max_message_bytes,
            idempotent_methods=_IDEMPOTENT,
            service="store",
        )
        self._channel = ClientChannel(dialed, f"the store client of agent {self.agent_id!r}")
        self._stub = sgrpc.ExperienceServiceStub(self._channel)

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
            where = f"(argument priorities[{i}])"
            if isinstance(p, bool) or not isinstance(p, numbers.Real):
                raise InvalidArgumentError(f"priority {i} is {p!r}, not a number {where}")
            if not is_finite(p):
                raise InvalidArgumentError(f"priority {i} is {p!r}, not a finite number {where}")
            if p < 0:
                raise InvalidArgumentError(f"priority {i} is {p!r}, not >= 0 {where}")
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

    def _stream_deadline_s(self, reqs: Sequence[spb.InsertRequest | spb.SampleRequest]) -> float:
        """The gRPC deadline of an ``Insert`` or ``Sample`` stream, seconds: the waits its requests allow the store
        plus ``max(client timeout_s, MIN_STREAM_ALLOWANCE_S)`` for the transfer, the acknowledgement and the commit.

        The waits: an insert message waits up to its ``timeout_ms`` in all (for room or the rate limiter); a
        whole-batch sample waits one ``timeout_ms`` for its batch, and a partial one (``allow_partial``) up to
        ``timeout_ms`` for each of its ``num_samples`` items, as the SDK documents. A stalled store then ends the call
        with :class:`~marti.errors.DeadlineExceededError` (an insert's error carrying what was confirmed, a sample's
        items put back by the store) instead of holding the caller past every timeout it gave; the allowance's
        floor gives a client with a short ``timeout_s`` time to move a big batch and for the store's commit."""
        waits_ms = sum(
            r.timeout_ms * (r.num_samples if isinstance(r, spb.SampleRequest) and not r.whole_batch else 1)
            for r in reqs
        )
        return waits_ms / 1000.0 + max(self.timeout_s, MIN_STREAM_ALLOWANCE_S)

    @contextmanager
    def _inserting(self, run: _InsertRun) -> Iterator[None]:
        """Around an insert stream (sync or aio): a ``grpc.RpcError`` mapped to its :class:`MartiError`, and a
        stream that :meth:`close` cut off (from another thread or task, or before it began) raising the
        closed-client ``FailedPreconditionError`` (:meth:`marti.rpc.client.guard.ClientChannel.closing_guard`); either
        carries what the store confirmed before the stream ended (:meth:`_InsertRun.cut_off`)."""
        try:
            with self._channel.closing_guard(), rpc_errors():
                yield
        except MartiError as err:
            run.cut_off(err)
            raise

    def _insert_reqs(self, trajectories, table, priorities, timeout_s, batch_items, idempotent=False):
        """The InsertRequests of one insert stream: at most ``batch_items`` items each, and each under the
        client's ``max_message_bytes`` (:func:`marti.rpc.paging.pages`), so a big call is cut, not refused by
        the transport after its first messages went in.

        Raises:
            ResourceExhaustedError: before anything is sent, for an item that alone does not fit in a message
                (:meth:`_check_fits`).
        """
        items = self._items(trajectories, table, priorities, batch_items, idempotent)
        t_ms = _timeout_ms(_wait_s(timeout_s, self.timeout_s))
        sizes = [item_bytes(m) for m in items]
        budget = message_budget(self.max_message_bytes)
        self._check_fits(sizes, budget, trajectories)
        return [
            spb.InsertRequest(items=items[r.start : r.stop], timeout_ms=t_ms)
            for r in pages(sizes, batch_items, budget)
        ]

    def _check_fits(self, sizes: list[int], budget: int, trajectories: Sequence[Trajectory]) -> None:
        """Refuse the first item whose encoding (``sizes``, bytes) is over ``budget``, the item bytes one
        message carries.

        Raises:
            ResourceExhaustedError: naming the item (position, episode, agent), its size and
                ``max_message_bytes``; ``metadata`` has ``item`` and ``episode_id``.
        """
        for i, size in enumerate(sizes):
            if size > budget:
                t = trajectories[i]
                raise ResourceExhaustedError(
                    f"item {i} of {len(sizes)} (episode {t.episode_id!r}, agent {t.agent_id!r}) is {size} bytes "
                    f"encoded, over the {budget} bytes a message carries under the client's "
                    f"max_message_bytes={self.max_message_bytes}; nothing was sent",
                    metadata={"item": str(i), "episode_id": t.episode_id},
                )

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
            t = convert.trajectory_from_proto(convert.read_item(m, MAX_ITEM_BYTES, ITEM_LIMIT))
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
            t = convert.trajectory_from_proto(convert.read_item(m, MAX_ITEM_BYTES, ITEM_LIMIT))
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
            where = f"(argument priorities[{k}])"
            if isinstance(p, bool) or not isinstance(p, numbers.Real):
                raise InvalidArgumentError(f"the priority of key {k} is {p!r}, not a number {where}")
            if not is_finite(p):
                raise InvalidArgumentError(f"the priority of key {k} is {p!r}, not a finite number {where}")
            if p < 0:
                raise InvalidArgumentError(f"the priority of key {k} is {p!r}, not >= 0 {where}")
        return spb.UpdatePrioritiesRequest(
            table=table, updates=[spb.PriorityUpdate(key=k, priority=p) for k, p in priorities.items()]
        )
