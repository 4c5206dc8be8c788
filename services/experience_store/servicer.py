"""gRPC adapter of the experience store: one method per rpc, domain errors only.

Table calls can wait (rate limiters, full tables) and touch SQLite, so they run on a thread pool and never block
the event loop; a waiting call holds one pool thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from marti.api.experience.v1 import experience_pb2 as pb
from marti.api.experience.v1 import experience_service_pb2 as spb
from marti.api.experience.v1 import experience_service_pb2_grpc as sgrpc
from marti.codec import experience as convert
from marti.errors import InvalidArgumentError, MartiError, NotFoundError
from marti.rpc.errors import ok_status, to_status_proto

from .core.store import DEFAULT_TABLE, ExperienceStore, ItemQuery
from .core.table import NewItem
from .settings import StoreSettings

SERVICE_NAME = "marti.api.experience.v1.ExperienceService"


class ExperienceServicer(sgrpc.ExperienceServiceServicer):
    """Serves an :class:`ExperienceStore`.

    Args:
        store: The store (owned by the caller, closed by :meth:`close`).
        settings: Limits and defaults.
    """

    def __init__(self, store: ExperienceStore, settings: StoreSettings) -> None:
        self.store = store
        self.settings = settings
        self._pool = ThreadPoolExecutor(settings.executor_threads, thread_name_prefix="store")

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _timeout_s(self, timeout_ms: int) -> float:
        return (timeout_ms or self.settings.default_timeout_ms) / 1000.0

    # ---- Insert -----------------------------------------------------------------------------------------

    def _insert_batch(self, req: spb.InsertRequest) -> spb.InsertResponse:
        timeout_s = self._timeout_s(req.timeout_ms)
        results: list[int | MartiError] = []
        run_table, run_items = None, []  # consecutive items of one table are inserted together

        def flush() -> None:
            if run_items:
                try:
                    results.extend(self.store.insert(run_table, run_items, timeout_s))
                except MartiError as e:  # unknown table
                    results.extend([e] * len(run_items))
                run_items.clear()

        for item in req.items:
            table = item.table or self.store_default()
            if table != run_table:
                flush()
                run_table = table
            try:
                payload, summary = convert.item_payload(
                    item, self.settings.max_item_bytes, self.settings.chunk_bytes
                )
            except MartiError as e:
                flush()
                results.append(e)
                continue
            run_items.append(NewItem(payload, summary, item.priority))
        flush()
        resp = spb.InsertResponse()
        for item, res in zip(req.items, results, strict=True):
            if isinstance(res, MartiError):
                resp.confirmations.add(client_seq=item.client_seq, status=to_status_proto(res))
            else:
                resp.confirmations.add(client_seq=item.client_seq, key=res, status=ok_status())
        return resp

    def store_default(self) -> str:
        """Name of the table used when an item names none."""
        return self.settings.default_table or DEFAULT_TABLE

    async def Insert(self, request_iterator, context) -> AsyncIterator[spb.InsertResponse]:  # noqa: N802
        """See the proto: one response per request, after commit."""
        async for req in request_iterator:
            yield await self._run(self._insert_batch, req)

    # ---- Sample -----------------------------------------------------------------------------------------

    async def Sample(self, request_iterator, context) -> AsyncIterator[spb.SampleResponse]:  # noqa: N802
        """See the proto: credit-based flow control; never more items in flight than credits granted."""
        it = request_iterator.__aiter__()
        try:
            first = await it.__anext__()
        except StopAsyncIteration:
            return
        table = self.store.table(first.table)  # NotFoundError ends the stream with NOT_FOUND
        filt = convert.filter_from_proto(first.filter)
        current = first.current_policy_version if first.HasField("current_policy_version") else None
        if current is not None and current < 0:
            raise InvalidArgumentError(f"current_policy_version must be >= 0, got {current}")
        timeout_s = self._timeout_s(first.timeout_ms)
        max_batch = min(first.max_batch_items or self.settings.max_batch_items, self.settings.max_batch_items)
        fmt = first.format
        credits = first.num_samples
        more = asyncio.Event()
        done = False

        async def read_credits() -> None:
            nonlocal credits, done
            async for req in it:
                credits += req.num_samples
                more.set()
            done = True
            more.set()

        reader = asyncio.ensure_future(read_credits())
        try:
            while True:
                if credits <= 0:
                    if done:
                        return
                    more.clear()
                    await more.wait()
                    continue
                n = min(credits, max_batch)
                try:
                    items = await self._run(table.sample, n, timeout_s, filt, current)
                except MartiError as e:  # DEADLINE_EXCEEDED: in-band, outstanding credits dropped
                    credits = 0
                    yield spb.SampleResponse(status=to_status_proto(e))
                    continue
                credits -= len(items)
                yield await self._run(self._sample_response, table.name, items, fmt)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    def _sample_response(self, table: str, items, fmt: int) -> spb.SampleResponse:
        resp = spb.SampleResponse(status=ok_status())
        for s in items:
            r = s.record
            if s.stale:
                resp.stale_keys.append(r.key)
                resp.stale_episode_ids.append(r.episode_id)
                continue
            m = resp.items.add(
                key=r.key, table=table, priority=r.priority, probability=s.probability,
                importance_weight=s.importance_weight, times_sampled=r.times_sampled, table_size=s.table_size,
            )  # fmt: skip
            convert.payload_into(s.payload, fmt, m, self.settings.max_item_bytes)
        return resp

    # ---- unary ------------------------------------------------------------------------------------------

    async def UpdatePriorities(self, request, context) -> spb.UpdatePrioritiesResponse:  # noqa: N802
        """See the proto."""
        updates = {u.key: u.priority for u in request.updates}
        if len(updates) != len(request.updates):
            raise InvalidArgumentError("updates name the same key more than once")
        updated, missing = await self._run(self.store.update_priorities, request.table, updates)
        return spb.UpdatePrioritiesResponse(updated=updated, missing=missing)

    def _info(self, name: str) -> pb.TableInfo:
        table = self.store.table(name)
        return convert.table_info_to_proto(table.info(), table.config)

    async def GetTableInfo(self, request, context) -> spb.GetTableInfoResponse:  # noqa: N802
        """See the proto."""
        return spb.GetTableInfoResponse(info=await self._run(self._info, request.table))

    async def CreateTable(self, request, context) -> spb.CreateTableResponse:  # noqa: N802
        """See the proto."""
        config = convert.table_config_from_proto(request.config)
        table = await self._run(self.store.create_table, config)
        return spb.CreateTableResponse(info=await self._run(self._info, table.name))

    async def ListTables(self, request, context) -> spb.ListTablesResponse:  # noqa: N802
        """See the proto."""
        infos = await self._run(lambda: [self._info(n) for n in self.store.table_names()])
        return spb.ListTablesResponse(tables=infos)

    async def Checkpoint(self, request, context) -> spb.CheckpointResponse:  # noqa: N802
        """See the proto."""
        res = await self._run(self.store.checkpoint)
        return spb.CheckpointResponse(path=res.path, duration_s=res.duration_s, num_bytes=res.num_bytes)

    async def GetAllExperiences(self, request, context) -> AsyncIterator[spb.GetAllExperiencesResponse]:  # noqa: N802
        """See the proto."""
        if not (
            request.episode_id or request.session or request.agent_id or request.HasField("policy_version")
        ):
            raise InvalidArgumentError(
                "GetAllExperiences needs episode_id, session, agent_id or policy_version"
            )
        for name in request.tables:
            if name not in self.store.table_names():
                raise NotFoundError(f"unknown table {name!r}; tables: {self.store.table_names()}")
        q = ItemQuery(
            episode_id=request.episode_id, session=request.session, agent_id=request.agent_id,
            policy_version=request.policy_version if request.HasField("policy_version") else -1,
            tables=tuple(request.tables),
        )  # fmt: skip
        items = await self._run(self.store.query, q)
        step = self.settings.max_batch_items
        for i in range(0, len(items), step):
            yield await self._run(self._stored_batch, items[i : i + step], request.format)

    def _stored_batch(self, items, fmt: int) -> spb.GetAllExperiencesResponse:
        resp = spb.GetAllExperiencesResponse(status=ok_status())
        for rec, payload in items:
            m = resp.items.add(
                key=rec.key, table=rec.table, priority=rec.priority, times_sampled=rec.times_sampled
            )
            convert.payload_into(payload, fmt, m, self.settings.max_item_bytes)
        return resp

    def close(self) -> None:
        """Stop the pool and close the store (wakes waiting callers first)."""
        self.store.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
