"""A client process of the paced phase of ``marti bench scale`` (``python -m benchmarks.scale --paced-worker``):
its slice of the sessions and agents, called on an open-loop schedule."""

from __future__ import annotations

import asyncio
import collections
import json
import sys
import time
from typing import Any

from benchmarks.broker import make_messages
from benchmarks.env import choose
from benchmarks.scale.idle import bounded
from benchmarks.scale.settings import EARLY_S, ENV_NAME, P99_TARGET_MS


class Calls:
    """One worker's record of one service's paced calls (times in ms, from the common start)."""

    def __init__(self) -> None:
        self.scheduled = 0
        self.ok = 0
        self.errors: collections.Counter = collections.Counter()
        self.examples: dict[str, str] = {}
        self.latency: list[float] = []  # end - scheduled start (what a caller on the schedule waits)
        self.service: list[float] = []  # end - actual start
        self.late: list[float] = []  # actual start - scheduled start
        self.last_end_ms = 0.0
        self.extra: collections.Counter = collections.Counter()
        self.slow_by_second: collections.Counter = collections.Counter()  # calls over the target, per second

    def error(self, name: str, message: str) -> None:
        """Counts one failed call."""
        self.errors[name] += 1
        self.examples.setdefault(name, message[:300])

    def done(self, sched: float, started: float, end: float, t0: float) -> None:
        """Records one successful call (perf_counter times). Its latency runs from the scheduled start, or
        from the actual start when that was earlier (the loop wakes up to ``EARLY_S`` early)."""
        self.ok += 1
        self.latency.append(round((end - min(sched, started)) * 1e3, 4))
        if self.latency[-1] >= P99_TARGET_MS:
            self.slow_by_second[int(sched - t0)] += 1
        self.service.append(round((end - started) * 1e3, 4))
        self.late.append(round((started - sched) * 1e3, 4))
        self.last_end_ms = max(self.last_end_ms, (end - t0) * 1e3)

    def dump(self) -> dict:
        """What the worker sends back."""
        return {
            "scheduled": self.scheduled, "ok": self.ok, "errors": dict(self.errors), "examples": self.examples,
            "latency_ms": self.latency, "service_ms": self.service, "late_ms": self.late,
            "last_end_ms": self.last_end_ms, "extra": dict(self.extra),
            "slow_by_second": {str(k): v for k, v in self.slow_by_second.items()},
        }  # fmt: skip


async def open_loop(rec: Calls, t0: float, offset: float, interval: float, seconds: float, call) -> None:
    """Starts ``call(i, scheduled)`` at ``t0 + offset + i * interval`` for every such time before ``t0 +
    seconds``, whether or not earlier calls have ended (open loop), then waits for them all."""
    tasks = []
    i = 0
    while offset + i * interval < seconds:
        sched = t0 + offset + i * interval
        delay = sched - time.perf_counter() - EARLY_S
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(call(i, sched)))
        rec.scheduled += 1
        i += 1
    await asyncio.gather(*tasks)


async def paced_worker(spec: dict, ready, wait_start) -> dict:
    """One client process of the paced phase: sets up its slice (resets its env sessions, to hold their
    state; joins its agents with ``batching_size=1``, so a send goes out at once), calls ``ready()``, awaits
    ``wait_start()`` (the common start, wall clock), then runs one open-loop schedule per service at
    ``rate / procs`` calls a second, offset by ``index / rate`` so the workers interleave.

    An env call is one ``Step`` of the next session of the slice (after a ``Reset`` if its episode ended,
    counted in ``extra``); a broker call is one ``send_message`` to the next agent plus that agent's
    ``get_messages`` until it holds the message (5 s at most, else the call fails as ``lost``). A call whose
    session or agent pair is still busy with its previous call waits for it; the wait counts as lateness.
    """
    from marti.aio import EnvClient, MartiCommClient
    from marti.clients.broker import IDEMPOTENT_METHODS
    from marti.rpc.client.channel import make_channel

    rate, procs, index, seconds = spec["rate"], spec["procs"], spec["index"], spec["seconds"]
    interval, offset = procs / rate, index / rate
    out: dict[str, Any] = {}
    runs = []
    env_client = channel = None
    clients: dict[str, Any] = {}
    try:
        if spec.get("env_sessions"):
            env_client = EnvClient(spec["env_address"])
            sids = spec["env_sessions"]
            states = await bounded([env_client.reset(s) for s in sids])
            bad = [x for x in states if isinstance(x, BaseException)]
            if bad:
                raise RuntimeError(f"env setup: {len(bad)} resets failed: {bad[0]!r}")
            env_rec, env_locks = Calls(), [asyncio.Lock() for _ in sids]
            out["env"] = env_rec

            async def env_call(i: int, sched: float) -> None:
                k = i % len(sids)
                async with env_locks[k]:
                    started = time.perf_counter()
                    try:
                        if not states[k].agents:
                            states[k] = await env_client.reset(sids[k])
                            env_rec.extra["episode_resets"] += 1
                        r = states[k]
                        states[k] = await env_client.step(sids[k], choose(ENV_NAME, r.acting_agents, r.infos))
                    except Exception as exc:
                        env_rec.error(type(exc).__name__, str(exc))
                        return
                    env_rec.done(sched, started, time.perf_counter(), t0)

            runs.append((env_rec, env_call))
        if spec.get("broker_pairs"):
            channel = make_channel(
                spec["broker_address"], aio=True, idempotent_methods=IDEMPOTENT_METHODS, service="broker"
            )
            prs = spec["broker_pairs"]
            for a, s, _ in prs:
                clients[a] = MartiCommClient(
                    a, spec["broker_address"], session=s, channel=channel, batching_size=1
                )
            joined = await bounded([join(c) for c in clients.values()])
            bad = [x for x in joined if isinstance(x, BaseException)]
            if bad:
                raise RuntimeError(f"broker setup: {len(bad)} joins failed: {bad[0]!r}")
            texts = [m["text"] for m in make_messages(16)]
            br_rec, br_locks = Calls(), [asyncio.Lock() for _ in prs]
            out["broker"] = br_rec

            async def broker_call(i: int, sched: float) -> None:
                k = i % len(prs)
                sender, _, receiver = prs[k]
                async with br_locks[k]:
                    started = time.perf_counter()
                    try:
                        mid = await clients[sender].send_message(
                            receiver, {"from": sender, "i": i, "text": texts[i % len(texts)]}
                        )
                        while True:
                            got = await clients[receiver].get_messages(max_messages=16, timeout_s=1.0)
                            if any(m.message_id == mid for m in got):
                                br_rec.extra["unexpected"] += sum(m.message_id != mid for m in got)
                                break
                            br_rec.extra["unexpected"] += len(got)
                            if time.perf_counter() - started > 5.0:
                                br_rec.error("lost", f"{sender} -> {receiver}: not received within 5 s")
                                return
                    except Exception as exc:
                        br_rec.error(type(exc).__name__, str(exc))
                        return
                    br_rec.done(sched, started, time.perf_counter(), t0)

            runs.append((br_rec, broker_call))
        ready()
        start_wall = await wait_start()
        t0 = time.perf_counter() + (start_wall - time.time())
        cpu0 = time.process_time()
        await asyncio.gather(*(open_loop(rec, t0, offset, interval, seconds, fn) for rec, fn in runs))
        out["cpu_s"] = time.process_time() - cpu0
    finally:
        for c in clients.values():
            try:
                await c.close()  # sends the last acks
            except Exception as exc:  # reported, the calls are already counted
                out.setdefault("close_errors", []).append(f"{type(exc).__name__}: {exc}")
        if channel is not None:
            await channel.close()
        if env_client is not None:
            await env_client.close()
    return {k: (v.dump() if isinstance(v, Calls) else v) for k, v in out.items()}


async def join(client) -> None:
    """Connects ``client`` and joins its mailbox (a ``get_messages`` with no wait)."""
    await client.connect()
    await client.get_messages(timeout_s=0)


def worker_main() -> int:
    """``python -m benchmarks.scale --paced-worker``: reads its spec (one JSON line) from stdin, prints
    ``ready`` once set up, reads the start time (one line, wall clock) and prints its result as one JSON
    line."""

    def ready() -> None:
        print("ready", flush=True)

    async def wait_start() -> float:
        return float(await asyncio.to_thread(sys.stdin.readline))

    spec = json.loads(sys.stdin.readline())
    try:
        result = asyncio.run(paced_worker(spec, ready, wait_start))
    except Exception as exc:
        print(json.dumps({"failed": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0
