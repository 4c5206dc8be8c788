"""gRPC adapter of the experience store: one method per rpc, domain errors only.

Table calls can wait (rate limiters, full tables) and touch SQLite, so they run on a thread pool and never block
the event loop; a waiting call holds one pool thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from marti.api.experience.v1 import experience_pb2 as pb
from marti.api.experience.v1 import experience_service_pb2 as spb
from marti.api.experience.v1 import experience_service_pb2_grpc as sgrpc
from marti.codec import experience as convert
from marti.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    MartiError,
    NotFoundError,
    OutOfRangeError,
    ResourceExhaustedError,
)
from marti.rpc.errors import ok_status, to_status_proto
from marti.rpc.paging import item_bytes, message_budget, pages

from .core.store import DEFAULT_TABLE, ExperienceStore, ItemQuery
from .core.table_records import Duplicate, NewItem
from .sample_stream import SampleStream
from .settings import StoreSettings

SERVICE_NAME = "marti.api.experience.v1.ExperienceService"
#: How an insert refusal names the item size cap: the setting and its variable (StoreSettings.max_item_bytes).
ITEM_LIMIT = "max_item_bytes (MARTI_STORE_MAX_ITEM_BYTES)"
#: How a read refusal names the message size cap (ServerSettings.max_message_bytes).
MESSAGE_LIMIT = "max_message_bytes (MARTI_STORE_MAX_MESSAGE_BYTES)"


#: A SampledItem with every field but its table and payload at its largest encoding: the biggest response entry an
#: item can take (a StoredItem's fields are a subset).
_LARGEST_ENTRY = pb.SampledItem(
    key=2**64 - 1, priority=1.0, probability=1.0, importance_weight=1.0, times_sampled=2**63 - 1,
    table_size=2**63 - 1,
)  # fmt: skip


def _item_name(rec) -> str:
    """An item as a refusal names it: key, table, episode and agent."""
    return f"item {rec.key} of table {rec.table!r} (episode {rec.episode_id!r}, agent {rec.agent_id!r})"


def _id_bytes(rec) -> int:
    """Bytes a stale or dropped item adds to a SampleResponse: its key and episode id, each with tag and length."""
    return 22 + len(rec.episode_id.encode())


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
        # Insert batches and Sample takes, which may wait for room or items, on threads of their own: a waiting
        # call holds its thread, and on one pool the waiters kept the commit, or the insert, that ends their
        # wait from running until they timed out.
        self._waits = ThreadPoolExecutor(settings.wait_threads, thread_name_prefix="store-wait")

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _run_abandonable(self, fn, wake, undo=None):
        """``fn(abandoned)`` on the pool of calls that may wait, ``abandoned`` a fresh :class:`threading.Event`. If the call is cancelled
        meanwhile (the client went away: it closed or cancelled the call, or was killed), sets ``abandoned`` and calls ``wake``
        (a table's or the store's ``notify``) so a table call waiting in ``fn`` gives up at once, passes what an
        ``fn`` that finished all the same returns to ``undo`` (when given), and re-raises the cancellation."""
        abandoned = threading.Event()
        fut = asyncio.get_running_loop().run_in_executor(self._waits, fn, abandoned)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            abandoned.set()
            wake()
            if undo is not None:
                fut.add_done_callback(lambda f: None if f.cancelled() or f.exception() else undo(f.result()))
            raise

    def _timeout_s(self, timeout_ms: int) -> float:
        """A request's wait in seconds (0 = ``default_timeout_ms``).

        Raises:
            OutOfRangeError: above ``max_wait_ms``, naming ``timeout_ms`` (the SDK's ``timeout_s``).
        """
        if timeout_ms > self.settings.max_wait_ms:
            raise OutOfRangeError(
                f"timeout_ms (timeout_s in the SDK) is {timeout_ms} ms, above the store's max_wait_ms "
                f"{self.settings.max_wait_ms}"
            )
        return (timeout_ms or self.settings.default_timeout_ms) / 1000.0

    def _check_credits(self, credits: int) -> None:
        """Refuse a Sample stream asking for more than ``max_sample_items`` items at once, before any take.

        Raises:
            OutOfRangeError: naming ``num_samples`` (the SDK's ``batch_size``) and the limit.
        """
        if credits > self.settings.max_sample_items:
            raise OutOfRangeError(
                f"num_samples (batch_size in the SDK) asks for {credits} items, above the store's "
                f"max_sample_items {self.settings.max_sample_items}"
            )

    # ---- Insert -----------------------------------------------------------------------------------------

    def _insert_batch(self, req: spb.InsertRequest, abandoned: threading.Event) -> spb.InsertResponse:
        """Insert one request's items (see :meth:`ExperienceStore.insert`; ``abandoned`` as there) and answer
        them in order."""
        timeout_s = self._timeout_s(req.timeout_ms)
        results: list[int | Duplicate | MartiError] = []
        run_table, run_items = None, []  # consecutive items of one table are inserted together

        def flush() -> None:
            if run_items:
                try:
                    results.extend(self.store.insert(run_table, run_items, timeout_s, abandoned))
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
                    item, self.settings.max_item_bytes, self.settings.chunk_bytes, ITEM_LIMIT
                )
                self._check_can_hand_out(table, payload)
            except MartiError as e:
                flush()
                results.append(e)
                continue
            run_items.append(NewItem(payload, summary, item.priority, item.idempotent))
        flush()
        resp = spb.InsertResponse()
        for item, res in zip(req.items, results, strict=True):
            if isinstance(res, MartiError):
                resp.confirmations.add(client_seq=item.client_seq, status=to_status_proto(res))
            elif isinstance(res, Duplicate):
                resp.confirmations.add(
                    client_seq=item.client_seq, key=res.key, status=ok_status(), duplicate=True
                )
            else:
                resp.confirmations.add(client_seq=item.client_seq, key=res, status=ok_status())
        return resp

    def _check_can_hand_out(self, table: str, payload: bytes) -> None:
        """Refuse an item that no sample or read response could carry under ``max_message_bytes`` (an insert
        message may carry a little more than a response, whose item has more fields, and a client may have a
        higher limit than the store): stored, it would fail every sample that picks it, and jam a queue.

        Raises:
            ResourceExhaustedError: naming its size in a response and ``max_message_bytes``.
        """
        budget = message_budget(self.settings.max_message_bytes)
        if 2 * len(payload) + 4 * len(table) + 1024 <= budget:
            return  # surely fits: the entry is under 1.5 x the payload (a frame's 4-byte length prefix becomes 2
            # to 6 bytes of tag and length), the table's UTF-8 and 128 bytes of other fields, tags and lengths
        entry = pb.SampledItem(table=table)
        entry.MergeFrom(_LARGEST_ENTRY)
        convert.payload_into(payload, pb.PAYLOAD_FORMAT_ENCODED, entry, self.settings.max_item_bytes)
        size = item_bytes(entry)
        if size > budget:
            raise ResourceExhaustedError(
                f"it is {size} bytes encoded in a sample response, over the {budget} bytes a response carries "
                f"under {MESSAGE_LIMIT}={self.settings.max_message_bytes}: the store could never hand it out, so "
                "it was not inserted; send smaller items, or raise the limit on the store and the clients alike"
            )

    def store_default(self) -> str:
        """Name of the table used when an item names none."""
        return self.settings.default_table or DEFAULT_TABLE

    async def Insert(self, request_iterator, context) -> AsyncIterator[spb.InsertResponse]:  # noqa: N802
        """See the proto: one response per request, after commit. A request waiting for room when the call is
        cancelled (the client went away) stops waiting at once; its items from the waiting one on are not
        inserted."""
        async for req in request_iterator:
            yield await self._run_abandonable(partial(self._insert_batch, req), self.store.notify)

    # ---- Sample -----------------------------------------------------------------------------------------

    async def Sample(self, request_iterator, context) -> AsyncIterator[spb.SampleResponse]:  # noqa: N802
        """See the proto: credit-based flow control; never more items in flight than credits granted. A take is
        committed only after its responses were handed to the transport; with ``confirm``, the stream's takes are
        committed only once the client acknowledged them all (after the last response, marked ``needs_ack``), and
        put back when the stream ends, breaks or is cancelled first, or the ack does not come in ``timeout_ms``."""
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
        self._check_credits(first.num_samples)
        timeout_s = self._timeout_s(first.timeout_ms)
        max_batch = min(first.max_batch_items or self.settings.max_batch_items, self.settings.max_batch_items)
        stream = SampleStream(it, first.num_samples)
        held: list = []  # takes sent and not yet committed
        try:
            while stream.credits > 0 if first.confirm else await stream.wait_credits():
                self._check_credits(stream.credits)  # a later request may have added credits
                n = stream.credits if first.whole_batch else min(stream.credits, max_batch)
                try:
                    take = await self._take(
                        table, n, timeout_s, filt, current, first.whole_batch, first.whole_groups
                    )
                except MartiError as e:  # DEADLINE_EXCEEDED: in-band, outstanding credits dropped
                    stream.credits = 0
                    yield spb.SampleResponse(
                        status=to_status_proto(e), needs_ack=first.confirm and bool(held)
                    )
                    continue
                held.append(take)
                stream.credits -= take.consumed
                responses = await self._run(
                    self._sample_responses, table.name, take.items, first.format, max_batch
                )
                responses[-1].needs_ack = first.confirm and stream.credits <= 0
                for resp in responses:
                    yield resp
                if not first.confirm:
                    await self._run(table.commit, held.pop())
            if held:  # confirm: commit every take once the client acknowledged them all
                if not await stream.wait_ack(timeout_s):
                    raise DeadlineExceededError(
                        f"sample from table {table.name!r}: the client did not acknowledge the items within "
                        f"{timeout_s} s (or closed its side first); they were put back"
                    )
                while held:
                    await self._run(table.commit, held[0])
                    held.pop(0)
        finally:
            for take in held:
                table.release(take)  # a no-op once committed
            await stream.close()

    async def _take(self, table, n: int, timeout_s: float, filt, current, whole: bool, groups: bool):
        """``table.take`` on the pool. If the call is cancelled meanwhile (the client went away), a waiting take
        gives up at once and one that already took items puts them back."""
        return await self._run_abandonable(
            lambda abandoned: table.take(n, timeout_s, filt, current, whole, abandoned, groups),
            table.notify,
            table.release,
        )

    def _sample_responses(self, table: str, items, fmt: int, max_batch: int) -> list[spb.SampleResponse]:
        """One take's items as responses of at most ``max_batch`` items each, each under ``max_message_bytes``
        (:meth:`_pages`; stale and dropped items go as keys and episode ids)."""
        entries = [self._sampled_item(table, s, fmt) for s in items]
        sizes = [
            _id_bytes(s.record) if m is None else item_bytes(m) for s, m in zip(items, entries, strict=True)
        ]
        responses = []
        for page in self._pages(sizes, max_batch, lambda i: _item_name(items[i].record)):
            resp = spb.SampleResponse(status=ok_status())
            for i in page:
                self._into_sample_response(resp, items[i], entries[i])
            responses.append(resp)
        return responses

    def _sampled_item(self, table: str, s, fmt: int) -> pb.SampledItem | None:
        """A taken item as the response's item (None for a stale or dropped one: sent as its key)."""
        if s.stale or s.dropped:
            return None
        r = s.record
        m = pb.SampledItem(
            key=r.key, table=table, priority=r.priority, probability=s.probability,
            importance_weight=s.importance_weight, times_sampled=r.times_sampled, table_size=s.table_size,
        )  # fmt: skip
        convert.payload_into(s.payload, fmt, m, self.settings.max_item_bytes)
        return m

    @staticmethod
    def _into_sample_response(resp: spb.SampleResponse, s, item: pb.SampledItem | None) -> None:
        r = s.record
        if s.stale:
            resp.stale_keys.append(r.key)
            resp.stale_episode_ids.append(r.episode_id)
        elif s.dropped:
            resp.dropped_keys.append(r.key)
            resp.dropped_episode_ids.append(r.episode_id)
        else:
            resp.items.append(item)

    def _pages(self, sizes: list[int], max_items: int, name: Callable[[int], str]) -> list[range]:
        """Cut a response's entries of these ``sizes`` (bytes) into pages of at most ``max_items`` whose bytes fit
        in a message under ``max_message_bytes`` (:func:`marti.rpc.paging.pages`).

        Raises:
            ResourceExhaustedError: an entry alone does not fit, naming it (``name(i)``), its size and the setting.
        """
        budget = message_budget(self.settings.max_message_bytes)
        for i, size in enumerate(sizes):
            if size > budget:
                raise ResourceExhaustedError(
                    f"{name(i)} is {size} bytes encoded, over the {budget} bytes a response carries under "
                    f"{MESSAGE_LIMIT}={self.settings.max_message_bytes}; raise it on the store and the clients "
                    "alike to read it"
                )
        return pages(sizes, max_items, budget)

    # ---- unary ------------------------------------------------------------------------------------------

    async def UpdatePriorities(self, request, context) -> spb.UpdatePrioritiesResponse:  # noqa: N802
        """See the proto."""
        updates = {u.key: u.priority for u in request.updates}
        if len(updates) != len(request.updates):
            raise InvalidArgumentError("updates name the same key more than once")
        updated, missing = await self._run(self.store.update_priorities, request.table, updates)
        return spb.UpdatePrioritiesResponse(updated=updated, missing=missing)

    async def Delete(self, request, context) -> spb.DeleteResponse:  # noqa: N802
        """See the proto."""
        deleted = await self._run(self.store.delete, request.table, list(request.episode_ids))
        return spb.DeleteResponse(deleted=deleted)

    async def Reset(self, request, context) -> spb.ResetResponse:  # noqa: N802
        """See the proto."""
        return spb.ResetResponse(deleted=await self._run(self.store.reset, request.table))

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
            for resp in await self._run(self._stored_responses, items[i : i + step], request.format):
                yield resp

    def _stored_responses(self, items, fmt: int) -> list[spb.GetAllExperiencesResponse]:
        """Stored items as responses of at most ``max_batch_items`` each, each under ``max_message_bytes``."""
        entries = []
        for rec, payload in items:
            m = pb.StoredItem(
                key=rec.key, table=rec.table, priority=rec.priority, times_sampled=rec.times_sampled
            )
            convert.payload_into(payload, fmt, m, self.settings.max_item_bytes)
            entries.append(m)
        sizes = [item_bytes(m) for m in entries]
        pages_ = self._pages(sizes, self.settings.max_batch_items, lambda i: _item_name(items[i][0]))
        return [
            spb.GetAllExperiencesResponse(status=ok_status(), items=entries[p.start : p.stop]) for p in pages_
        ]

    def close(self) -> None:
        """Stop the pool and close the store (wakes waiting callers first)."""
        self.store.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._waits.shutdown(wait=False, cancel_futures=True)
