"""Micro-batching of concurrent requests per agent into the rollout engine.

Requests of one agent that share a policy version and sampling parameters wait together until ``max_batch``
prompts are queued or the oldest has waited ``max_wait_ms``; then one engine call serves them all (the dynamic
batching of Triton and vLLM's OpenAI server, here in front of a batch ``generate``). Engine calls run one at a time
in a worker thread, so the event loop keeps accepting requests while a batch runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from marti.errors import ResourceExhaustedError
from marti.inference import Generation, SamplingParams

_LOG = logging.getLogger("marti.gateway.batcher")

#: ``run(agent, prompts, sampling, version)``: one blocking engine call.
RunBatch = Callable[[str, Sequence[list[int]], SamplingParams, "int | None"], list[Generation]]
_Key = tuple[str, "int | None", SamplingParams]


@dataclass
class _Queue:
    prompts: list[list[int]] = field(default_factory=list)
    futures: list[asyncio.Future[Generation]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class RequestBatcher:
    """Collects prompts per (agent, version, sampling) and runs them in batches.

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
        self.batches = 0
        self.prompts = 0

    def load(self, agent: str) -> int:
        """Prompts of ``agent`` queued or running now."""
        return self._load.get(agent, 0)

    async def submit(
        self, agent: str, prompts: Sequence[list[int]], sampling: SamplingParams, version: int | None
    ) -> list[Generation]:
        """Queue B prompts and wait for their generations (in order).

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
        key = (agent, version, sampling)
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
            elif q.timer is None:
                q.timer = loop.call_later(self.max_wait_s, self._flush, key)
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
        agent, version, sampling = key
        loop = asyncio.get_running_loop()
        try:
            gens = await loop.run_in_executor(self._executor, self._run, agent, prompts, sampling, version)
            if len(gens) != len(prompts):
                raise RuntimeError(f"the engine returned {len(gens)} generations for {len(prompts)} prompts")
        except BaseException as exc:  # every waiter of the batch gets the error
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
        """Fail queued prompts, wait for running batches, and stop the worker thread."""
        for key in list(self._queues):
            q = self._queues.pop(key)
            if q.timer is not None:
                q.timer.cancel()
            for f in q.futures:
                if not f.done():
                    f.set_exception(ResourceExhaustedError("the gateway is shutting down"))
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._executor.shutdown(wait=True)
