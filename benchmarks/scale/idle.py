"""The idle-memory phase of ``marti bench scale``: the server's RSS per idle env session and per idle mailbox."""

from __future__ import annotations

import asyncio
import collections
import statistics

from benchmarks.env import ENVS, choose
from benchmarks.scale.servers import Server
from benchmarks.scale.settings import ENV_NAME, RSS_SAMPLES, RSS_SETTLE_S, SETUP_CONCURRENCY


async def bounded(coros, limit: int = SETUP_CONCURRENCY) -> list:
    """Awaits ``coros`` with at most ``limit`` in flight; returns their results (or exceptions) in order."""
    sem = asyncio.Semaphore(limit)

    async def one(coro):
        async with sem:
            return await coro

    return await asyncio.gather(*(one(c) for c in coros), return_exceptions=True)


async def idle_rss(server: Server, settle_s: float = RSS_SETTLE_S, samples: int = RSS_SAMPLES) -> dict:
    """The server's RSS while nothing calls it: ``samples`` reads of ``VmRSS`` 0.1 s apart after ``settle_s``
    seconds of quiet; returns the median and every sample (MB), or None where /proc is missing."""
    await asyncio.sleep(settle_s)
    got = []
    for k in range(samples):
        if k:
            await asyncio.sleep(0.1)
        x = server.rss_mb()
        if x is not None:
            got.append(x)
    return {"median_mb": statistics.median(got) if got else None, "samples_mb": got}


def per_item_kb(before: dict, idle: dict, count: int) -> float | None:
    """(idle RSS - RSS before) / count, KB; None when either reading or the count is missing."""
    if before["median_mb"] is None or idle["median_mb"] is None or count < 1:
        return None
    return (idle["median_mb"] - before["median_mb"]) * 1024 / count


async def env_idle(server: Server, n: int, settle_s: float = RSS_SETTLE_S, seed0: int = 10**6) -> dict:
    """Memory per idle env session on a fresh server: one warm-up session (create, reset, step, close: the
    server's lazy imports and caches), the idle RSS, then N sessions created and reset (at most
    ``SETUP_CONCURRENCY`` calls in flight, so few request buffers are live at once) and left idle, the idle RSS
    again. Returns the session ids (the paced phase steps them), both readings and the KB per session."""
    from marti.aio import EnvClient

    env_id, cfg = ENVS[ENV_NAME]
    client = EnvClient(server.address)
    errors: collections.Counter = collections.Counter()
    try:
        info = await client.create_session(env_id, cfg, seed=seed0 - 1)
        r = await client.reset(info.session_id, seed=seed0 - 1)
        await client.step(info.session_id, choose(ENV_NAME, r.acting_agents, r.infos))
        await client.close_session(info.session_id)
        before = await idle_rss(server, settle_s)
        infos = await bounded([client.create_session(env_id, cfg, seed=seed0 + i) for i in range(n)])
        sids = []
        for x in infos:
            if isinstance(x, BaseException):
                errors[type(x).__name__] += 1
            else:
                sids.append(x.session_id)
        resets = await bounded([client.reset(s, seed=seed0 + i) for i, s in enumerate(sids)])
        for x in resets:
            if isinstance(x, BaseException):
                errors[type(x).__name__] += 1
        idle = await idle_rss(server, settle_s)
    finally:
        await client.close()
    ok = len(sids) - sum(isinstance(x, BaseException) for x in resets)
    return {
        "n": n,
        "ok": ok,
        "errors": dict(errors),
        "session_ids": sids,
        "rss_before": before,
        "rss_idle": idle,
        "per_item_kb": per_item_kb(before, idle, ok) if not errors else None,
    }


async def broker_idle(
    server: Server, plan: list[tuple[str, str, str, str]], settle_s: float = RSS_SETTLE_S
) -> dict:
    """Memory per idle mailbox on a fresh broker: the first agent of ``plan`` joins and sends itself one
    message (the warm-up: codec, dictionary, the session itself), the idle RSS, then every other agent joins
    (``get_messages`` with no wait; at most ``SETUP_CONCURRENCY`` at once) and its mailbox stays empty, the
    idle RSS again; KB per mailbox = the growth / (N - 1)."""
    from marti.aio import MartiCommClient
    from marti.clients.broker import IDEMPOTENT_METHODS
    from marti.rpc.client.channel import make_channel

    channel = make_channel(server.address, aio=True, idempotent_methods=IDEMPOTENT_METHODS, service="broker")
    errors: collections.Counter = collections.Counter()
    try:
        first, session = plan[0][0], plan[0][1]
        c = MartiCommClient(first, server.address, session=session, channel=channel)
        await c.connect()
        await c.send_message(first, {"warm": "up"})
        await c.flush()
        while not await c.get_messages(timeout_s=1.0):
            pass
        await c.get_messages(timeout_s=0)  # carries the ack
        await c.close()
        before = await idle_rss(server, settle_s)

        async def join(a: str, s: str) -> None:
            cl = MartiCommClient(a, server.address, session=s, channel=channel)
            await cl.connect()
            await cl.get_messages(timeout_s=0)
            await cl.close()

        got = await bounded([join(a, s) for a, s, _, _ in plan[1:]])
        for x in got:
            if isinstance(x, BaseException):
                errors[type(x).__name__] += 1
        idle = await idle_rss(server, settle_s)
    finally:
        await channel.close()
    ok = len(plan) - 1 - sum(errors.values())
    return {
        "n": len(plan),
        "ok": ok + 1,
        "errors": dict(errors),
        "rss_before": before,
        "rss_idle": idle,
        "per_item_kb": per_item_kb(before, idle, ok) if not errors else None,
    }
