"""Micro-batching of concurrent requests per agent into the rollout engine.

Requests of one agent that share a policy version and sampling parameters are collected into a batch, which is
ready when ``max_batch`` prompts are queued or its oldest has waited ``max_wait_ms``; one engine call then serves
them all (the dynamic batching of Triton and vLLM's OpenAI server, here in front of a batch ``generate``). Engine
calls run one at a time in a worker thread, so the event loop keeps accepting requests while a batch runs, and
**a batch keeps filling while the engine is busy**: it is started only when the engine is free (a full batch
first, else the ready batch whose oldest prompt came first). Clients that send their next request as soon as
their answer arrives therefore meet again in one batch instead of trickling into many small ones. A request with a
sampling seed never shares a batch with other requests (its own prompts run together, without waiting), so the
same seeded request gives the same tokens whatever else is in flight. **A lone request does not wait**: when the
engine is idle, nothing else is queued and no other request is on its way (:meth:`RequestBatcher.expecting`: the
gateway counts requests whose prompts are being tokenized), waiting ``max_wait_ms`` could only delay it, so its
batch is ready at once (still after the other prompts submitted in the same event-loop turn have joined it);
an agent calling the gateway one call after another pays no batching delay. A prompt whose caller went away while it
was still queued (its request cancelled: a gRPC deadline or cancel) is dropped before its batch starts, so
abandoned requests do not hold up the others; one already in the engine runs to the end, and its result is
discarded.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from marti.errors import ResourceExhaustedError, UnavailableError
from marti.types.inference import Generation, SamplingParams

_LOG = logging.getLogger("marti.gateway.batcher")

#: ``run(agent, prompts, sampling, version)``: one blocking engine call.
RunBatch = Callable[[str, Sequence[list[int]], SamplingParams, "int | None"], list[Generation]]
#: (agent, version, sampling, 0 or the unique number of a seeded request)
_Key = tuple[str, "int | None", SamplingParams, int]


@dataclass
class _Queue:
    prompts: list[list[int]] = field(default_factory=list)
    futures: list[asyncio.Future[Generation]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None
    ready: bool = (
        False  # its oldest prompt waited max_wait_ms (or it is seeded): it runs when the engine is free
    )
    order: int = 0  # arrival order of its first prompt (ready batches start oldest first)


class RequestBatcher:
    """Collects prompts per (agent, version, sampling) and runs them in batches; a seeded request's prompts run
    in batches of their own, without waiting for others.

    Args:
        run: The blocking engine call.
        max_batch: Most prompts per engine call, > 0.
        max_wait_ms: Most milliseconds the first prompt of a batch waits for more, >= 0.
        max_queue: Most prompts queued or running per agent; more raise :class:`ResourceExhaustedError`.
    """

    def __init__(self, run: RunBatch, *, max_batch: int, max_wait_ms: float, max_queue: int) -> None:
        self._run = run
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self._queues: dict[_Key, _Queue] = {}  # batches still filling (ready ones included)
        self._full: collections.deque[tuple[_Key, _Queue]] = (
            collections.deque()
        )  # full, waiting for the engine
        self._busy = False  # a batch is in the engine (or about to be)
        self._arrivals = itertools.count()
        self._load: dict[str, int] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="marti-gateway-engine")
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._seeded = itertools.count(1)
        self.batches = 0
        self.prompts = 0
        self.dropped_prompts = 0  # queued prompts not run: their caller went away before their batch started
        self._expected = 0  # requests on their way (being tokenized): a lone batch waits for them
        self.lone_batches = 0  # batches started without waiting max_wait_ms: nothing else queued or expected

    @contextlib.contextmanager
    def expecting(self) -> Iterator[None]:
        """Within the block, one more request is on its way to :meth:`submit` (its prompt being tokenized), so
        a lone prompt submitted meanwhile waits ``max_wait_ms`` for it instead of starting at once. Event-loop
        thread only."""
        self._expected += 1
        try:
            yield
        finally:
            self._expected -= 1

    def _alone(self) -> bool:
        """Whether a new batch has nothing to wait for: the engine idle, no other batch queued, no request on
        its way."""
        return not (self._busy or self._full or self._queues or self._expected)

    def load(self, agent: str) -> int:
        """Prompts of ``agent`` queued or running now."""
        return self._load.get(agent, 0)

    async def submit(
        self, agent: str, prompts: Sequence[list[int]], sampling: SamplingParams, version: int | None
    ) -> list[Generation]:
        """Queue B prompts and wait for their generations (in order).

        Prompts of requests with the same agent, version and sampling share engine calls of up to ``max_batch``
        prompts; when ``sampling.seed`` is set the request's prompts are batched only with each other and run
        without waiting ``max_wait_ms``.

        Raises:
            ResourceExhaustedError: The agent already has ``max_queue`` prompts queued or running (nothing of
                this request is queued).
            UnavailableError: The batcher was closed.
            Whatever the engine call raises for the batch the prompts ran in.
        """
        if self._closed:
            raise UnavailableError("the gateway is shutting down")
        load = self._load.get(agent, 0)
        if load + len(prompts) > self.max_queue:
            raise ResourceExhaustedError(
                f"agent {agent!r} is overloaded: {load} prompts queued or running, this request adds "
                f"{len(prompts)}, the limit (gateway.max_queue) is {self.max_queue}"
            )
        loop = asyncio.get_running_loop()
        seeded = sampling.seed is not None
        key = (agent, version, sampling, next(self._seeded) if seeded else 0)
        futures = []
        self._load[agent] = load + len(prompts)
        for p in prompts:
            q = self._queues.get(key)
            if q is None:
                alone = self._alone()
                q = self._queues[key] = _Queue(order=next(self._arrivals))
                if seeded:  # nothing else can join its batch: no reason to wait
                    q.ready = True
                else:  # alone: ready once this loop turn's other submits have joined it
                    self.lone_batches += alone
                    q.timer = loop.call_later(0.0 if alone else self.max_wait_s, self._mark_ready, key, q)
            fut: asyncio.Future[Generation] = loop.create_future()
            q.prompts.append(p)
            q.futures.append(fut)
            futures.append(fut)
            if len(q.prompts) >= self.max_batch:
                del self._queues[key]
                if q.timer is not None:
                    q.timer.cancel()
                self._full.append((key, q))
        self._dispatch()
        try:
            return list(await asyncio.gather(*futures))
        finally:
            self._load[agent] -= len(prompts)

    def _mark_ready(self, key: _Key, q: _Queue) -> None:
        """Timer callback: the batch's oldest prompt waited ``max_wait_ms``."""
        q.timer = None
        q.ready = True
        self._dispatch()

    def _dispatch(self) -> None:
        """Start the next batch if the engine is free: the oldest full batch, else the ready batch that began
        first (it keeps filling until then). Its prompts whose futures were cancelled (the caller went away)
        are dropped (``dropped_prompts``); a batch with none left is skipped."""
        if self._busy:
            return
        while True:
            if self._full:
                key, q = self._full.popleft()
            else:
                ready = [(q.order, key) for key, q in self._queues.items() if q.ready]
                if not ready:
                    return
                key = min(ready)[1]
                q = self._queues.pop(key)
            if q.timer is not None:
                q.timer.cancel()
            # a prompt whose caller went away while it was queued (its future cancelled) is not run
            live = [(p, f) for p, f in zip(q.prompts, q.futures, strict=True) if not f.done()]
            self.dropped_prompts += len(q.prompts) - len(live)
            if live:
                break
        prompts, futures = [p for p, _ in live], [f for _, f in live]
        self._busy = True
        task = asyncio.get_running_loop().create_task(self._run_batch(key, prompts, futures))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_batch(
        self, key: _Key, prompts: list[list[int]], futures: list[asyncio.Future[Generation]]
    ) -> None:
        try:
            await self._run_one(key, prompts, futures)
        finally:
            self._busy = False
            if not self._closed:
                self._dispatch()

    async def _run_one(
        self, key: _Key, prompts: list[list[int]], futures: list[asyncio.Future[Generation]]
    ) -> None:
        agent, version, sampling, _ = key
        loop = asyncio.get_running_loop()
        try:
            gens = await loop.run_in_executor(self._executor, self._run, agent, prompts, sampling, version)
            if len(gens) != len(prompts):
                raise RuntimeError(f"the engine returned {len(gens)} generations for {len(prompts)} prompts")
        except BaseException as exc:  # every waiter of the batch gets the error
            if isinstance(exc, asyncio.CancelledError):  # its engine call was cancelled by close()
                exc = UnavailableError("the gateway is shutting down")
            for f in futures:
                if not f.done():
                    f.set_exception(exc)
            return
        self.batches += 1
        self.prompts += len(prompts)
        for f, g in zip(futures, gens, strict=True):
            if not f.done():  # a client that went away cancelled its future
                f.set_result(g)

    async def close(self) -> None:
        """Fail queued prompts, and batches waiting for the engine, with UnavailableError (503 / UNAVAILABLE: the
        gateway is shutting down; a retry elsewhere or later may succeed), wait for the batch the engine is
        running, and stop the worker thread."""
        self._closed = True
        waiting = [q for _, q in self._full] + list(self._queues.values())
        self._full.clear()
        self._queues.clear()
        for q in waiting:
            if q.timer is not None:
                q.timer.cancel()
            for f in q.futures:
                if not f.done():
                    f.set_exception(UnavailableError("the gateway is shutting down"))
        self._executor.shutdown(wait=False, cancel_futures=True)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._executor.shutdown(wait=True)
