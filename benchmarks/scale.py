"""``marti bench scale``: 1,000 concurrent env sessions and 1,000 concurrent broker agents on real servers.

Each server runs in its own process (``python -m services.env_server`` / ``python -m services.comm_broker`` on
port 0); the load comes from this process, one asyncio event loop over one shared ``grpc.aio`` channel per
server (``marti.aio`` clients).

env_server (``--sessions N``, default 1,000), ``--env-rounds`` times (default 3) on fresh sessions: create N
``collaborative_task_solving`` / resource_allocation sessions at once, reset all at once, step every session
``--turns`` times (one ``Step`` rpc per step, all sessions concurrently), then ``--turns`` more turns as one
``BatchStep`` of all N sessions per turn, then close all at once. An episode that ends is reset before its
next step. A session succeeds when all of its calls did. The table shows round 1; ``--json`` has every round.
The server's RSS (``/proc/PID/status``) is read before, after each phase and one second after the closes; the
leak check (:func:`leak_check`) says whether RSS came back near the baseline after the closes and whether the
RSS with all N sessions live grows from round to round.

comm_broker (``--agents N``, default 1,000, in ``--broker-sessions`` sessions, default 1): every agent joins
(``get_messages`` with no wait), then all agents at once run ``--messages`` rounds (default 10): send one
message (700 to 800 bytes of JSON) to the next agent of its session (a ring), then long-poll its mailbox
until it holds the message of that round from the previous agent. SDK defaults otherwise (batches of 128, a
1 ms linger, auto-ack). Checked: every message sent is delivered exactly once, from the right sender, in
order; latency is end to end (the envelope's ``sent_at`` to the receiving agent holding it); the broker's own
counters (``GetStats``) are reported next to the agents' counts and must agree with them.

Limits: where a server's default (``services/*/settings.py``, after ``MARTI_*`` variables) is below what N
needs, the bench raises it with the server's flag and prints it. ``--at-limit`` instead sets the session cap
of the env server and the agents-per-session cap of the broker to exactly what the run needs, and records
what one more session / one more agent gets (the typed error and its message); after the closes it checks
that a new env session is accepted again (the closed sessions freed their slots).

Prints one table (service / phase: N, ok, errors, p50 and p99 latency, rate, server RSS after the phase),
the checks, and the load average before and after; ``--json PATH`` also writes every number. Returns 1 when a
check fails (a session or a message short, a duplicate, a limit probe answered otherwise than expected, a
suspected leak, a server that died), else 0. ``--quick`` is a small run (20 sessions, 20 agents) for tests.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.broker import make_messages, pct
from benchmarks.env import ENVS, choose

ROOT = Path(__file__).resolve().parent.parent
ENV_NAME = "resource_allocation"
#: Least growth per round (MB) that the leak check calls a leak: below it, allocator noise.
LEAK_FLOOR_MB = 2.0
QUICK = {"sessions": 20, "agents": 20, "turns": 2, "messages": 3}


# ---------------------------------------------------------------------------------------------- servers
class Server:
    """A service in its own process, started on port 0; its output is drained (last lines kept).

    Args:
        module: ``services.env_server`` or ``services.comm_broker``.
        flags: Extra command-line flags.
    """

    def __init__(self, module: str, flags: list[str]) -> None:
        self.module = module
        cmd = [sys.executable, "-m", module, "--port", "0", "--log-level", "WARNING", *flags]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self.address = self._read_address()
        threading.Thread(target=self._drain, daemon=True).start()

    def _read_address(self) -> str:
        """Reads the output until ``listening on HOST:PORT`` (60 s at most)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.tail.append(line.rstrip())
            if "listening on" in line:
                return line.rsplit("listening on", 1)[1].split()[0]
        self.proc.kill()
        raise RuntimeError(f"{self.module} did not start: " + " | ".join(self.tail))

    def _drain(self) -> None:
        """Keeps reading the output so that the server never blocks on a full pipe."""
        for line in self.proc.stdout:
            self.tail.append(line.rstrip())

    def rss_mb(self) -> float | None:
        """The server's resident set size now, MB (``VmRSS``); None where /proc is missing."""
        return _status_kb(self.proc.pid, "VmRSS")

    def hwm_mb(self) -> float | None:
        """The server's peak resident set size so far, MB (``VmHWM``); None where /proc is missing."""
        return _status_kb(self.proc.pid, "VmHWM")

    def cpu_s(self) -> float | None:
        """CPU seconds (user + system) the server has used so far; None where /proc is missing."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc.poll() is None

    def stop(self) -> int | None:
        """Terminates the server (SIGTERM, then SIGKILL after 10 s); returns its exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def _status_kb(pid: int, key: str) -> float | None:
    """One ``kB`` line of /proc/PID/status, in MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class Limit:
    """One server limit the run depends on.

    Attributes:
        service: ``env_server`` or ``comm_broker``.
        name: Settings field (its flag is ``--`` + the name with dashes).
        default: The value the server would use (default or ``MARTI_*`` variable).
        needed: The least value the run needs.
        value: The value the bench passes (None: left alone).
    """

    service: str
    name: str
    default: int
    needed: int
    value: int | None = None

    @property
    def flag(self) -> list[str]:
        """The command-line flag and value to pass, or nothing."""
        return [] if self.value is None else ["--" + self.name.replace("_", "-"), str(self.value)]


def plan_limits(
    sessions: int, agents: int, broker_sessions: int, messages: int, at_limit: bool
) -> list[Limit]:
    """The limits that bound this run, with the value to pass where the default is too low (or, with
    ``at_limit``, the exact value for the session and agent caps)."""
    from services.comm_broker.settings import BrokerSettings
    from services.env_server.settings import EnvServerSettings

    env, broker = EnvServerSettings(), BrokerSettings()
    per_session = math.ceil(agents / broker_sessions)
    limits = [
        Limit("env_server", "max_sessions", env.max_sessions, sessions),
        Limit("env_server", "max_batch_steps", env.max_batch_steps, sessions),
        Limit("comm_broker", "max_sessions", broker.max_sessions, broker_sessions),
        Limit("comm_broker", "max_agents_per_session", broker.max_agents_per_session, per_session),
        Limit("comm_broker", "max_mailbox_messages", broker.max_mailbox_messages, messages),
        Limit("comm_broker", "max_unacked_per_agent", broker.max_unacked_per_agent, messages),
    ]
    exact = {("env_server", "max_sessions"), ("comm_broker", "max_agents_per_session")}
    for lim in limits:
        if at_limit and (lim.service, lim.name) in exact:
            lim.value = lim.needed
        elif lim.default < lim.needed:
            lim.value = lim.needed
    return limits


# ---------------------------------------------------------------------------------------------- phases
@dataclass
class Phase:
    """What one phase measured: successful calls, errors by type, call latencies (s), wall time (s), and
    the server's RSS (MB) when it ended.

    Attributes:
        name: Table name (service / phase).
        n: Sessions or agents in the phase.
        unit: What one latency is.
    """

    name: str
    n: int
    unit: str = "call"
    ok: int = 0
    errors: collections.Counter = field(default_factory=collections.Counter)
    lat: list[float] = field(default_factory=list)
    wall: float = 0.0
    count: int = 0
    rss_mb: float | None = None
    error_examples: dict[str, str] = field(default_factory=dict)

    def error(self, exc: BaseException) -> None:
        """Counts ``exc`` under its type name and keeps its first message as an example."""
        name = type(exc).__name__
        self.errors[name] += 1
        self.error_examples.setdefault(name, str(exc)[:300])

    async def timed(self, coro) -> Any:
        """Awaits ``coro``, timing it; returns its result, or None after counting its error."""
        t = time.perf_counter()
        try:
            out = await coro
        except Exception as exc:  # every failure is a result of the bench, counted by type
            self.error(exc)
            return None
        self.lat.append(time.perf_counter() - t)
        self.ok += 1
        return out

    def summary(self) -> dict:
        """The numbers of the phase (what ``--json`` writes)."""
        rate_count = self.count or self.ok
        return {
            "n": self.n,
            "ok": self.ok,
            "errors": sum(self.errors.values()),
            "errors_by_type": dict(self.errors),
            "error_examples": self.error_examples,
            "latency_per": self.unit,
            "p50_ms": pct(self.lat, 50) * 1e3 if self.lat else None,
            "p99_ms": pct(self.lat, 99) * 1e3 if self.lat else None,
            "wall_s": self.wall,
            "count": rate_count,
            "rate_per_s": rate_count / self.wall if self.wall > 0 else None,
            "rss_mb": self.rss_mb,
        }


async def _gather_phase(phase: Phase, server: Server, coros) -> list:
    """Runs ``coros`` concurrently under ``phase`` (wall clock, RSS after)."""
    t0 = time.perf_counter()
    out = await asyncio.gather(*coros)
    phase.wall = time.perf_counter() - t0
    phase.rss_mb = server.rss_mb()
    return out


# ---------------------------------------------------------------------------------------------- env_server
async def _limit_probe(make, undo=None) -> dict:
    """What one call beyond a limit gets: the error's type and message, or ``accepted`` (then ``undo`` is
    awaited with what the call returned, to give the slot back)."""
    try:
        got = await make()
    except Exception as exc:
        return {"result": "refused", "error": type(exc).__name__, "message": str(exc)}
    if undo is not None:
        await undo(got)
    return {"result": "accepted", "error": None, "message": ""}


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
    infos = await _gather_phase(
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
        at_cap = await _limit_probe(lambda: client.create_session(env_id, cfg, seed=seed0 + n), undo)
        probe_failed = at_cap["result"] == "accepted"  # the cap did not hold

    p = phases["reset"]
    results = await _gather_phase(
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

    await _gather_phase(p, server, [stepper(i) for i in sorted(state)])

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
    closed = await _gather_phase(p, server, [p.timed(client.close_session(sids[i])) for i in sorted(sids)])
    for i, c in zip(sorted(sids), closed, strict=True):
        if c is not True:  # an error, or False: the server did not have the session any more
            failed.add(i)
    await asyncio.sleep(1.0)
    rss["after_close"] = server.rss_mb()
    slot_freed = None
    if at_limit:
        probe = await _limit_probe(lambda: client.create_session(env_id, cfg, seed=seed0 + n + 1), undo)
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


# ---------------------------------------------------------------------------------------------- comm_broker
def ring(agents: int, sessions: int) -> list[tuple[str, str, str, str]]:
    """``(agent, session, sends_to, receives_from)`` for every agent: agents split into ``sessions``
    contiguous groups, each group a ring (an agent alone in its session sends to itself)."""
    per = math.ceil(agents / sessions)
    out = []
    for k in range(sessions):
        members = [f"agent-{i}" for i in range(k * per, min(agents, (k + 1) * per))]
        for j, a in enumerate(members):
            out.append((a, f"scale-{k}", members[(j + 1) % len(members)], members[j - 1]))
    return out


async def bench_broker(
    server: Server, agents: int, sessions: int, messages: int, idle_timeout_s: float, at_limit: bool
) -> dict:
    """N agents (SDK defaults, one shared ``grpc.aio`` channel): join, then ``messages`` rounds of send to the
    next agent and long-poll for the previous one's message; returns the phases and the delivery checks."""
    from marti.aio import MartiCommClient
    from marti.clients.broker import IDEMPOTENT_METHODS
    from marti.rpc.channel import make_channel

    texts = [m["text"] for m in make_messages(64)]
    plan = ring(agents, sessions)
    channel = make_channel(server.address, aio=True, idempotent_methods=IDEMPOTENT_METHODS, service="broker")
    clients = {a: MartiCommClient(a, server.address, session=s, channel=channel) for a, s, _, _ in plan}
    join = Phase("comm_broker join", agents)
    exchange = Phase(f"comm_broker send+receive x{messages} (ring)", agents, unit="delivery, end to end")
    close = Phase("comm_broker close", agents)
    rss = {"before": server.rss_mb()}
    cpu0 = server.cpu_s()
    sent = collections.Counter()
    received = collections.Counter()
    problems = collections.Counter()  # wrong sender, duplicate, out of order
    lost_waits = 0
    first_sent_at: list[float] = []
    last_received_at: list[float] = []

    async def joined(a: str) -> None:
        await clients[a].connect()
        await clients[a].get_messages(timeout_s=0)

    await _gather_phase(join, server, [join.timed(joined(a)) for a, _, _, _ in plan])
    rss["after_join"] = join.rss_mb
    at_cap = None
    if at_limit:
        extra = MartiCommClient("agent-extra", server.address, session=plan[0][1], channel=channel)
        at_cap = await _limit_probe(lambda: joined_extra(extra))
        try:
            await extra.close()
        except Exception as exc:  # reported with the probe, not counted against the messages
            at_cap["close_error"] = f"{type(exc).__name__}: {exc}"

    async def agent(a: str, to: str, frm: str, index: int) -> bool:
        """One agent's rounds; returns whether it received every message it was due."""
        nonlocal lost_waits
        c = clients[a]
        expected_seq = 0
        for r in range(messages):
            payload = {"from": a, "seq": r, "text": texts[(index + r) % len(texts)]}
            t = time.time()
            try:
                await c.send_message(to, payload)
            except Exception as exc:
                exchange.error(exc)
                return False
            sent[a] += 1
            if r == 0:
                first_sent_at.append(t)
            idle_since = time.monotonic()
            while expected_seq <= r:
                try:
                    got = await c.get_messages(max_messages=256, timeout_s=1.0)
                except Exception as exc:
                    exchange.error(exc)
                    return False
                now = time.time()
                for m in got:
                    content = m.content
                    if m.sender != frm or content.get("from") != frm:
                        problems["wrong sender"] += 1
                    elif content["seq"] < expected_seq:
                        problems["duplicate"] += 1
                    elif content["seq"] > expected_seq:
                        problems["out of order or gap"] += 1
                        expected_seq = content["seq"] + 1
                    else:
                        expected_seq += 1
                    received[a] += 1
                    exchange.lat.append(now - m.sent_at)
                    exchange.ok += 1
                if got:
                    idle_since = time.monotonic()
                    last_received_at.append(now)
                elif time.monotonic() - idle_since > idle_timeout_s:
                    lost_waits += 1
                    return False
        return True

    t0 = time.perf_counter()
    done = await asyncio.gather(*(agent(a, to, frm, i) for i, (a, _, to, frm) in enumerate(plan)))
    exchange.wall = time.perf_counter() - t0
    exchange.rss_mb = server.rss_mb()
    exchange.count = sum(received.values())
    rss["after_exchange"] = exchange.rss_mb
    await _gather_phase(close, server, [close.timed(clients[a].close()) for a, _, _, _ in plan])
    # The broker's counters once every client has closed (so its last acks are in): through a client that is
    # never connected (GetStats joins nothing).
    try:
        stats = await MartiCommClient(plan[0][0], server.address, channel=channel).get_broker_stats(True)
        broker_stats = {
            k: getattr(stats, k)
            for k in ("sent", "enqueued", "delivered", "redelivered", "acked", "duplicates", "rejected",
                      "dead_lettered", "expired", "sessions", "agents", "pending", "in_flight")
        }  # fmt: skip
    except Exception as exc:
        broker_stats = {"error": f"{type(exc).__name__}: {exc}"}
    await channel.close()
    rss["after_close"] = close.rss_mb
    rss["peak_hwm"] = server.hwm_mb()
    cpu1 = server.cpu_s()
    total_sent, total_received = sum(sent.values()), sum(received.values())
    span = (max(last_received_at) - min(first_sent_at)) if first_sent_at and last_received_at else 0.0
    return {
        "phases": {"join": join, "exchange": exchange, "close": close},
        "agents_ok": sum(1 for ok in done if ok),
        "sent": total_sent,
        "delivered": total_received,
        "lost": total_sent - total_received,
        "problems": dict(problems),
        "agents_given_up": lost_waits,
        "first_send_to_last_delivery_s": span,
        "msgs_per_s": total_received / span if span > 0 else None,
        "broker_stats": broker_stats,
        "rss_mb": rss,
        "server_cpu_s": (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None,
        "at_limit": at_cap,
    }


async def joined_extra(client) -> None:
    """Joins one agent beyond the session's cap (``--at-limit``)."""
    await client.connect()
    await client.get_messages(timeout_s=0)


# ---------------------------------------------------------------------------------------------- report
def row(p: dict, name: str) -> str:
    """One table row: N, ok, errors, p50/p99 (ms), rate (per s), server RSS after the phase (MB)."""

    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    errors = str(p["errors"])
    if p["errors_by_type"]:
        errors += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(p["errors_by_type"].items())) + ")"
    return (
        f"| {name} | {p['n']} | {p['ok']} | {errors} | {num(p['p50_ms'], '.2f')} | {num(p['p99_ms'], '.2f')} "
        f"| {p['latency_per']} | {num(p['rate_per_s'], ',.0f')} | {num(p['rss_mb'], '.1f')} |"
    )


def _mb(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    """Runs the env_server and comm_broker scale runs and prints the table; returns 1 if a check failed."""
    p = argparse.ArgumentParser(prog="marti bench scale", description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=None, help="concurrent env sessions (default 1000)")
    p.add_argument("--agents", type=int, default=None, help="concurrent broker agents (default 1000)")
    p.add_argument("--turns", type=int, default=None, help="Step turns, then BatchStep turns (default 3)")
    p.add_argument("--env-rounds", type=int, default=3, help="env create..close rounds (leak check; 3)")
    p.add_argument("--broker-sessions", type=int, default=1, help="broker sessions the agents split into")
    p.add_argument("--messages", type=int, default=None, help="messages each agent sends (default 10)")
    p.add_argument(
        "--idle-timeout", type=float, default=60.0, help="an agent waiting this long for nothing gives up, s"
    )
    p.add_argument("--at-limit", action="store_true", help="caps set to exactly N; probe one beyond")
    p.add_argument("--quick", action="store_true", help=f"small run for tests: {QUICK}")
    p.add_argument("--skip", choices=("env", "broker"), help="skip one of the two services")
    p.add_argument("--json", metavar="PATH", help="also write every number to PATH as JSON")
    args = p.parse_args(argv)
    defaults = QUICK if args.quick else {"sessions": 1000, "agents": 1000, "turns": 3, "messages": 10}
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if min(args.sessions, args.agents, args.turns, args.messages, args.env_rounds, args.broker_sessions) < 1:
        p.error("--sessions, --agents, --turns, --messages, --env-rounds and --broker-sessions must be >= 1")
    if args.broker_sessions > args.agents:
        p.error("--broker-sessions must not exceed --agents")

    limits = plan_limits(args.sessions, args.agents, args.broker_sessions, args.messages, args.at_limit)
    load_before = os.getloadavg()
    print(
        f"sessions: {args.sessions}; agents: {args.agents} in {args.broker_sessions} broker session(s); "
        f"turns: {args.turns}+{args.turns}; messages per agent: {args.messages}; cpus: {os.cpu_count()}"
    )
    print("load average before: " + " ".join(f"{x:.2f}" for x in load_before))
    for lim in limits:
        if lim.value is None:
            print(f"limit {lim.service} {lim.name}={lim.default} (needed {lim.needed}): left alone")
        else:
            why = "exactly N (--at-limit)" if args.at_limit and lim.value == lim.needed else "raised"
            print(f"limit {lim.service} {lim.name}={lim.default} -> {' '.join(lim.flag)} ({why})")
    flags = {
        svc: [x for lim in limits if lim.service == svc for x in lim.flag]
        for svc in ("env_server", "comm_broker")
    }

    env_result = broker_result = None
    servers_alive = {}
    if args.skip != "env":
        print(f"env_server: {args.sessions} sessions x {args.env_rounds} round(s) ...", flush=True)
        server = Server("services.env_server", flags["env_server"])
        try:
            env_result = asyncio.run(
                bench_env(server, args.sessions, args.turns, args.env_rounds, args.at_limit)
            )
            servers_alive["env_server"] = server.alive()
        finally:
            code = server.stop()
        if not servers_alive.get("env_server"):
            print(f"env_server died (exit {code}); last output:\n" + "\n".join(server.tail))
    if args.skip != "broker":
        print(f"comm_broker: {args.agents} agents x {args.messages} messages ...", flush=True)
        server = Server("services.comm_broker", flags["comm_broker"])
        try:
            broker_result = asyncio.run(
                bench_broker(
                    server, args.agents, args.broker_sessions, args.messages, args.idle_timeout, args.at_limit
                )
            )
            servers_alive["comm_broker"] = server.alive()
        finally:
            code = server.stop()
        if not servers_alive.get("comm_broker"):
            print(f"comm_broker died (exit {code}); last output:\n" + "\n".join(server.tail))
    load_after = os.getloadavg()

    rows: dict[str, dict] = {}
    if env_result:
        for key, ph in env_result["rounds"][0]["phases"].items():
            rows[f"env.{key}"] = (ph.name, ph.summary())
    if broker_result:
        for key, ph in broker_result["phases"].items():
            s = ph.summary()
            if key == "exchange":
                s["ok"] = broker_result["agents_ok"]
            rows[f"broker.{key}"] = (ph.name, s)
    print()
    print("| service / phase | N | ok | errors | p50 ms | p99 ms | latency per | rate /s | server RSS MB |")
    print("|---|---:|---:|---|---:|---:|---|---:|---:|")
    for name, s in rows.values():
        print(row(s, name))
    print()

    failed: list[str] = []
    if env_result:
        for r, rd in enumerate(env_result["rounds"]):
            if rd["sessions_ok"] != args.sessions:
                failed.append(f"env round {r + 1}: {rd['sessions_ok']}/{args.sessions} sessions succeeded")
            if rd["probe_failed"]:
                failed.append(f"env round {r + 1}: a limit probe did not get the expected answer")
        r0 = env_result["rounds"][0]
        steps = sum(rd["phases"][k].count for rd in env_result["rounds"] for k in ("step", "batch"))
        step_wall = sum(rd["phases"][k].wall for rd in env_result["rounds"] for k in ("step", "batch"))
        print(
            "env_server: sessions succeeded per round: "
            + ", ".join(f"{rd['sessions_ok']}/{args.sessions}" for rd in env_result["rounds"])
            + f"; episodes reset mid-run: {sum(rd['episode_resets'] for rd in env_result['rounds'])}"
            + f"; total steps/s (both step phases, all rounds): {steps / step_wall:,.0f}"
        )
        print(
            f"env_server RSS: before {_mb(env_result['rss_before_mb'])}; "
            + "; ".join(
                f"round {i + 1}: after create {_mb(rd['rss_mb']['after_create'])}, after steps "
                f"{_mb(rd['rss_mb']['after_step'])}, 1 s after close {_mb(rd['rss_mb']['after_close'])}"
                for i, rd in enumerate(env_result["rounds"])
            )
            + f"; peak (VmHWM) {_mb(env_result['rounds'][-1]['rss_mb']['peak_hwm'])}"
        )
        lc = env_result["leak_check"]
        if lc.get("returned_near_baseline") is not None:
            line = (
                f"env_server leak check: grew {lc['growth_mb']:.1f} MB, "
                f"kept {lc['retained_after_close_mb']:.1f} MB after close "
                f"(near baseline: {'yes' if lc['returned_near_baseline'] else 'no'})"
            )
            if lc["leak_suspected"] is not None:
                a, z = lc["rounds_compared"]
                line += (
                    f"; with all sessions stepped, RSS grew {lc['growth_per_round_mb']:+.1f} MB per round "
                    f"from round {a} to {z} (leak suspected: {'YES' if lc['leak_suspected'] else 'no'})"
                )
            print(line)
            if lc["leak_suspected"]:
                failed.append("env_server: memory leak suspected")
        print(f"env_server CPU: {sum(rd['server_cpu_s'] or 0 for rd in env_result['rounds']):.1f} s")
        if r0["at_limit"]:
            a = r0["at_limit"]
            print(f"env_server at the cap (session {args.sessions + 1} of max_sessions={args.sessions}): "
                  f"{a['result']} {a['error'] or ''}: {a['message']}")  # fmt: skip
            print(f"env_server after closing all: a new session accepted: {r0['slot_freed_after_close']}")
    if broker_result:
        b = broker_result
        if b["lost"] or b["problems"] or b["agents_ok"] != args.agents:
            failed.append(
                f"comm_broker: sent {b['sent']}, delivered {b['delivered']}, problems {b['problems']}, "
                f"agents done {b['agents_ok']}/{args.agents}"
            )
        bs = b["broker_stats"]
        if "error" in bs or bs["sent"] != b["sent"] or bs["pending"]:
            failed.append(f"comm_broker: its counters disagree with the agents' (sent {b['sent']}): {bs}")
        rate = f"{b['msgs_per_s']:,.0f}" if b["msgs_per_s"] else "-"
        print(
            f"comm_broker: sent {b['sent']}, delivered {b['delivered']}, lost {b['lost']}, "
            f"duplicates/out of order/wrong sender: {b['problems'] or 'none'}; agents that gave up waiting: "
            f"{b['agents_given_up']}; {rate} msgs/s (first send to last delivery)"
        )
        print("comm_broker server counters: " + ", ".join(f"{k}={v}" for k, v in b["broker_stats"].items()))
        print(
            f"comm_broker RSS: before {_mb(b['rss_mb']['before'])}, "
            f"after join {_mb(b['rss_mb']['after_join'])}, "
            f"after messages {_mb(b['rss_mb']['after_exchange'])}, after the clients closed "
            f"{_mb(b['rss_mb']['after_close'])} (sessions and mailboxes stay until idle expiry); peak "
            f"{_mb(b['rss_mb']['peak_hwm'])}; CPU {b['server_cpu_s'] or 0:.1f} s"
        )
        if b["at_limit"]:
            a = b["at_limit"]
            per = math.ceil(args.agents / args.broker_sessions)
            print(f"comm_broker at the cap (agent {per + 1} of max_agents_per_session={per}): "
                  f"{a['result']} {a['error'] or ''}: {a['message']}")  # fmt: skip
            if a["result"] != "refused":
                failed.append("comm_broker: the agent cap did not hold")
    for svc, alive in servers_alive.items():
        if not alive:
            failed.append(f"{svc} died")
    print("checks failed: " + ("; ".join(failed) if failed else "none"))
    print("load average after: " + " ".join(f"{x:.2f}" for x in load_after))

    if args.json:
        out = {
            "benchmark": "scale",
            "args": vars(args),
            "cpus": os.cpu_count(),
            "limits": [vars(lim) for lim in limits],
            "rows": {k: dict(s, name=name) for k, (name, s) in rows.items()},
            "env_server": None,
            "comm_broker": None,
            "servers_alive": servers_alive,
            "checks_failed": failed,
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in load_after],
        }
        if env_result:
            out["env_server"] = {
                "rss_before_mb": env_result["rss_before_mb"],
                "leak_check": env_result["leak_check"],
                "rounds": [
                    {k: v for k, v in rd.items() if k != "phases"}
                    | {"phases": {k: ph.summary() for k, ph in rd["phases"].items()}}
                    for rd in env_result["rounds"]
                ],
            }
        if broker_result:
            out["comm_broker"] = {k: v for k, v in broker_result.items() if k != "phases"} | {
                "phases": {k: rows[f"broker.{k}"][1] for k in broker_result["phases"]}
            }
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
