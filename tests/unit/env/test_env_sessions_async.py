"""Session core, event-loop face: env calls on a bounded worker pool, one at a time per session, in order."""

from __future__ import annotations

import asyncio
import threading
import time

import gymnasium
import pytest
from pydantic import ValidationError
from waits import until_async

from marti.env.config import ConfigSchema
from marti.env.registry import EnvSpec, Registry
from marti.errors import AlreadyExistsError, InvalidArgumentError, ResourceExhaustedError, SessionLostError
from services.env_server.core.sessions import MAX_WORKERS, SessionManager
from services.env_server.settings import EnvServerSettings

HOLD_S = 10.0  # most seconds a held step waits for the test to let it go (or for the others to meet)


class SlowEnv:
    """One agent; ``step`` sleeps the float given as action, or with ``"gate"`` waits until the test sets
    :attr:`gate`, or with ``"meet"`` waits until :attr:`meet`'s other parties step too (each at most
    :data:`HOLD_S`, then raises); tracks overlapping calls of one instance."""

    metadata = {"name": "slow"}
    missing_action = ""
    build_s = 0.0
    gate = threading.Event()
    meet = threading.Barrier(1)

    def __init__(self, config, seed) -> None:
        time.sleep(SlowEnv.build_s)
        self.possible_agents = ["a"]
        self.agents: list[str] = []
        self.t = 0
        self.running = 0
        self.max_overlap = 0
        self.threads: set[str] = set()
        self.closed_at_t: int | None = None
        self._lock = threading.Lock()
        self._space = gymnasium.spaces.Text(32, min_length=0)

    def observation_space(self, agent):
        return self._space

    def action_space(self, agent):
        return self._space

    def reset(self, seed=None, options=None):
        self.agents, self.t = ["a"], 0
        return {"a": "0"}, {"a": {}}

    def step(self, actions):
        with self._lock:
            self.running += 1
            self.max_overlap = max(self.max_overlap, self.running)
        self.threads.add(threading.current_thread().name)
        action = actions.get("a")
        if action == "gate":
            if not SlowEnv.gate.wait(HOLD_S):
                raise TimeoutError(f"the gate stayed shut {HOLD_S} s")
        elif action == "meet":
            SlowEnv.meet.wait(HOLD_S)  # BrokenBarrierError unless the other parties step meanwhile
        else:
            time.sleep(float(action or 0))
        self.t += 1
        with self._lock:
            self.running -= 1
        return {"a": str(self.t)}, {"a": 0.0}, {"a": False}, {"a": False}, {"a": {}}

    def close(self):
        self.closed_at_t = self.t


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(autouse=True)
def _held_steps():
    """A shut gate per test, opened afterwards so that no worker stays held."""
    SlowEnv.gate = threading.Event()
    yield
    SlowEnv.gate.set()
    SlowEnv.meet.abort()


def manager(**kw) -> SessionManager:
    reg = Registry()
    reg.register(EnvSpec("slow", 1, SlowEnv, ConfigSchema(), "test env"))
    return SessionManager(reg, **kw)


async def started(m: SessionManager) -> str:
    sid = (await m.create_async("slow")).session_id
    await m.reset_async(sid)
    return sid


async def held(m: SessionManager, sid: str) -> None:
    """Return once ``sid``'s env is inside a step (one the gate holds)."""
    await until_async(lambda: m.get(sid).env.env.running == 1, f"{sid} stepping")


def test_worker_limits_at_the_edges() -> None:
    for bad in (0, MAX_WORKERS + 1):
        with pytest.raises(InvalidArgumentError, match="workers"):
            manager(workers=bad)
        with pytest.raises(ValidationError, match="step_workers"):
            EnvServerSettings(step_workers=bad)
    assert (
        manager(workers=MAX_WORKERS).workers
        == MAX_WORKERS
        == EnvServerSettings(step_workers=1024).step_workers
    )
    assert manager(workers=1).workers == 1 and EnvServerSettings().step_workers == 32


async def test_env_calls_run_in_workers_and_leave_the_loop_free() -> None:
    m = manager(workers=4)
    slow, fast = await started(m), await started(m)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.create_task(tick())
    slow_step = asyncio.create_task(m.step_async(slow, {"a": "gate"}))
    await held(m, slow)
    before = ticks
    for _ in range(20):
        await m.step_async(fast, {"a": ""})
    await until_async(lambda: ticks >= before + 20, "20 ticks of the loop while the slow step is held")
    assert not slow_step.done(), "the fast session waited for the slow one, or the loop did"
    SlowEnv.gate.set()
    assert (await slow_step).results[0].observation == "1"
    ticker.cancel()
    assert all(t.startswith("marti-env") for t in m.get(slow).env.env.threads)
    await m.close_all_async()


async def test_when_every_worker_is_busy_calls_queue_without_error() -> None:
    m = manager(workers=1)  # the edge of the limit
    a, b = await started(m), await started(m)
    first = asyncio.create_task(m.step_async(a, {"a": "gate"}))
    await held(m, a)
    second = asyncio.create_task(m.step_async(b, {"a": ""}))
    await asyncio.sleep(0.2)
    assert not second.done(), "b stepped while the only worker was busy"
    SlowEnv.gate.set()
    assert (await second).results[0].observation == "1"
    assert (await first).results[0].observation == "1"
    await m.close_all_async()


async def test_a_sessions_calls_run_alone_and_in_arrival_order() -> None:
    m = manager(workers=8)
    sid = await started(m)
    outs = await asyncio.gather(*(m.step_async(sid, {"a": "0.02"}, request_id=f"r{i}") for i in range(6)))
    assert [o.results[0].observation for o in outs] == ["1", "2", "3", "4", "5", "6"]
    assert m.get(sid).env.env.max_overlap == 1
    # a retry of a request that is still running waits for it and gets its outcome, not a second step
    again = await asyncio.gather(
        m.step_async(sid, {"a": "0.1"}, request_id="same"), m.step_async(sid, {"a": "0.1"}, request_id="same")
    )
    assert again[0] == again[1] and m.get(sid).env.env.t == 7
    await m.close_all_async()


async def test_a_cancelled_call_keeps_the_session_until_its_env_call_ends() -> None:
    m = manager(workers=4)
    sid = await started(m)
    env = m.get(sid).env.env
    task = asyncio.create_task(m.step_async(sid, {"a": "gate"}, request_id="r1"))
    await held(m, sid)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    after = asyncio.create_task(m.step_async(sid, {"a": ""}))
    await asyncio.sleep(0.1)
    assert not after.done(), "the next call ran while the cancelled call's env call was still running"
    SlowEnv.gate.set()
    out = await after
    assert out.results[0].observation == "2" and env.max_overlap == 1
    # the cancelled call's outcome was still remembered: its retry does not step again
    assert (await m.step_async(sid, {"a": "gate"}, request_id="r1")).results[0].observation == "1"
    await m.close_all_async()


async def test_close_waits_for_earlier_calls_and_later_ones_are_lost() -> None:
    m = manager(workers=4)
    sid = await started(m)
    env = m.get(sid).env.env
    step = asyncio.create_task(m.step_async(sid, {"a": "0.2"}))
    await asyncio.sleep(0.05)
    assert await m.close_async(sid) is True
    assert env.closed_at_t == 1 and (await step).results[0].observation == "1"
    with pytest.raises(SessionLostError):
        await m.step_async(sid, {"a": ""})
    assert await m.close_async(sid) is False


async def test_busy_sessions_are_not_reaped() -> None:
    clock = FakeClock()
    m = manager(workers=4, idle_timeout_s=10.0, clock=clock)
    busy, idle = await started(m), await started(m)
    step = asyncio.create_task(m.step_async(busy, {"a": "gate"}))
    await held(m, busy)
    clock.t += 10.0
    assert await m.reap_idle_async() == [idle]
    assert m.reap_idle() == []  # the plain face skips it too
    SlowEnv.gate.set()
    await step
    assert m.reap_idle() == []  # used when its call ended
    clock.t += 10.0
    assert await m.reap_idle_async() == [busy] and len(m) == 0


async def test_creates_in_flight_count_against_the_cap_and_retries_share_one_build() -> None:
    SlowEnv.build_s = 0.1
    try:
        m = manager(workers=4, max_sessions=2)
        results = await asyncio.gather(
            m.create_async("slow", request_id="c1"),
            m.create_async("slow", request_id="c1"),
            m.create_async("slow"),
            m.create_async("slow"),
            return_exceptions=True,
        )
    finally:
        SlowEnv.build_s = 0.0
    assert results[0].session_id == results[1].session_id
    assert isinstance(results[3], ResourceExhaustedError) and "max_sessions=2" in str(results[3])
    assert len(m) == 2
    assert await m.close_all_async() == 2 and len(m) == 0


async def test_close_all_waits_for_in_flight_calls() -> None:
    m = manager(workers=4)
    sid = await started(m)
    env = m.get(sid).env.env
    step = asyncio.create_task(m.step_async(sid, {"a": "0.3"}))
    await asyncio.sleep(0.05)
    step.cancel()  # as when the server's grace period ends
    assert await m.close_all_async(timeout_s=5.0) == 1
    assert env.closed_at_t == 1 and env.running == 0


# ---- BatchStep's core: step_batch_async ----
from services.env_server.core import sessions as sessions_module  # noqa: E402
from services.env_server.core.session_state import BatchItem  # noqa: E402
from services.env_server.core.sessions import (  # noqa: E402
    BATCH_JOB_SESSIONS,
    BATCH_SLOW_STEP_S,
    BATCH_WAIT_S,
)


async def test_a_batch_runs_in_one_worker_job_with_errors_per_item_and_sessions_in_item_order(
    monkeypatch,
) -> None:
    monkeypatch.setattr(sessions_module, "BATCH_WAIT_S", 10.0)  # a preempted step must not split the job here
    m = manager(workers=4)
    a, b = await started(m), await started(m)
    items = [
        BatchItem(a, {"a": ""}),
        BatchItem("nope", {"a": ""}),
        BatchItem(b, {"a": "not a float"}),  # the env raises: an InternalError for this item alone
        BatchItem(a, {"a": ""}),
        BatchItem(b, {"a": ""}),
    ]
    seen: list[int] = []
    out = await m.step_batch_async(items, lambda i, o, base: (seen.append(i), o)[1])
    assert isinstance(out[1], SessionLostError) and "nope" in str(out[1])
    assert type(out[2]).__name__ == "InternalError" and "ValueError" in str(out[2])
    assert [out[i].results[0].observation for i in (0, 3, 4)] == ["1", "2", "1"]
    assert [out[i].result_id for i in (0, 3, 4)] == [2, 3, 2]  # the reset was result 1
    assert sorted(seen) == [0, 3, 4]
    threads = m.get(a).env.env.threads | m.get(b).env.env.threads
    assert len(threads) == 1, "one job for the whole group"
    assert m.get(a).pending == 0 and not m.get(a).lock.locked()
    await m.close_all_async()


async def test_a_batch_hands_the_base_only_when_it_is_the_sessions_last_outcome() -> None:
    m = manager(workers=2)
    sid = await started(m)  # reset: result 1
    bases: list = []
    post = lambda i, o, base: (bases.append(base and base.result_id), o)[1]  # noqa: E731
    await m.step_batch_async([BatchItem(sid, {"a": ""}, "r1", delta_base=1)], post)
    await m.step_batch_async([BatchItem(sid, {"a": ""}, "r2", delta_base=1)], post)  # stale base: full
    await m.step_batch_async(
        [BatchItem(sid, {"a": ""}, "r2", delta_base=2)], post
    )  # retried id: cached, full
    await m.step_batch_async([BatchItem(sid, {"a": ""}, "r3", delta_base=3)], post)
    assert bases == [1, None, None, 3]
    assert (await m.step_async(sid, {"a": ""}, post=lambda o, base: base, delta_base=4)).result_id == 4
    await m.close_all_async()


async def test_a_slow_step_hands_the_rest_of_its_group_out(monkeypatch) -> None:
    """The first step sleeps past the slow-step mark; the other three then run side by side: each waits until
    all three are stepping (run in a row, the first of them would wait :data:`HOLD_S` and fail)."""
    assert BATCH_JOB_SESSIONS >= 4 and BATCH_SLOW_STEP_S < 0.3
    monkeypatch.setattr(sessions_module, "BATCH_WAIT_S", 10.0)  # only the slow-step mark can hand out here
    monkeypatch.setattr(sessions_module, "BATCH_JOB_BUDGET_S", 10.0)
    SlowEnv.meet = threading.Barrier(3)
    m = manager(workers=8)
    sids = [await started(m) for _ in range(4)]
    out = await m.step_batch_async([BatchItem(s, {"a": "0.3" if s == sids[0] else "meet"}) for s in sids])
    assert [o.results[0].observation for o in out] == ["1"] * 4, out
    await m.close_all_async()


async def test_a_step_that_waits_hands_the_rest_out_at_once(monkeypatch) -> None:
    """Review finding: envs that wait 5-90 ms a step (a judge or tool call) ran about 0.5 s of steps in a row.
    The first step waits, not slow by itself; the other seven then run side by side: each waits until all seven
    are stepping (run in a row, the first of them would wait :data:`HOLD_S` and fail)."""
    wait = BATCH_SLOW_STEP_S / 2  # not slow by itself, but it waits far beyond its CPU time
    assert wait > 10 * BATCH_WAIT_S
    monkeypatch.setattr(sessions_module, "BATCH_SLOW_STEP_S", 10.0)  # only the wait can hand out here
    monkeypatch.setattr(sessions_module, "BATCH_JOB_BUDGET_S", 10.0)
    SlowEnv.meet = threading.Barrier(7)
    m = manager(workers=8)
    sids = [await started(m) for _ in range(8)]
    out = await m.step_batch_async([BatchItem(s, {"a": str(wait) if s == sids[0] else "meet"}) for s in sids])
    assert [o.results[0].observation for o in out] == ["1"] * 8, out
    await m.close_all_async()


async def test_quick_steps_past_the_job_budget_hand_the_rest_out(monkeypatch) -> None:
    monkeypatch.setattr(sessions_module, "BATCH_WAIT_S", 10.0)  # only the budget can hand out here
    monkeypatch.setattr(sessions_module, "BATCH_JOB_BUDGET_S", 0.0)
    m = manager(workers=8)
    sids = [await started(m) for _ in range(6)]
    await m.step_batch_async([BatchItem(s, {"a": ""}) for s in sids])
    threads = set().union(*(m.get(s).env.env.threads for s in sids))
    assert len(threads) > 1, "the steps past the budget ran in other workers"
    await m.close_all_async()


async def test_a_session_is_free_once_its_own_steps_end_not_when_its_group_does() -> None:
    m = manager(workers=4)
    quick, slow = await started(m), await started(m)
    batch = asyncio.create_task(
        m.step_batch_async([BatchItem(quick, {"a": ""}), BatchItem(slow, {"a": "gate"})])
    )
    await held(m, slow)  # the quick step is done, the slow one runs
    await m.step_async(quick, {"a": ""})
    assert not batch.done(), "the quick session waited for its group's slow step"
    SlowEnv.gate.set()
    await batch
    await m.close_all_async()


async def test_a_batch_does_not_hold_free_sessions_while_it_waits_for_a_busy_one() -> None:
    m = manager(workers=4)
    free, busy = await started(m), await started(m)
    unary = asyncio.create_task(m.step_async(busy, {"a": "gate"}))
    await held(m, busy)
    batch = asyncio.create_task(m.step_batch_async([BatchItem(free, {"a": ""}), BatchItem(busy, {"a": ""})]))
    await asyncio.sleep(0.1)
    await m.step_async(free, {"a": ""})
    assert not unary.done(), "the batch held the free session while waiting for the busy one"
    SlowEnv.gate.set()
    out = await batch
    await unary
    assert [o.results[0].observation for o in out] == ["1", "2"]  # busy: after the unary step, in order
    await m.close_all_async()


async def test_concurrent_batches_over_the_same_sessions_in_other_orders_do_not_deadlock() -> None:
    m = manager(workers=4)
    sids = [await started(m) for _ in range(6)]
    batches = [
        [BatchItem(s, {"a": "0.001"}) for s in (sids if k % 2 else list(reversed(sids)))] for k in range(10)
    ]
    outs = await asyncio.wait_for(asyncio.gather(*(m.step_batch_async(b) for b in batches)), timeout=20)
    assert all(not isinstance(o, Exception) for out in outs for o in out)
    assert all(m.get(s).env.env.max_overlap == 1 for s in sids)
    assert sorted(o.results[0].observation for out in outs for o in out if o.results) == sorted(
        str(k) for k in range(1, 11) for _ in sids
    )
    await m.close_all_async()


async def test_a_cancelled_batch_keeps_its_sessions_until_their_steps_end() -> None:
    m = manager(workers=2)
    sid = await started(m)
    task = asyncio.create_task(m.step_batch_async([BatchItem(sid, {"a": "gate"})]))
    await held(m, sid)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert m.get(sid).lock.locked()
    SlowEnv.gate.set()
    out = await m.step_async(sid, {"a": ""})  # waits for the cancelled batch's step
    assert out.results[0].observation == "2" and m.get(sid).env.env.max_overlap == 1
    await m.close_all_async()


async def test_a_retried_batch_naming_a_session_twice_replays_both_items() -> None:
    """The batch holds as many outcomes of a session as it has items for it (idempotency_results is 1), so the
    channel's retry of the whole BatchStep replays them; a later single call keeps only its own again."""
    m = manager(workers=2)
    sid = await started(m)
    items = [BatchItem(sid, {"a": ""}, "b1"), BatchItem(sid, {"a": ""}, "b2")]
    first = await m.step_batch_async(items, lambda i, o, base: o)
    again = await m.step_batch_async(items, lambda i, o, base: o)
    assert [o.result_id for o in again] == [o.result_id for o in first] == [2, 3]
    assert m.get(sid).env.env.t == 2  # not applied twice
    await m.step_async(sid, {"a": ""}, request_id="s3")
    out = await m.step_batch_async(items, lambda i, o, base: o)
    assert all(isinstance(o, AlreadyExistsError) for o in out) and m.get(sid).env.env.t == 3
    await m.close_all_async()
