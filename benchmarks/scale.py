"""``marti bench scale``: 1,000 concurrent env sessions and 1,000 concurrent broker agents on real servers.

Each server runs in its own process (``python -m services.env_server`` / ``python -m services.comm_broker`` on
port 0). The burst phases below drive it from this process, one asyncio event loop over one shared
``grpc.aio`` channel per server (``marti.aio`` clients), all N at once: their latencies are queueing. The paced
phase (further below) drives fresh servers from several processes at a fixed rate.

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

Idle memory and paced load (the issue's targets), on a fresh env server and a fresh broker, both up at once and
started with the same limit flags: one warm-up session / agent, the idle RSS (median of ``RSS_SAMPLES`` reads
after a quiet second), then N env sessions created and reset and N agents joined with empty mailboxes (at most
``SETUP_CONCURRENCY`` calls in flight), the idle RSS again: KB per idle session and per idle mailbox, against
``SESSION_TARGET_KB`` and ``MAILBOX_TARGET_KB``. Then, unless ``--no-paced``, ``--procs`` client processes
(default 4; ``python -m benchmarks.scale --paced-worker``) each take a contiguous slice of the sessions and
agents and, from a common start, run an open-loop schedule for ``--paced-seconds`` (default 20) at
``--paced-rate`` calls a second per service, all processes together (default 200: what this 2-core machine
holds at its throughput; see docs/benchmarks.md). A call starts at its scheduled time whether or not the
previous ones have ended; latency runs from the scheduled start, so a server or a client that falls behind
shows in it (the lateness of the starts is reported too). env call: one ``Step`` of one session; broker call:
one ``send_message`` with ``batching_size=1`` (sent at once) to another agent of the process's slice, plus
that agent's ``get_messages`` until it holds the message. Reported per service: calls scheduled, ok, errors,
offered and achieved rate, p50/p99/max latency against ``P99_TARGET_MS``, calls over it by second, server
CPU per call; and the idle RSS once more after the calls (what a used session / mailbox holds when idle).

Prints the burst table (service / phase: N, ok, errors, p50 and p99 latency, rate, server RSS after the phase),
the checks, the paced table and the memory table (each row: met or missed), and the load average before and
after; ``--json PATH`` also writes every number. Returns 1 when a check fails (a session or a message short, a
duplicate, a limit probe answered otherwise than expected, a suspected leak, a server that died, a paced call
or an idle-phase call that failed), else 0; a missed target is reported, not a failed check (it depends on the
machine and its load). ``--quick`` is a small run (20 sessions, 20 agents, 40 calls/s from 2 processes for
2 s) for tests.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.broker import make_messages, pct
from benchmarks.env import ENVS, choose
from benchmarks.report import check_json_path, positive_float, positive_int, write_json

ROOT = Path(__file__).resolve().parent.parent
ENV_NAME = "resource_allocation"
#: Least growth per round (MB) that the leak check calls a leak: below it, allocator noise.
LEAK_FLOOR_MB = 2.0
#: Calls in flight at most while the idle phase creates, resets or joins (few request buffers live at once).
SETUP_CONCURRENCY = 32
#: Quiet seconds before an idle RSS reading, and reads per reading (the median is kept).
RSS_SETTLE_S = 1.0
RSS_SAMPLES = 5
#: The paced schedule wakes this much before a call's time (asyncio's timers and the task start add about a
#: millisecond); a call that starts early is timed from its actual start.
EARLY_S = 0.001
QUICK = {
    "sessions": 20, "agents": 20, "turns": 2, "messages": 3,
    "paced_rate": 40.0, "procs": 2, "paced_seconds": 2.0, "settle": 0.3,
}  # fmt: skip
FULL = {
    "sessions": 1000, "agents": 1000, "turns": 3, "messages": 10,
    "paced_rate": 200.0, "procs": 4, "paced_seconds": 20.0, "settle": RSS_SETTLE_S,
}  # fmt: skip
#: The issue's targets: p99 per paced call (ms), RSS per idle env session and per idle mailbox (KB).
P99_TARGET_MS = 10.0
SESSION_TARGET_KB = 50.0
MAILBOX_TARGET_KB = 20.0


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
        return _cpu_s(self.proc.pid)

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


def _cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used so far; None where /proc is missing."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float | None:
    """CPU seconds all processes of the machine have used so far (/proc/stat, not idle or iowait)."""
    try:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """Every second, until :meth:`stop`: the cores each named process used over that second, and the cores the
    whole machine used (other people's jobs included), from /proc.

    Args:
        pids: Name -> one pid or a list of pids (summed).
    """

    def __init__(self, pids: dict[str, int | list[int]]) -> None:
        self.pids = {k: v if isinstance(v, list) else [v] for k, v in pids.items()}
        self.series: dict[str, list[float | None]] = {k: [] for k in [*self.pids, "machine"]}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for k, pids in self.pids.items():
            got = [_cpu_s(p) for p in pids]
            out[k] = None if any(x is None for x in got) else sum(got)
        out["machine"] = _machine_busy_s()
        return out

    def _run(self) -> None:
        prev, t_prev = self._read(), time.perf_counter()
        while not self._stop.wait(1.0):
            cur, t = self._read(), time.perf_counter()
            for k, v in cur.items():
                d = None if v is None or prev[k] is None else (v - prev[k]) / (t - t_prev)
                self.series[k].append(None if d is None else round(d, 2))
            prev, t_prev = cur, t

    def stop(self) -> dict[str, list[float | None]]:
        """Stops sampling; returns the cores used per second, per name."""
        self._stop.set()
        self._thread.join()
        return self.series


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


# ---------------------------------------------------------------------------------------------- idle memory
async def _bounded(coros, limit: int = SETUP_CONCURRENCY) -> list:
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


def _per_item_kb(before: dict, idle: dict, count: int) -> float | None:
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
        infos = await _bounded([client.create_session(env_id, cfg, seed=seed0 + i) for i in range(n)])
        sids = []
        for x in infos:
            if isinstance(x, BaseException):
                errors[type(x).__name__] += 1
            else:
                sids.append(x.session_id)
        resets = await _bounded([client.reset(s, seed=seed0 + i) for i, s in enumerate(sids)])
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
        "per_item_kb": _per_item_kb(before, idle, ok) if not errors else None,
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
    from marti.rpc.channel import make_channel

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

        got = await _bounded([join(a, s) for a, s, _, _ in plan[1:]])
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
        "per_item_kb": _per_item_kb(before, idle, ok) if not errors else None,
    }


# ---------------------------------------------------------------------------------------------- paced load
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


class _Calls:
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


async def _open_loop(rec: _Calls, t0: float, offset: float, interval: float, seconds: float, call) -> None:
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
    from marti.rpc.channel import make_channel

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
            states = await _bounded([env_client.reset(s) for s in sids])
            bad = [x for x in states if isinstance(x, BaseException)]
            if bad:
                raise RuntimeError(f"env setup: {len(bad)} resets failed: {bad[0]!r}")
            env_rec, env_locks = _Calls(), [asyncio.Lock() for _ in sids]
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
            joined = await _bounded([_join(c) for c in clients.values()])
            bad = [x for x in joined if isinstance(x, BaseException)]
            if bad:
                raise RuntimeError(f"broker setup: {len(bad)} joins failed: {bad[0]!r}")
            texts = [m["text"] for m in make_messages(16)]
            br_rec, br_locks = _Calls(), [asyncio.Lock() for _ in prs]
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
        await asyncio.gather(*(_open_loop(rec, t0, offset, interval, seconds, fn) for rec, fn in runs))
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
    return {k: (v.dump() if isinstance(v, _Calls) else v) for k, v in out.items()}


async def _join(client) -> None:
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
            servers["env"] = Server("services.env_server", flags["env_server"])
        if skip != "broker":
            servers["broker"] = Server("services.comm_broker", flags["comm_broker"])

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


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _met(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "**missed**")


def paced_and_memory_report(res: dict, args: argparse.Namespace) -> list[dict]:
    """Prints the paced table and the idle-memory table (each row against its target); returns the targets as
    ``{"target", "measured", "limit", "unit", "met"}`` (``met`` None when not measured). Missing a target is
    reported, not a failed check: it depends on the machine and its load."""
    targets: list[dict] = []
    names = {"env": "env_server", "broker": "comm_broker"}
    calls = {
        "env": "Step (one session)",
        "broker": "send_message (batching_size=1) + receiver's get_messages",
    }
    pc = res["paced"]
    if pc is not None:
        print(
            f"Paced load: {pc['rate_per_s']:g} calls/s per service from {pc['procs']} client processes, "
            f"{pc['seconds']:g} s, open loop, both services at once; latency from each call's scheduled start"
        )
        if pc["worker_failures"]:
            print("paced phase failed: " + "; ".join(pc["worker_failures"]))
        print()
        print(
            "| service / paced call | N | scheduled | ok | errors | offered /s | achieved /s | p50 ms | p99 ms "
            "| max ms | p99 from actual start ms | late > 1 ms (p99, max ms) | p99 < 10 ms |"
        )
        print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|")
        for key in ("env", "broker"):
            if key not in pc:
                continue
            x = pc[key]
            met = x["p99_ms"] is not None and x["p99_ms"] < P99_TARGET_MS and not x["errors"]
            errors = str(x["errors"]) + (
                " (" + ", ".join(f"{k}: {v}" for k, v in sorted(x["errors_by_type"].items())) + ")"
                if x["errors"] else ""
            )  # fmt: skip
            n = args.sessions if key == "env" else args.agents
            print(
                f"| {names[key]} {calls[key]} | {n} | {x['scheduled']} | {x['ok']} | {errors} "
                f"| {x['offered_per_s']:.1f} | {x['achieved_per_s']:.1f} | {_ms(x['p50_ms'])} | {_ms(x['p99_ms'])} "
                f"| {_ms(x['max_ms'])} | {_ms(x['service_p99_ms'])} "
                f"| {x['late_over_1ms']} ({_ms(x['late_p99_ms'])}, {_ms(x['late_max_ms'])}) | {_met(met)} |"
            )
            targets.append({"target": f"{names[key]} paced p99 (no errors)", "measured": x["p99_ms"],
                            "limit": P99_TARGET_MS, "unit": "ms", "met": met})  # fmt: skip
        cpu = ", ".join(
            f"{names[k]} {v['cpu_s']:.1f} CPU s in {v['phase_wall_s']:.1f} s"
            + (f" ({v['cpu_s'] * 1e3 / pc[k]['ok']:.2f} ms a call)" if pc.get(k, {}).get("ok") else "")
            for k, v in res["server_cpu"].items()
            if v["cpu_s"] is not None and v["phase_wall_s"]
        )
        if cpu:
            client = (
                ""
                if pc.get("client_cpu_s") is None
                else f"; the client processes {pc['client_cpu_s']:.1f} CPU s"
            )
            print(f"server CPU during the paced phase: {cpu}{client}")
        for key in ("env", "broker"):
            if key in pc:
                x = pc[key]
                print(
                    f"{names[key]}: {x['over_target']} calls at or over {P99_TARGET_MS:g} ms, by second of the "
                    f"schedule: {' '.join(map(str, x['over_target_by_second']))}"
                )
        if res.get("cores_by_second"):
            print(
                "cores used, by second from the workers' start (the first 0.5 s is the wait for the common "
                "start; the calls end about --paced-seconds later):"
            )
            for k, v in res["cores_by_second"].items():
                label = {"env": "env_server", "broker": "comm_broker", "clients": "client processes",
                         "machine": "whole machine"}[k]  # fmt: skip
                print(f"  {label}: " + " ".join("-" if x is None else f"{x:.2f}" for x in v))
        if res.get("loadavg_paced_start"):
            print(
                "load average at the paced start: " + " ".join(f"{v:.2f}" for v in res["loadavg_paced_start"])
            )
        print()
    what = {"env": ("idle env session (created + reset)", SESSION_TARGET_KB),
            "broker": ("idle mailbox (joined, empty)", MAILBOX_TARGET_KB)}  # fmt: skip
    if res["idle"]:
        print(
            "| server / memory per | N | RSS idle before MB | RSS with N idle MB | KB each | target | met |"
        )
        print("|---|---:|---:|---:|---:|---|---|")
    used = []
    for key, idle in res["idle"].items():
        label, limit = what[key]
        kb = idle["per_item_kb"]
        met = None if kb is None else kb < limit
        print(
            f"| {names[key]} {label} | {idle['n']} | {_ms(idle['rss_before']['median_mb'])} "
            f"| {_ms(idle['rss_idle']['median_mb'])} | {'-' if kb is None else f'{kb:.1f}'} | < {limit:g} KB "
            f"| {_met(met)} |"
        )
        targets.append({"target": f"{names[key]} RSS per {label}", "measured": kb, "limit": limit,
                        "unit": "KB", "met": met})  # fmt: skip
        after = res["rss_after_paced"].get(key)
        if after is not None and pc is not None and key in pc:
            # Used, now idle again: what the calls left behind (env: the per-session outcomes it remembers).
            calls = pc[key]["ok"] / idle["n"] + (2 if key == "env" else 0)  # env: + the two resets
            count = idle["ok"] - (1 if key == "broker" else 0)
            kb2 = _per_item_kb(idle["rss_before"], after, count)
            idle["rss_after_paced"] = after
            idle["per_item_kb_after_paced"] = kb2
            idle["calls_per_item_after_paced"] = calls
            met2 = None if kb2 is None else kb2 < limit
            what2 = "session" if key == "env" else "mailbox"
            used.append(
                f"| {names[key]} {what2} idle again after the paced phase ({calls:.1f} "
                f"{'calls' if key == 'env' else 'messages sent and received'} each) | {idle['n']} "
                f"| {_ms(idle['rss_before']['median_mb'])} | {_ms(after['median_mb'])} "
                f"| {'-' if kb2 is None else f'{kb2:.1f}'} | < {limit:g} KB | {_met(met2)} |"
            )
            targets.append({"target": f"{names[key]} RSS per {what2} idle after the paced phase",
                            "measured": kb2, "limit": limit, "unit": "KB", "met": met2})  # fmt: skip
    for line in used:
        print(line)
    if res["idle"]:
        print(
            f"(RSS: median of {RSS_SAMPLES} reads of VmRSS after {args.settle:g} s of quiet; "
            "the mailbox figure divides by N - 1: the first agent is the warm-up)"
        )
    return targets


def _mb(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} MB"


def main(argv: list[str] | None = None) -> int:
    """Runs the env_server and comm_broker scale runs and prints the table; returns 1 if a check failed."""
    p = argparse.ArgumentParser(prog="marti bench scale", description=__doc__.splitlines()[0])
    p.add_argument(
        "--sessions", type=positive_int, default=None, help="concurrent env sessions (default 1000)"
    )
    p.add_argument(
        "--agents", type=positive_int, default=None, help="concurrent broker agents (default 1000)"
    )
    p.add_argument(
        "--turns", type=positive_int, default=None, help="Step turns, then BatchStep turns (default 3)"
    )
    p.add_argument(
        "--env-rounds", type=positive_int, default=3, help="env create..close rounds (leak check; 3)"
    )
    p.add_argument(
        "--broker-sessions", type=positive_int, default=1, help="broker sessions the agents split into"
    )
    p.add_argument(
        "--messages", type=positive_int, default=None, help="messages each agent sends (default 10)"
    )
    p.add_argument(
        "--idle-timeout",
        type=positive_float,
        default=60.0,
        help="an agent waiting this long for nothing gives up, s",
    )
    p.add_argument("--at-limit", action="store_true", help="caps set to exactly N; probe one beyond")
    p.add_argument("--quick", action="store_true", help=f"small run for tests: {QUICK}")
    p.add_argument("--skip", choices=("env", "broker"), help="skip one of the two services")
    p.add_argument(
        "--paced-rate",
        type=positive_float,
        default=None,
        help="paced phase: calls/s per service, all client processes together (default 200; quick 40)",
    )
    p.add_argument(
        "--procs", type=positive_int, default=None, help="paced phase: client processes (default 4)"
    )
    p.add_argument(
        "--paced-seconds", type=positive_float, default=None, help="paced phase: seconds (default 20)"
    )
    p.add_argument(
        "--no-paced", action="store_true", help="skip the paced phase (idle memory still measured)"
    )
    p.add_argument("--no-burst", action="store_true", help="skip the burst phases (create..close, ring)")
    p.add_argument("--json", metavar="PATH", help="also write every number to PATH as JSON")
    args = p.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for k, v in defaults.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.procs > min(args.sessions, args.agents):
        p.error(
            f"--procs {args.procs} must not exceed --sessions ({args.sessions}) or --agents ({args.agents}): "
            "every process owns a slice"
        )
    if args.broker_sessions > args.agents:
        p.error(f"--broker-sessions {args.broker_sessions} must not exceed --agents ({args.agents})")
    check_json_path(p, args.json)

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
    if args.skip != "env" and not args.no_burst:
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
    if args.skip != "broker" and not args.no_burst:
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
    paced = (
        None
        if args.no_paced
        else {"rate": args.paced_rate, "procs": args.procs, "seconds": args.paced_seconds}
    )
    print(
        f"idle memory{'' if paced is None else ' and paced load'} on fresh servers: {args.sessions} sessions, "
        f"{args.agents} mailboxes"
        + ("" if paced is None else f"; {args.paced_rate:g} calls/s per service from {args.procs} processes "
           f"for {args.paced_seconds:g} s")
        + " ...",
        flush=True,
    )  # fmt: skip
    idle_paced = bench_idle_and_paced(
        flags, args.sessions, ring(args.agents, args.broker_sessions), args.skip, paced, args.settle
    )
    for k, alive in idle_paced["servers_alive"].items():
        servers_alive[f"{'env_server' if k == 'env' else 'comm_broker'} (idle, paced)"] = alive
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
    if rows:
        print(
            "| service / phase | N | ok | errors | p50 ms | p99 ms | latency per | rate /s | server RSS MB |"
        )
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
    print()
    targets = paced_and_memory_report(idle_paced, args)
    for key, idle in idle_paced["idle"].items():
        if idle["errors"] or idle["ok"] != idle["n"]:
            failed.append(f"{key} idle phase: {idle['ok']}/{idle['n']} set up, errors {idle['errors']}")
    pc = idle_paced["paced"]
    if pc is not None:
        failed.extend(f"paced: {x}" for x in pc["worker_failures"])
        for key in ("env", "broker"):
            if key in pc and (pc[key]["errors"] or pc[key]["ok"] != pc[key]["scheduled"]):
                failed.append(
                    f"paced {key}: {pc[key]['ok']}/{pc[key]['scheduled']} calls ok, errors {pc[key]['errors_by_type']}"
                )
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
            "idle_memory": idle_paced["idle"],
            "paced": idle_paced["paced"],
            "paced_server_cpu": idle_paced["server_cpu"],
            "loadavg_paced_start": idle_paced.get("loadavg_paced_start"),
            "paced_cores_by_second": idle_paced.get("cores_by_second"),
            "targets": targets,
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
        write_json(args.json, out)
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(worker_main() if sys.argv[1:2] == ["--paced-worker"] else main())
