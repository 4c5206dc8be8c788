"""Micro-batching of concurrent requests per agent into the rollout engine.

Requests of one agent that share a policy version and sampling parameters wait together until ``max_batch``
prompts are queued or the oldest has waited ``max_wait_ms``; then one engine call serves them all (the dynamic
batching of Triton and vLLM's OpenAI server, here in front of a batch ``generate``). A request with a sampling
seed never shares a batch with other requests (its own prompts run together, at once), so the same seeded request
gives the same tokens whatever else is in flight. Engine calls run one at a time in a worker thread, so the event
loop keeps accepting requests while a batch runs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from marti.errors import ResourceExhaustedError, UnavailableError
from marti.inference import Generation, SamplingParams

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
        self._queues: dict[_Key, _Queue] = {}
        self._load: dict[str, int] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="marti-gateway-engine")
        self._tasks: set[asyncio.Task[None]] = set()
        self._seeded = itertools.count(1)
        self.batches = 0
        self.prompts = 0

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
            Whatever the engine call raises for the batch the prompts ran in.
        """
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
            q = self._queues.setdefault(key, _Queue())
            fut: asyncio.Future[Generation] = loop.create_future()
            q.prompts.append(p)
            q.futures.append(fut)
            futures.append(fut)
            if len(q.prompts) >= self.max_batch:
                self._flush(key)
            elif q.timer is None and not seeded:
                q.timer = loop.call_later(self.max_wait_s, self._flush, key)
        if seeded:
            self._flush(key)  # nothing else can join its batch: no reason to wait
        try:
            return list(await asyncio.gather(*futures))
        finally:
            self._load[agent] -= len(prompts)

    def _flush(self, key: _Key) -> None:
        q = self._queues.pop(key, None)
        if q is None or not q.prompts:
            return
        if q.timer is not None:
            q.timer.cancel()
        task = asyncio.get_running_loop().create_task(self._run_batch(key, q.prompts, q.futures))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_batch(
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
        """Fail queued prompts, and batches waiting for the engine thread, with UnavailableError (503 /
        UNAVAILABLE: the gateway is shutting down; a retry elsewhere or later may succeed), wait for the batch
        the engine is running, and stop the worker thread."""
        for key in list(self._queues):
            q = self._queues.pop(key)
            if q.timer is not None:
                q.timer.cancel()
            for f in q.futures:
                if not f.done():
                    f.set_exception(UnavailableError("the gateway is shutting down"))
        self._executor.shutdown(wait=False, cancel_futures=True)  # batches not started yet end now
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._executor.shutdown(wait=True)
