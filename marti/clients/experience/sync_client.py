"""The sync experience store client (:class:`ExperienceSharingClient`)."""

from __future__ import annotations

import queue
from collections.abc import Sequence
from typing import Any

import grpc

from marti.api.experience.v1 import experience_service_pb2 as spb
from marti.codec import experience as convert
from marti.codec.chunks import DEFAULT_CHUNK_BYTES
from marti.errors import InvalidArgumentError
from marti.plumbing.arguments import checked
from marti.rpc.client.calls import call, rpc_errors
from marti.rpc.client.channel import DEFAULT_TIMEOUT_S
from marti.rpc.settings import DEFAULT_MAX_MESSAGE_BYTES
from marti.types.experience import CheckpointResult, SampledTrajectory, TableConfig
from marti.types.trajectory import AgentTurn, Trajectory, merge_by_step

from .protocol import _ACK, _Base, _info, _InsertRun, _SampleRun, _wait_s
from .types import Inserted, SampleBatch, StoredTrajectory, TableInfo


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
        max_message_bytes: Largest message the channel sends or receives, bytes (the store's
            ``max_message_bytes``, 64 MiB by default: keep both the same). An insert stream is cut into messages
            under it; it is also the largest ``sample``/``get_items`` response this client takes.
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
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        *,
        channel: grpc.Channel | None = None,
    ) -> None:
        super().__init__(agent_id, chunk_bytes, max_message_bytes)
        self._dial(address, token, tls_ca_file, timeout_s, channel, aio=False)

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
            ResourceExhaustedError: before anything is sent, for an item whose encoding alone does not fit in
                a message under ``max_message_bytes``, naming it (position, episode, agent) and the limit.
                Messages carry ``batch_items`` items, fewer when their bytes would go over that limit.
            The first failed item's error, after every other item was processed, naming the item (position,
            episode, agent) and carrying the keys of the items that were inserted in
            ``metadata["inserted_keys"]`` (see :meth:`share_experience`).
            FailedPreconditionError: The client is closed, or was closed (by another thread, or another task of
                the async client) while the stream ran: the closed-client error, carrying the same way the keys
                of the items the store confirmed before (``metadata["inserted"]``: how many,
                ``metadata["inserted_keys"]``: the keys, comma-separated, in item order; ``"0"`` and ``""``
                when the client was closed before the call) and saying how many in its message. Items whose
                confirmation had not reached the client may be stored too: retry with :meth:`insert`, which
                answers an episode the table holds or took as a duplicate instead of storing it again.
            MartiError: Any other error that ends the stream (UnavailableError for a broken connection, ...)
                carries the keys the same way.
        """
        reqs = self._insert_reqs(trajectories, table, priorities, timeout_s, batch_items)
        return [r.key for r in self._insert_stream(reqs, trajectories)]

    @checked(own=("timeout_s", "batch_items"))
    def insert(
        self,
        table: str,
        trajectories: Sequence[Trajectory],
        timeout_s: float | None = None,
        batch_items: int = 64,
    ) -> list[Inserted]:
        """Insert trajectories at most once per ``(table, episode_id, agent_id)``: an agent's trajectory of an
        episode that the table holds, or took (sampled out, removed as stale or dropped) within the store's
        ``taken_ids_window`` since the table was created or last :meth:`reset`, or of an episode deleted in that
        window, is answered as a duplicate and not inserted again, so a call retried after its answer was lost is
        safe. The other agents' trajectories of the same episode go in (a team shares one table).

        Args:
            table: Target table.
            trajectories: One per episode and agent (a table holds one item per episode and agent for this to
                mean "once"); an empty ``agent_id`` is filled with the client's.
            timeout_s: Longest wait for room or the rate limiter, seconds.
            batch_items: Items per stream message (>= 1).

        Returns:
            One :class:`Inserted` per trajectory, in order.

        Raises:
            As :meth:`share_experiences`.
        """
        reqs = self._insert_reqs(trajectories, table, None, timeout_s, batch_items, idempotent=True)
        return self._insert_stream(reqs, trajectories)

    def _insert_stream(
        self, reqs: list[spb.InsertRequest], trajectories: Sequence[Trajectory]
    ) -> list[Inserted]:
        """Send ``reqs`` over one ``Insert`` stream and return each item's :class:`Inserted`, in order (errors as
        :meth:`share_experiences`)."""
        run = _InsertRun(trajectories)
        with self._inserting(run):
            for resp in self._stub.Insert(iter(reqs), timeout=self._stream_deadline_s(reqs)):
                run.add(resp)
        return run.result()

    @checked
    def delete(self, table: str, episode_ids: Sequence[str], timeout_s: float | None = None) -> int:
        """Delete every item of these episodes from ``table`` and return how many were deleted (ids with no item
        are skipped; an idempotent insert of a deleted id later is a duplicate). Retried on UNAVAILABLE.

        Raises:
            InvalidArgumentError: ``episode_ids`` is not a sequence of strings.  NotFoundError: unknown table.
        """
        req = self._delete_req(table, episode_ids)
        return call(self._stub.Delete, req, _wait_s(timeout_s, self.timeout_s)).deleted

    @checked
    def reset(self, table: str, timeout_s: float | None = None) -> int:
        """Empty ``table`` and start it over (as Reverb's ``reset``) and return how many items were deleted: its
        counters start from zero and it forgets the episode ids it took, so the scope of :meth:`insert`'s "once"
        begins anew (a job claims its tables with it, and a later job that reuses episode ids is not answered
        duplicate). The config is kept. Retried on UNAVAILABLE.

        Args:
            table: The table.
            timeout_s: Longest wait for the answer, seconds (None = the client's ``timeout_s``).

        Raises:
            NotFoundError: unknown table.
        """
        req = spb.ResetRequest(table=table)
        return call(self._stub.Reset, req, _wait_s(timeout_s, self.timeout_s)).deleted

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
            allow_partial: Return the items that came within ``timeout_s`` instead of raising when fewer came (at
                least one: none in time is DeadlineExceededError).

        Returns:
            Items with key, priority, probability, importance weight and the trajectory.

        No taken item is lost: without ``allow_partial`` the store takes the whole batch or nothing, and it
        commits a sample only once this client acknowledged every item (a call cancelled, interrupted or killed
        before that leaves the items in the table for the next caller).

        Raises:
            InvalidArgumentError: an argument of the wrong type or out of its range, naming it.
            OutOfRangeError: ``batch_size`` above the store's ``max_sample_items`` or ``timeout_s`` above its
                ``max_wait_ms``, or (without ``allow_partial``) above what the table can ever hand out at once,
                ``max_size`` x ``max_times_sampled`` (refused before anything is taken).
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
            OutOfRangeError: ``whole_groups`` met a group whose ``group_size`` is over the ``max_size`` of a table
                that blocks when full (it can never be taken whole).
        """
        req = self._sample_req(
            table, batch_size, _wait_s(timeout_s, self.timeout_s), agent_ids, roles, min_policy_version, max_age_s,
            current_policy_version, allow_partial, whole_groups,
        )  # fmt: skip
        run = _SampleRun()
        requests: queue.SimpleQueue = queue.SimpleQueue()
        requests.put(req)
        stream = self._stub.Sample(iter(requests.get, None), timeout=self._stream_deadline_s([req]))
        try:
            with self._channel.closing_guard(), rpc_errors():
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
        with self._channel.closing_guard(), rpc_errors():
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
        """Close the channel (when this client dialed it); later calls, and a call waiting now in another thread,
        raise the closed-client ``FailedPreconditionError`` (a cut :meth:`share_experiences` with the keys
        it inserted)."""
        self._channel.mark_closed()
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> ExperienceSharingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
