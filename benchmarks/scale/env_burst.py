"""The env_server burst of ``marti bench scale``: N sessions created, reset, stepped (``Step``, then
``BatchStep``) and closed at once, round after round, with the leak check over the rounds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from benchmarks.env import ENVS, choose
from benchmarks.scale.phase import Phase, gather_phase, limit_probe
from benchmarks.scale.servers import Server
from benchmarks.scale.settings import ENV_NAME, LEAK_FLOOR_MB


async def env_round(client, server: Server, n: int, turns: int, at_limit: bool, seed0: int) -> dict:
    """One round on the env server: create, reset, step (unary then batched), close N sessions."""
    from marti.errors import MartiError

    env_id, cfg = ENVS[ENV_NAME]
    phases = {
        "create": Phase("env_server create", n),
        "reset": Phase("env_server reset", n),
        "step": Phase(f"env_server step x{turns} (Step rpc)", n),
        "batch": Phase(f"env_server step x{turns} (BatchStep of {n})", n, unit=f"BatchStep of {n}"),
        "close": Phase("env_server close", n),
    }
    rss: dict[str, float | None] = {"before": server.rss_mb()}
    cpu0 = server.cpu_s()
    failed: set[int] = set()
    episode_resets = 0

    p = phases["create"]
    infos = await gather_phase(
        p, server, [p.timed(client.create_session(env_id, cfg, seed=seed0 + i)) for i in range(n)]
    )
    sids: dict[int, str] = {}
    for i, info in enumerate(infos):
        if info is None:
            failed.add(i)
        else:
            sids[i] = info.session_id
    rss["after_create"] = p.rss_mb
    at_cap, probe_failed = None, False

    async def undo(info) -> None:
        """Closes a session a probe made."""
        await client.close_session(info.session_id)

    if at_limit:
        at_cap = await limit_probe(lambda: client.create_session(env_id, cfg, seed=seed0 + n), undo)
        probe_failed = at_cap["result"] == "accepted"  # the cap did not hold

    p = phases["reset"]
    results = await gather_phase(
        p, server, [p.timed(client.reset(sids[i], seed=seed0 + i)) for i in sorted(sids)]
    )
    state: dict[int, Any] = {}
    for i, r in zip(sorted(sids), results, strict=True):
        if r is None:
            failed.add(i)
        else:
            state[i] = r

    async def renew(i: int) -> None:
        """Resets session ``i`` when its episode ended (not a timed call)."""
        nonlocal episode_resets
        if not state[i].agents:
            state[i] = await client.reset(sids[i])
            episode_resets += 1

    p = phases["step"]

    async def stepper(i: int) -> None:
        for _ in range(turns):
            try:
                await renew(i)
            except MartiError as exc:
                p.error(exc)
                failed.add(i)
                return
            r = state[i]
            got = await p.timed(client.step(sids[i], choose(ENV_NAME, r.acting_agents, r.infos)))
            if got is None:
                failed.add(i)
                return
            state[i] = got
            p.count += 1

    await gather_phase(p, server, [stepper(i) for i in sorted(state)])

    p = phases["batch"]
    t0 = time.perf_counter()
    for _ in range(turns):
        live = sorted(i for i in state if i not in failed)
        for i in live:
            try:
                await renew(i)
            except MartiError as exc:
                p.error(exc)
                failed.add(i)
        live = [i for i in live if i not in failed]
        steps = [(sids[i], choose(ENV_NAME, state[i].acting_agents, state[i].infos)) for i in live]
        items = await p.timed(client.batch_step(steps))
        if items is None:
            failed.update(live)
            break
        for i, item in zip(live, items, strict=True):
            if isinstance(item, Exception):
                p.error(item)
                failed.add(i)
            else:
                state[i] = item
                p.count += 1
    p.wall = time.perf_counter() - t0
    p.ok = p.count  # steps, as in the Step phase (the latencies are per BatchStep call)
    p.rss_mb = server.rss_mb()
    rss["after_step"] = p.rss_mb
    rss["peak_hwm"] = server.hwm_mb()

    p = phases["close"]
    closed = await gather_phase(p, server, [p.timed(client.close_session(sids[i])) for i in sorted(sids)])
    for i, c in zip(sorted(sids), closed, strict=True):
        if c is not True:  # an error, or False: the server did not have the session any more
            failed.add(i)
    await asyncio.sleep(1.0)
    rss["after_close"] = server.rss_mb()
    slot_freed = None
    if at_limit:
        probe = await limit_probe(lambda: client.create_session(env_id, cfg, seed=seed0 + n + 1), undo)
        slot_freed = probe["result"] == "accepted"
        probe_failed = probe_failed or not slot_freed
    cpu1 = server.cpu_s()
    succeeded = n - len(failed)
    return {
        "phases": phases,
        "sessions_ok": succeeded,
        "episode_resets": episode_resets,
        "rss_mb": rss,
        "server_cpu_s": (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
        "at_limit": at_cap,
        "slot_freed_after_close": slot_freed,
        "probe_failed": probe_failed,
    }


async def bench_env(server: Server, n: int, turns: int, rounds: int, at_limit: bool) -> dict:
    """``rounds`` rounds of :func:`env_round` on one shared channel; returns every round and the leak
    check."""
    from marti.aio import EnvClient

    client = EnvClient(server.address)
    out = []
    try:
        before = server.rss_mb()
        for r in range(rounds):
            out.append(await env_round(client, server, n, turns, at_limit and r == 0, seed0=r * 10 * n))
    finally:
        await client.close()
    return {"rss_before_mb": before, "rounds": out, "leak_check": leak_check(before, out)}


def leak_check(before: float | None, rounds: list[dict]) -> dict:
    """Whether the server's memory came back after closing every session, and whether it grows round after
    round.

    ``returned_near_baseline``: one second after the first round's closes, RSS is within 25% of that round's
    growth (RSS with all N sessions stepped, minus the baseline) above the baseline. CPython's and the C
    allocator's free lists keep freed memory for reuse, so this can be false without a leak.

    ``leak_suspected`` (two rounds or more): the RSS with all N sessions stepped grows from round to round by
    more than 10% of the first round's growth and more than ``LEAK_FLOOR_MB`` (small runs grow by noise only),
    on average. Compared from round 2 when there are three rounds
    or more (round 1 also fills the allocator's free lists), else from round 1. A leak of what a session costs
    grows that reading by about the whole growth every round; a reading taken after the closes is not used,
    as it moves with whatever the allocator has not handed back yet.
    """
    if before is None or not rounds or rounds[0]["rss_mb"]["after_close"] is None:
        return {"returned_near_baseline": None, "leak_suspected": None}
    first = rounds[0]["rss_mb"]
    growth = max(first["after_step"], first["after_create"]) - before
    retained = first["after_close"] - before
    out = {
        "growth_mb": growth,
        "retained_after_close_mb": retained,
        "returned_near_baseline": retained <= 0.25 * max(growth, 0.0),
        "rounds_compared": None,
        "growth_per_round_mb": None,
        "leak_suspected": None,
    }
    if len(rounds) > 1:
        base = 1 if len(rounds) > 2 else 0
        per_round = (rounds[-1]["rss_mb"]["after_step"] - rounds[base]["rss_mb"]["after_step"]) / (
            len(rounds) - 1 - base
        )
        out["rounds_compared"] = [base + 1, len(rounds)]
        out["growth_per_round_mb"] = per_round
        out["leak_suspected"] = per_round > max(0.10 * growth, LEAK_FLOOR_MB)
    return out
