"""The ``grpc.aio`` experience store client (:class:`AsyncExperienceSharingClient`), twin of
:class:`~.sync_client.ExperienceSharingClient`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc

from marti.api.experience.v1 import experience_service_pb2 as spb
from marti.codec import experience as convert
from marti.codec.chunks import DEFAULT_CHUNK_BYTES
from marti.errors import InvalidArgumentError
from marti.plumbing.arguments import checked
from marti.rpc.client.calls import acall, rpc_errors
from marti.rpc.client.channel import DEFAULT_TIMEOUT_S
from marti.rpc.settings import DEFAULT_MAX_MESSAGE_BYTES
from marti.types.experience import CheckpointResult, SampledTrajectory, TableConfig
from marti.types.trajectory import AgentTurn, Trajectory, merge_by_step

from .protocol import _ACK, _Base, _info, _InsertRun, _SampleRun, _wait_s
from .types import Inserted, SampleBatch, StoredTrajectory, TableInfo


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
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        *,
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        super().__init__(agent_id, chunk_bytes, max_message_bytes)
        self._dial(address, token, tls_ca_file, timeout_s, channel, aio=True)

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
        return [r.key for r in await self._insert_stream(reqs, trajectories)]

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
        return await self._insert_stream(reqs, trajectories)

    async def _insert_stream(
        self, reqs: list[spb.InsertRequest], trajectories: Sequence[Trajectory]
    ) -> list[Inserted]:
        """See :meth:`ExperienceSharingClient._insert_stream`."""
        run = _InsertRun(trajectories)
        with self._inserting(run):
            async for resp in self._stub.Insert(iter(reqs), timeout=self._stream_deadline_s(reqs)):
                run.add(resp)
        return run.result()

    @checked
    async def delete(self, table: str, episode_ids: Sequence[str], timeout_s: float | None = None) -> int:
        """See :meth:`ExperienceSharingClient.delete`."""
        req = self._delete_req(table, episode_ids)
        return (await acall(self._stub.Delete, req, _wait_s(timeout_s, self.timeout_s))).deleted

    @checked
    async def reset(self, table: str, timeout_s: float | None = None) -> int:
        """See :meth:`ExperienceSharingClient.reset`."""
        req = spb.ResetRequest(table=table)
        return (await acall(self._stub.Reset, req, _wait_s(timeout_s, self.timeout_s))).deleted

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
        stream = self._stub.Sample(timeout=self._stream_deadline_s([req]))
        try:
            with rpc_errors():
                await stream.write(req)
                while (resp := await stream.read()) is not grpc.aio.EOF:
                    # decoded off the event loop: a cancel that comes meanwhile (``asyncio.wait_for``'s deadline,
                    # Ctrl-C under ``asyncio.run``) lands on this await, before the ack, so the store puts the
                    # items back; decoded on the loop, the cancel could only land once the ack was written
                    if await asyncio.to_thread(run.add, resp):
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
        """Close the channel (when this client dialed it); later calls, and a call waiting now, raise the
        closed-client ``FailedPreconditionError`` (a cut :meth:`share_experiences` with the keys it
        inserted, see :meth:`ExperienceSharingClient.share_experiences`)."""
        self._channel.mark_closed()
        if self._own_channel:
            await self._channel.close()

    async def __aenter__(self) -> AsyncExperienceSharingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
