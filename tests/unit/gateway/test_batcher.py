"""The request batcher: concurrent prompts of one agent share engine calls, bounded by size, wait and queue."""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter

import pytest

from marti.errors import InvalidArgumentError, ResourceExhaustedError, UnavailableError
from marti.types.inference import Generation, SamplingParams
from services.gateway.core.batcher import RequestBatcher

S = SamplingParams(max_new_tokens=2)


class Engine:
    """Echoes each prompt's last id + 1 and records the batches it ran (a pure stand-in for ``generate``)."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.batches: list[tuple[str, int | None, int]] = []
        self.gate = gate

    def __call__(self, agent, prompts, sampling, version):
        if self.gate is not None:
            self.gate.wait(10)
        self.batches.append((agent, version, len(prompts)))
        if any(p == [666] for p in prompts):
            raise InvalidArgumentError("prompt 666 is refused")
        return [Generation(p, [p[-1] + 1], [-1.0], "t", "stop", version or 0, agent) for p in prompts]


async def test_concurrent_requests_share_one_engine_call_in_order():
    eng = Engine()
    b = RequestBatcher(eng, max_batch=8, max_wait_ms=50, max_queue=100)
    outs = await asyncio.gather(*[b.submit("a", [[i]], S, None) for i in range(5)])
    assert [o[0].response_token_ids for o in outs] == [[i + 1] for i in range(5)]
    assert eng.batches == [("a", None, 5)]
    await b.close()


async def test_max_batch_splits_and_keys_separate_agents_versions_and_sampling():
    eng = Engine()
    b = RequestBatcher(eng, max_batch=3, max_wait_ms=20, max_queue=100)
    await asyncio.gather(
        b.submit("a", [[1]] * 7, S, None),
        b.submit("b", [[1]], S, None),
        b.submit("a", [[1]], S, 4),
        b.submit("a", [[1]], SamplingParams(max_new_tokens=3), None),
    )
    assert Counter(eng.batches) == Counter(
        [("a", None, 3), ("a", None, 3), ("a", None, 1), ("b", None, 1), ("a", 4, 1), ("a", None, 1)]
    )
    await b.close()


async def test_queue_limit_refuses_at_its_edge_and_frees_after():
    gate = threading.Event()
    eng = Engine(gate)
    b = RequestBatcher(eng, max_batch=2, max_wait_ms=0, max_queue=3)
    first = asyncio.ensure_future(b.submit("a", [[1]] * 3, S, None))  # exactly the limit
    await asyncio.sleep(0.05)
    assert b.load("a") == 3
    with pytest.raises(ResourceExhaustedError, match="max_queue"):
        await b.submit("a", [[1]], S, None)
    gate.set()
    assert len(await first) == 3 and b.load("a") == 0
    assert len(await b.submit("a", [[1]], S, None)) == 1
    await b.close()


async def test_an_engine_error_reaches_every_waiter_of_its_batch_and_the_next_batch_runs():
    eng = Engine()
    b = RequestBatcher(eng, max_batch=8, max_wait_ms=30, max_queue=100)
    res = await asyncio.gather(
        b.submit("a", [[666]], S, None), b.submit("a", [[1]], S, None), return_exceptions=True
    )
    assert all(isinstance(r, InvalidArgumentError) for r in res)
    assert (await b.submit("a", [[2]], S, None))[0].response_token_ids == [3]
    await b.close()


async def test_a_cancelled_request_does_not_break_its_batch():
    eng = Engine(threading.Event())
    b = RequestBatcher(eng, max_batch=8, max_wait_ms=20, max_queue=100)
    gone = asyncio.ensure_future(b.submit("a", [[1]], S, None))
    kept = asyncio.ensure_future(b.submit("a", [[2]], S, None))
    await asyncio.sleep(0.05)
    gone.cancel()
    eng.gate.set()
    assert (await kept)[0].response_token_ids == [3]
    assert b.load("a") == 0
    await b.close()


class SeededEngine:
    """Samples each prompt's token from one RNG per engine call seeded by ``sampling.seed``: a row's token
    depends on what else is in its batch, as a real batched sampler's does."""

    def __init__(self) -> None:
        self.batches: list[list[list[int]]] = []

    def __call__(self, agent, prompts, sampling, version):
        self.batches.append(list(prompts))
        rng = random.Random(sampling.seed)
        return [Generation(p, [rng.randrange(1000)], [-1.0], "t", "stop", 0, agent) for p in prompts]


async def test_a_seeded_request_runs_alone_and_gives_the_same_tokens_whatever_else_is_in_flight():
    seeded = SamplingParams(max_new_tokens=2, seed=7)
    eng = SeededEngine()
    b = RequestBatcher(eng, max_batch=8, max_wait_ms=10_000, max_queue=100)
    alone = await asyncio.wait_for(b.submit("a", [[1]] * 3, seeded, None), 2)  # does not wait max_wait_ms
    assert eng.batches == [[[1]] * 3]
    crowded = await asyncio.wait_for(
        asyncio.gather(
            b.submit(
                "a", [[2]], seeded, None
            ),  # same agent, version and sampling: still not batched together
            b.submit("a", [[1]] * 3, seeded, None),
            b.submit("a", [[3]] * 2, seeded, None),
        ),
        2,
    )
    assert [o.response_token_ids for o in crowded[1]] == [o.response_token_ids for o in alone]
    assert sorted(map(len, eng.batches[1:])) == [1, 2, 3]
    await b.close()


async def test_unseeded_requests_still_share_a_batch_and_a_seeded_one_larger_than_max_batch_is_split():
    eng = SeededEngine()
    b = RequestBatcher(eng, max_batch=2, max_wait_ms=20, max_queue=100)
    await b.submit("a", [[1]] * 3, SamplingParams(max_new_tokens=2, seed=1), None)
    assert [len(x) for x in eng.batches] == [2, 1]
    await asyncio.gather(b.submit("a", [[1]], S, None), b.submit("a", [[2]], S, None))
    assert eng.batches[2:] == [[[1], [2]]]
    await b.close()


async def test_close_fails_batches_waiting_for_the_engine_and_waits_only_for_the_running_one():
    from marti.errors import UnavailableError

    gate = threading.Event()
    eng = Engine(gate)
    b = RequestBatcher(eng, max_batch=1, max_wait_ms=0, max_queue=100)
    running = asyncio.ensure_future(b.submit("a", [[1]], S, None))
    waiting = [
        asyncio.ensure_future(b.submit("a", [[i]], SamplingParams(max_new_tokens=i + 1), None))
        for i in (2, 3)
    ]
    await asyncio.sleep(0.05)  # one batch in the engine thread, two waiting for it
    closing = asyncio.ensure_future(b.close())
    await asyncio.sleep(0.05)
    gate.set()
    await asyncio.wait_for(closing, 10)
    assert (await running)[0].response_token_ids == [2]
    for w in waiting:
        with pytest.raises(UnavailableError, match="shutting down"):
            await w
    assert eng.batches == [("a", None, 1)]  # the waiting batches never ran


async def test_requests_that_trickle_in_while_the_engine_is_busy_meet_in_one_batch():
    """Arrivals spaced wider than max_wait_ms, during a running batch, wait for the engine together (not one
    engine call each), and the batch started first is the one whose oldest prompt came first."""
    gate = threading.Event()
    eng = Engine(gate)
    b = RequestBatcher(eng, max_batch=8, max_wait_ms=1, max_queue=100)
    first = asyncio.ensure_future(b.submit("a", [[0]], S, None))
    await asyncio.sleep(0.05)  # in the engine, held by the gate
    later = []
    for i in range(1, 6):
        later.append(asyncio.ensure_future(b.submit("a", [[i]], S, None)))
        await asyncio.sleep(0.01)  # 10x max_wait_ms between arrivals
    other = asyncio.ensure_future(b.submit("b", [[9]], S, None))
    await asyncio.sleep(0.01)
    gate.set()
    outs = await asyncio.gather(first, *later, other)
    assert [o[0].response_token_ids for o in outs] == [[1], [2], [3], [4], [5], [6], [10]]
    assert eng.batches == [("a", None, 1), ("a", None, 5), ("b", None, 1)]
    await b.close()
    with pytest.raises(UnavailableError, match="shutting down"):
        await b.submit("a", [[1]], S, None)


async def test_a_full_batch_goes_first_and_a_filling_one_never_exceeds_max_batch():
    gate = threading.Event()
    eng = Engine(gate)
    b = RequestBatcher(eng, max_batch=3, max_wait_ms=1, max_queue=100)
    first = asyncio.ensure_future(b.submit("a", [[0]], S, None))
    await asyncio.sleep(0.05)
    lone = asyncio.ensure_future(b.submit("b", [[0]], S, None))  # ready first, but not full
    await asyncio.sleep(0.01)
    crowd = asyncio.ensure_future(b.submit("a", [[1]] * 7, S, None))  # 3 + 3 full, 1 filling
    await asyncio.sleep(0.01)
    gate.set()
    await asyncio.gather(first, lone, crowd)
    assert eng.batches == [("a", None, 1), ("a", None, 3), ("a", None, 3), ("b", None, 1), ("a", None, 1)]
    await b.close()


async def test_a_lone_request_does_not_wait_max_wait_ms():
    """With the engine idle and nothing else queued or on its way, waiting could only delay a request: it runs at
    once (with the prompts submitted in the same event-loop turn), and is counted in ``lone_batches``."""
    eng = Engine()
    b = RequestBatcher(eng, max_batch=8, max_wait_ms=60_000, max_queue=100)
    for i in range(3):  # one call after another, as an agent makes them
        out = await asyncio.wait_for(b.submit("a", [[i]], S, None), 5)
        assert out[0].response_token_ids == [i + 1]
    await asyncio.wait_for(asyncio.gather(*[b.submit("a", [[i]], S, None) for i in range(4)]), 5)
    assert eng.batches == [("a", None, 1)] * 3 + [("a", None, 4)]
    assert b.lone_batches == 4
    await b.close()


async def test_a_batch_waits_max_wait_ms_for_company_and_not_longer():
    """With the engine idle but another request on its way (:meth:`RequestBatcher.expecting`), a request arriving
    within ``max_wait_ms`` of the first joins its batch, which starts once the first has waited ``max_wait_ms``;
    with ``max_wait_ms`` 0 the same arrivals run one by one."""
    loop = asyncio.get_running_loop()
    eng = Engine()
    b = RequestBatcher(eng, max_batch=8, max_wait_ms=1000, max_queue=100)  # far past a late 0.05 s sleep
    t0 = loop.time()
    with b.expecting():  # the second request is being tokenized
        first = asyncio.ensure_future(b.submit("a", [[0]], S, None))
        await asyncio.sleep(0.05)
    assert eng.batches == []  # still waiting for company
    second = asyncio.ensure_future(b.submit("a", [[1]], S, None))
    await asyncio.gather(first, second)
    assert b.lone_batches == 0
    waited = loop.time() - t0
    assert eng.batches == [("a", None, 2)]
    assert 0.99 <= waited < 10.0, waited
    await b.close()

    eager = Engine()
    b = RequestBatcher(eager, max_batch=8, max_wait_ms=0, max_queue=100)
    first = asyncio.ensure_future(b.submit("a", [[0]], S, None))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(b.submit("a", [[1]], S, None))
    await asyncio.gather(first, second)
    assert eager.batches == [("a", None, 1), ("a", None, 1)]
    await b.close()


async def test_a_request_cancelled_while_queued_is_never_run():
    """Callers that went away before their batch started cost the engine nothing: their prompts are dropped
    from the batch (a batch left empty is skipped), and the others run."""
    eng = Engine(threading.Event())
    b = RequestBatcher(eng, max_batch=8, max_wait_ms=0, max_queue=100)
    running = asyncio.ensure_future(b.submit("a", [[1]], S, None))
    await asyncio.sleep(0.05)  # in the engine, held by the gate
    gone_alone = asyncio.ensure_future(b.submit("a", [[10]], S, None))
    kept = asyncio.ensure_future(b.submit("b", [[20]], S, None))
    gone = asyncio.ensure_future(b.submit("c", [[30], [31]], S, None))
    kept_too = asyncio.ensure_future(b.submit("c", [[40]], S, None))
    await asyncio.sleep(0.05)  # all queued behind the running batch
    gone_alone.cancel()
    gone.cancel()
    eng.gate.set()
    assert (await running)[0].response_token_ids == [2]
    assert (await kept)[0].response_token_ids == [21]
    assert (await kept_too)[0].response_token_ids == [41]
    assert gone_alone.cancelled() and gone.cancelled()
    assert eng.batches == [("a", None, 1), ("b", None, 1), ("c", None, 1)]
    assert b.dropped_prompts == 3 and b.prompts == 3
    assert all(b.load(a) == 0 for a in "abc")
    await b.close()
