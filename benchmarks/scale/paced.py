"""The paced phase of ``marti bench scale``: fresh servers, the idle memory, then the client processes'
open-loop calls at a fixed rate, merged into one result per service."""

from __future__ import annotations

import asyncio
import collections
import json
import math
import os
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks.broker import pct
from benchmarks.scale.idle import broker_idle, env_idle, idle_rss
from benchmarks.scale.servers import CpuSampler, Server
from benchmarks.scale.settings import P99_TARGET_MS, ROOT, RSS_SETTLE_S


def split(items: list, k: int) -> list[list]:
    """``items`` in ``k`` contiguous slices whose lengths differ by one at most."""
    return [items[len(items) * w // k : len(items) * (w + 1) // k] for w in range(k)]


def pairs(plan_slice: list[tuple[str, str, str, str]]) -> list[tuple[str, str, str]]:
    """``(sender, session, receiver)`` for the agents of one worker: within each broker session of the slice,
    every agent sends to the next one (a ring; an agent alone sends to itself), so each mailbox is read by
    exactly one call slot."""
    by_session: dict[str, list[str]] = collections.defaultdict(list)
    for a, s, _, _ in plan_slice:
        by_session[s].append(a)
    return [(a, s, m[(j + 1) % len(m)]) for s, m in by_session.items() for j, a in enumerate(m)]


def run_paced(
    env_address: str | None,
    env_sessions: list[str],
    broker_address: str | None,
    plan: list[tuple[str, str, str, str]],
    rate: float,
    procs: int,
    seconds: float,
    on_ready=None,
) -> dict:
    """Runs the paced phase from ``procs`` worker processes (``python -m benchmarks.scale --paced-worker``):
    each gets a contiguous slice of the env sessions and of the agents, sets it up, and once all are ready
    (``on_ready(pids)`` is called then, with the workers' pids) they start together 0.5 s later; returns :func:`merge_paced` of their
    results, or the failures."""
    workers = []
    for w, (sids, agents) in enumerate(zip(split(env_sessions, procs), split(plan, procs), strict=True)):
        spec = {
            "rate": rate, "procs": procs, "index": w, "seconds": seconds,
            "env_address": env_address, "env_sessions": sids if env_address else [],
            "broker_address": broker_address, "broker_pairs": pairs(agents) if broker_address else [],
        }  # fmt: skip
        p = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.scale", "--paced-worker"],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        p.stdin.write(json.dumps(spec) + "\n")
        p.stdin.flush()
        workers.append(p)
    failures = []
    for w, p in enumerate(workers):
        line = p.stdout.readline().strip()
        if line != "ready":
            failures.append(f"worker {w} not ready: {line or 'exited ' + str(p.wait())}")
    if failures:  # no start: a partial load would measure something else
        for p in workers:
            p.kill()
            p.wait()
        return {"procs": procs, "rate_per_s": rate, "seconds": seconds, "worker_failures": failures}
    if on_ready is not None:
        on_ready([p.pid for p in workers])
    start = time.time() + 0.5
    results = []
    for p in workers:
        p.stdin.write(f"{start}\n")
        p.stdin.close()
    for w, p in enumerate(workers):
        killer = threading.Timer(seconds + 120, p.kill)  # a worker that hangs past its calls' timeouts
        killer.start()
        text = p.stdout.read()
        killer.cancel()
        p.wait()
        last = text.strip().splitlines()[-1] if text.strip() else ""
        try:
            res = json.loads(last)
        except json.JSONDecodeError:
            res = {"failed": f"no result (exit {p.returncode}): {last[:200]}"}
        if "failed" in res:
            failures.append(f"worker {w}: {res['failed']}")
        else:
            results.append(res)
    merged = merge_paced(results, rate, seconds) if not failures else {}
    cpu = [r["cpu_s"] for r in results if "cpu_s" in r]
    return {
        "procs": procs, "rate_per_s": rate, "seconds": seconds, "worker_failures": failures,
        "client_cpu_s": sum(cpu) if cpu else None,
    } | merged  # fmt: skip


def merge_paced(results: list[dict], rate: float, seconds: float) -> dict:
    """The workers' calls per service, merged: scheduled, ok, errors, offered and achieved rate (ok calls /
    time from the start to the last call's end), p50/p99/max latency from the scheduled start (what a caller
    on the schedule waits, so a server that falls behind is not hidden), p50/p99 from the actual start, and
    the schedule's lateness (p99, max, calls started more than 1 ms late)."""
    out = {}
    for svc in ("env", "broker"):
        parts = [r[svc] for r in results if svc in r]
        if not parts:
            continue
        lat = [x for p in parts for x in p["latency_ms"]]
        svc_t = [x for p in parts for x in p["service_ms"]]
        late = [x for p in parts for x in p["late_ms"]]
        errors: collections.Counter = collections.Counter()
        examples: dict[str, str] = {}
        extra: collections.Counter = collections.Counter()
        slow: collections.Counter = collections.Counter()
        for p in parts:
            errors.update(p["errors"])
            extra.update(p["extra"])
            slow.update({int(k): v for k, v in p.get("slow_by_second", {}).items()})
            for k, v in p["examples"].items():
                examples.setdefault(k, v)
        scheduled, ok = sum(p["scheduled"] for p in parts), sum(p["ok"] for p in parts)
        span_s = max(p["last_end_ms"] for p in parts) / 1e3
        out[svc] = {
            "scheduled": scheduled,
            "ok": ok,
            "errors": sum(errors.values()),
            "errors_by_type": dict(errors),
            "error_examples": examples,
            "offered_per_s": scheduled / seconds,
            "achieved_per_s": ok / max(span_s, seconds) if ok else 0.0,
            "p50_ms": pct(lat, 50) if lat else None,
            "p99_ms": pct(lat, 99) if lat else None,
            "max_ms": max(lat) if lat else None,
            "service_p50_ms": pct(svc_t, 50) if svc_t else None,
            "service_p99_ms": pct(svc_t, 99) if svc_t else None,
            "late_p99_ms": pct(late, 99) if late else None,
            "late_max_ms": max(late) if late else None,
            "late_over_1ms": sum(x > 1.0 for x in late),
            "over_target": sum(x >= P99_TARGET_MS for x in lat),
            # calls at or over the target by second of the schedule: a stall shows as a few crowded seconds
            "over_target_by_second": [slow.get(k, 0) for k in range(math.ceil(seconds))],
            "extra": dict(extra),
            "close_errors": [e for r in results for e in r.get("close_errors", [])],
        }
    return out


def bench_idle_and_paced(
    flags: dict[str, list[str]],
    sessions: int,
    plan: list,
    skip: str | None,
    paced: dict | None,
    settle_s: float = RSS_SETTLE_S,
) -> dict:
    """Fresh servers (same limit flags as the burst phases), both up at once: N env sessions created and reset
    and N mailboxes joined (:func:`env_idle`, :func:`broker_idle`), then, unless ``paced`` is None, the paced
    phase (:func:`run_paced` with ``paced``'s rate, procs and seconds) on both services at once; RSS and
    server CPU around it."""
    servers: dict[str, Server] = {}
    out: dict[str, Any] = {
        "idle": {},
        "paced": None,
        "servers_alive": {},
        "server_cpu": {},
        "rss_after_paced": {},
    }
    try:
        if skip != "env":
            servers["env"] = Server("env-server", flags["env_server"])
        if skip != "broker":
            servers["broker"] = Server("broker", flags["comm_broker"])

        async def both() -> None:
            """The two servers' idle phases at once (each RSS is its own server's)."""
            jobs = {}
            if "env" in servers:
                jobs["env"] = env_idle(servers["env"], sessions, settle_s)
            if "broker" in servers:
                jobs["broker"] = broker_idle(servers["broker"], plan, settle_s)
            for k, v in zip(jobs, await asyncio.gather(*jobs.values()), strict=True):
                out["idle"][k] = v

        asyncio.run(both())
        if paced is not None:
            cpu0: dict[str, float | None] = {}
            t = [0.0]
            sampler: list[CpuSampler] = []

            def mark(pids: list[int]) -> None:
                """The workers are set up: server CPU, the clock and the per-second CPU samples from here to
                the end of the calls."""
                for k, s in servers.items():
                    cpu0[k] = s.cpu_s()
                t[0] = time.perf_counter()
                out["loadavg_paced_start"] = [round(x, 2) for x in os.getloadavg()]
                sampler.append(CpuSampler({**{k: s.proc.pid for k, s in servers.items()}, "clients": pids}))

            out["paced"] = run_paced(
                servers["env"].address if "env" in servers else None,
                out["idle"].get("env", {}).get("session_ids", []),
                servers["broker"].address if "broker" in servers else None,
                plan,
                paced["rate"],
                paced["procs"],
                paced["seconds"],
                on_ready=mark,
            )
            wall = time.perf_counter() - t[0] if t[0] else None
            out["cores_by_second"] = sampler[0].stop() if sampler else None
            for k, s in servers.items():
                c1 = s.cpu_s()
                out["server_cpu"][k] = {"cpu_s": (c1 - cpu0[k]) if cpu0.get(k) is not None and c1 is not None
                                        else None, "phase_wall_s": wall}  # fmt: skip

            async def settled() -> None:
                """The servers' idle RSS once the paced calls are over (read as before them)."""
                got = await asyncio.gather(*(idle_rss(s, settle_s) for s in servers.values()))
                out["rss_after_paced"].update(zip(servers, got, strict=True))

            asyncio.run(settled())
        for k, s in servers.items():
            out["servers_alive"][k] = s.alive()
    finally:
        for s in servers.values():
            s.stop()
    if out["idle"].get("env"):
        out["idle"]["env"].pop("session_ids", None)
    return out
