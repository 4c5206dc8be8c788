"""``marti bench env``: in-process vs remote env steps/s and step latency.

For resource_allocation and one PettingZoo classic game (tic-tac-toe with the text wrapper) it measures, in one
run: in-process with 1 session and with N sessions (stepped in a loop), and remote over loopback with 1 session
(one Step per call on the bidi stream, and as a unary rpc) and with N sessions batched into one BatchStep per
turn (``remote batched``), or into two half batches on two streams so that two batches are in flight
(``remote batched/2``), or, with the asyncio client (:class:`~marti.clients.env.AsyncEnvClient`), into K
batches of N/K sessions each kept in flight on one channel (``remote async/K``, K = 2 and 4; finished episodes
are reset concurrently). Remote clients ask for delta results (the default); ``--no-deltas`` asks for full
results. The env server runs in its own process (``marti env-server``, started by :mod:`benchmarks.server`), as in
a deployment.

The N-session rows are measured in interleaved rounds (``--rounds``, default 4: every mode in turn, repeated),
so that on a machine shared with other jobs they see the same load on average and their ratios stay fair.

Printed per row: steps/s, p50 and p99 latency of one step call (for batched rows, of one batch call), and the
throughput ratio remote / in-process for the same number of sessions. Targets (issue 4): batched remote at least
50% of in-process throughput at 64 sessions; single-step round trip p50 under 1 ms. ``--json PATH`` writes every
row with its ratios, the targets and the load average before and after (:func:`report`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import marti.env.make as me
from benchmarks.report import bench_parser, check_json_path, markdown_table, positive_int, print_report
from benchmarks.server import Server, cpu_s
from marti.clients.env import AsyncEnvClient, EnvClient, StepResult

RA_TEXTS = {
    "leader": "task_1: 1\ntask_2: 1\ntask_3: 0",
    "executor": "task_1: 1\ntask_2: 1\ntask_3: 0",
    "evaluator": "score: 0.5 revise",
}

ENVS: dict[str, tuple[str, dict[str, Any]]] = {
    "resource_allocation": (
        "collaborative_task_solving",
        {"scenario": "resource_allocation", "max_turns": 12},
    ),
    "tictactoe_text": ("pettingzoo", {"entry_point": "pettingzoo.classic.tictactoe_v3:env", "text": True}),
}


def choose(name: str, acting: list[str], infos: dict[str, dict]) -> dict[str, str]:
    """A fixed policy: the role's text for resource_allocation, the first legal move for games."""
    if name == "resource_allocation":
        return {a: RA_TEXTS[infos[a]["role"]] for a in acting}
    return {a: str(infos[a]["legal_actions"][0]) for a in acting}


@dataclass
class Row:
    """One measured configuration."""

    env: str
    mode: str
    sessions: int
    steps_per_s: float
    p50_ms: float
    p99_ms: float
    client_cpu_us: float | None = None
    server_cpu_us: float | None = None


class _Cpu:
    """CPU seconds used so far by this process (all its threads) and by the env server process
    (:func:`benchmarks.server.cpu_s`; ``None`` when its pid is unknown, e.g. with ``--address``, or off Linux)."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid

    def now(self) -> tuple[float, float | None]:
        return time.process_time(), None if self.server_pid is None else cpu_s(self.server_pid)


def _measure(num_steps: int, step_once: Callable[[], int]) -> tuple[float, list[float]]:
    """Call ``step_once`` (returns how many env steps it made) until ``num_steps``; returns (steps/s, latencies)."""
    lat: list[float] = []
    done = 0
    t0 = time.perf_counter()
    while done < num_steps:
        t = time.perf_counter()
        done += step_once()
        lat.append(time.perf_counter() - t)
    return done / (time.perf_counter() - t0), lat


def _row(
    env: str,
    mode: str,
    n: int,
    rate: float,
    lat: list[float],
    cpu: tuple[float, float | None] | None = None,
    steps: int = 0,
) -> Row:
    """A row; ``cpu`` is (client, server) CPU seconds spent on its ``steps`` steps."""
    a = np.asarray(lat) * 1e3
    row = Row(env, mode, n, rate, float(np.percentile(a, 50)), float(np.percentile(a, 99)))
    if cpu is not None and steps:
        row.client_cpu_us = cpu[0] / steps * 1e6
        if mode != "in-process" and cpu[1] is not None:
            row.server_cpu_us = cpu[1] / steps * 1e6
    return row


class _Local:
    def __init__(self, name: str, n: int) -> None:
        env_id, cfg = ENVS[name]
        self.name = name
        self.envs = [me.make(env_id, seed=i, **cfg) for i in range(n)]
        self.infos = [e.reset(seed=i)[1] for i, e in enumerate(self.envs)]

    def step_all(self) -> int:
        for i, env in enumerate(self.envs):
            if not env.agents:
                self.infos[i] = env.reset()[1]
            *_, self.infos[i] = env.step(choose(self.name, env.acting_agents, self.infos[i]))
        return len(self.envs)


class _Remote:
    def __init__(self, name: str, n: int, address: str, transport: str, deltas: bool = True) -> None:
        env_id, cfg = ENVS[name]
        self.name = name
        self.client = EnvClient(address, deltas=deltas)
        self.stream = self.client.stream()
        self.transport = transport
        self.sids = [self.stream.create_session(env_id, cfg, seed=i).session_id for i in range(n)]
        self.state: list[StepResult] = [self.stream.reset(s, seed=i) for i, s in enumerate(self.sids)]

    def _reset_done(self) -> None:
        for i, r in enumerate(self.state):
            if not r.agents:
                self.state[i] = self.stream.reset(self.sids[i])

    def step_one(self) -> int:
        self._reset_done()
        r = self.state[0]
        actions = choose(self.name, r.acting_agents, r.infos)
        if self.transport == "unary":
            self.state[0] = self.client.step(self.sids[0], actions)
        else:
            self.state[0] = self.stream.step(self.sids[0], actions)
        return 1

    def step_batch(self) -> int:
        self._reset_done()
        steps = [
            (s, choose(self.name, r.acting_agents, r.infos))
            for s, r in zip(self.sids, self.state, strict=True)
        ]
        results = self.stream.batch_step(steps)
        for i, r in enumerate(results):
            if isinstance(r, Exception):
                raise r
            self.state[i] = r
        return len(results)

    def close(self) -> None:
        self.stream.close()
        self.client.close()


def run(
    steps: int,
    sessions: int,
    address: str,
    deltas: bool = True,
    envs: list[str] | None = None,
    rounds: int = 4,
    server_pid: int | None = None,
) -> list[Row]:
    """Measure every row (see module docstring) for ``envs`` (default: all of :data:`ENVS`).

    The N-session rows are measured in ``rounds`` interleaved rounds (each round runs every mode for
    ``4 * steps / rounds`` steps, in-process first), so that on a machine shared with other jobs every mode sees
    the same load on average; each row reports all its rounds together, with the CPU time its steps cost in
    this process and (given ``server_pid``) in the env server, per step: unlike throughput, that does not
    depend on what else the machine runs.
    """
    meter = _Cpu(server_pid)
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    rows: list[Row] = []
    for name in envs or list(ENVS):
        local1 = _Local(name, 1)
        rows.append(_row(name, "in-process", 1, *_measure(steps, local1.step_all)))
        for transport in ("stream", "unary"):
            remote = _Remote(name, 1, address, transport, deltas)
            rows.append(_row(name, f"remote {transport}", 1, *_measure(steps, remote.step_one)))
            remote.close()
        modes: dict[str, Any] = {
            "in-process": _Sliced(_Local(name, sessions).step_all),
            "remote batched": _Sliced(
                (remote_n := _Remote(name, sessions, address, "stream", deltas)).step_batch
            ),
            "remote batched/2": _Pipelined(name, sessions, address, deltas),
            "remote async/2": _AsyncInFlight(name, sessions, address, 2, deltas),
            "remote async/4": _AsyncInFlight(name, sessions, address, 4, deltas),
        }
        totals = {m: [0, 0.0, [], 0.0, 0.0] for m in modes}
        per_round = max(sessions, steps * 4 // rounds)
        try:
            for _ in range(rounds):
                for mode, runner in modes.items():
                    c0, s0 = meter.now()
                    done, elapsed, lat = runner.measure(per_round)
                    c1, s1 = meter.now()
                    t = totals[mode]
                    t[0] += done
                    t[1] += elapsed
                    t[2] += lat
                    t[3] += c1 - c0
                    t[4] = None if s0 is None or s1 is None or t[4] is None else t[4] + s1 - s0
        finally:
            remote_n.close()
            for runner in modes.values():
                runner.close()
        for mode, (done, elapsed, lat, ccpu, scpu) in totals.items():
            rows.append(_row(name, mode, sessions, done / elapsed, lat, (ccpu, scpu), done))
    return rows


class _Sliced:
    """A step function measured in slices: ``measure(n)`` returns (steps done, seconds, latencies)."""

    def __init__(self, step_once: Callable[[], int]) -> None:
        self.step_once = step_once

    def measure(self, num_steps: int) -> tuple[int, float, list[float]]:
        lat: list[float] = []
        done = 0
        t0 = time.perf_counter()
        while done < num_steps:
            t = time.perf_counter()
            done += self.step_once()
            lat.append(time.perf_counter() - t)
        return done, time.perf_counter() - t0, lat

    def close(self) -> None:
        pass


class _AsyncInFlight:
    """``k`` batches of ``sessions / k`` sessions each, kept in flight on one ``grpc.aio`` channel (its own
    event loop): each group steps its sessions with one ``BatchStep`` per turn and resets its finished
    episodes concurrently."""

    def __init__(self, name: str, sessions: int, address: str, k: int, deltas: bool) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self.groups = [list(range(sessions))[g::k] for g in range(k)]
        env_id, cfg = ENVS[name]

        async def setup() -> None:
            self.client = AsyncEnvClient(address, deltas=deltas)
            self.sids = [
                (await self.client.create_session(env_id, cfg, seed=i)).session_id for i in range(sessions)
            ]
            self.state = list(
                await asyncio.gather(*(self.client.reset(s, seed=i) for i, s in enumerate(self.sids)))
            )

        self.loop.run_until_complete(setup())

    async def _run(self, num_steps: int) -> tuple[int, list[float]]:
        client, sids, state, name = self.client, self.sids, self.state, self.name
        lat: list[float] = []
        done = [0]

        async def worker(idx: list[int]) -> None:
            while done[0] < num_steps:
                ended = [i for i in idx if not state[i].agents]
                resets = await asyncio.gather(*(client.reset(sids[i]) for i in ended))
                for i, r in zip(ended, resets, strict=True):
                    state[i] = r
                t = time.perf_counter()
                steps = [(sids[i], choose(name, state[i].acting_agents, state[i].infos)) for i in idx]
                for i, r in zip(idx, await client.batch_step(steps), strict=True):
                    if isinstance(r, Exception):
                        raise r
                    state[i] = r
                lat.append(time.perf_counter() - t)
                done[0] += len(idx)

        await asyncio.gather(*(worker(g) for g in self.groups))
        return done[0], lat

    def measure(self, num_steps: int) -> tuple[int, float, list[float]]:
        t0 = time.perf_counter()
        done, lat = self.loop.run_until_complete(self._run(num_steps))
        return done, time.perf_counter() - t0, lat

    def close(self) -> None:
        async def teardown() -> None:
            await asyncio.gather(*(self.client.close_session(s) for s in self.sids))
            await self.client.close()

        self.loop.run_until_complete(teardown())
        self.loop.close()


class _Pipelined:
    """Two streams in two threads, each batching half of the sessions, so the server's work on one batch
    overlaps the client's decoding of the other (two batches in flight)."""

    def __init__(self, name: str, sessions: int, address: str, deltas: bool = True) -> None:
        self.halves = [
            _Remote(name, sessions // 2, address, "stream", deltas),
            _Remote(name, sessions - sessions // 2, address, "stream", deltas),
        ]

    def measure(self, num_steps: int) -> tuple[int, float, list[float]]:
        lat: list[list[float]] = [[], []]
        counts = [0, 0]

        def worker(i: int) -> None:
            r = self.halves[i]
            while counts[i] < num_steps // 2:
                t = time.perf_counter()
                counts[i] += r.step_batch()
                lat[i].append(time.perf_counter() - t)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(counts), time.perf_counter() - t0, lat[0] + lat[1]

    def close(self) -> None:
        for r in self.halves:
            r.close()


#: The throughput ratio remote / in-process that the batched rows should reach (issue 4).
BATCHED_TARGET = 0.5
#: The single-step round-trip p50 target, milliseconds.
SINGLE_P50_TARGET_MS = 1.0


def ratios(rows: list[Row], r: Row) -> tuple[float | None, float | None]:
    """``r``'s throughput ratio to the in-process row of the same env and sessions, and its CPU ratio.

    Returns:
        ``(steps/s ratio, cpu ratio)``: ``None`` for an in-process row; the CPU ratio (in-process CPU per step
        over the larger of the client's and the server's) is ``None`` where a CPU figure is missing or both of
        ``r``'s are 0.
    """
    base = next(b for b in rows if b.mode == "in-process" and (b.env, b.sessions) == (r.env, r.sessions))
    if r.mode == "in-process":
        return None, None
    cpu = None
    figures = (base.client_cpu_us, r.client_cpu_us, r.server_cpu_us)
    if None not in figures and max(r.client_cpu_us, r.server_cpu_us) > 0:
        # A measured 0 (a short run under the clock's tick) is a figure, not a missing one.
        cpu = base.client_cpu_us / max(r.client_cpu_us, r.server_cpu_us)
    return r.steps_per_s / base.steps_per_s, cpu


def report(rows: list[Row], args: dict[str, Any], load_before: list[float], load_after: list[float]) -> dict:
    """Everything ``--json`` writes: the arguments, each row with its ratios, and the targets per env.

    Args:
        rows: The measured rows (:func:`run`).
        args: The command's arguments (steps, sessions, deltas, rounds).
        load_before: The 1, 5 and 15-minute load averages before the run.
        load_after: The same after it.

    Returns:
        ``{"bench": "env", "args", "rows": [{...Row, "ratio", "cpu_ratio"}], "targets": {env: {...}},
        "loadavg_before", "loadavg_after"}``; a target's ``met`` compares the best batched row's steps/s ratio
        (``remote batched*`` and ``remote async/*`` at the most sessions) with :data:`BATCHED_TARGET`, and the
        ``remote stream`` row's p50 with :data:`SINGLE_P50_TARGET_MS`.
    """
    out_rows = []
    for r in rows:
        ratio, cpu = ratios(rows, r)
        out_rows.append({**dataclasses.asdict(r), "ratio": ratio, "cpu_ratio": cpu})
    targets = {}
    for env in dict.fromkeys(r.env for r in rows):
        most = max(r.sessions for r in rows if r.env == env)
        batched = [
            x for x in out_rows if x["env"] == env and x["sessions"] == most and x["ratio"] is not None
        ]
        best = max(batched, key=lambda x: x["ratio"], default=None)
        single = next((x for x in out_rows if x["env"] == env and x["mode"] == "remote stream"), None)
        targets[env] = {
            "batched_sessions": most,
            "batched_best_mode": best and best["mode"],
            "batched_best_ratio": best and best["ratio"],
            "batched_best_cpu_ratio": max((x["cpu_ratio"] or 0.0 for x in batched), default=None),
            "batched_target": BATCHED_TARGET,
            "batched_met": bool(best and best["ratio"] >= BATCHED_TARGET),
            "single_step_p50_ms": single and single["p50_ms"],
            "single_step_p50_target_ms": SINGLE_P50_TARGET_MS,
            "single_step_met": bool(single and single["p50_ms"] < SINGLE_P50_TARGET_MS),
        }
    return {
        "bench": "env",
        "args": args,
        "rows": out_rows,
        "targets": targets,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }


#: The columns of :func:`table`, and their alignment (``markdown_table``).
TABLE_HEADER = ["env", "mode", "sessions", "steps/s", "p50 ms", "p99 ms", "remote/in-proc", "cli us", "srv us",
                "cpu ratio"]  # fmt: skip
TABLE_ALIGN = "llrrrrrrrr"


def _fmt(value: float | None, spec: str) -> str:
    """``value`` formatted with ``spec``, or ``""`` for None."""
    return "" if value is None else format(value, spec)


def table(rows: list[Row]) -> str:
    """The rows as a Markdown table (:func:`benchmarks.report.markdown_table`), with the remote / in-process
    throughput ratio and, for N-session rows, the CPU per step.

    ``cli us`` and ``srv us``: CPU microseconds per step in the benchmark process and in the env server.
    ``cpu ratio``: in-process CPU per step over the larger of the two, i.e. the throughput ratio when client
    and server each have a core of their own and overlap (batches in flight); load-independent.
    """
    cells = []
    for r in rows:
        steps_ratio, cpu = ratios(rows, r)
        cells.append(
            [r.env, r.mode, r.sessions, f"{r.steps_per_s:.0f}", f"{r.p50_ms:.3f}", f"{r.p99_ms:.3f}",
             _fmt(steps_ratio, ".2f"), _fmt(r.client_cpu_us, ".0f"), _fmt(r.server_cpu_us, ".0f"), _fmt(cpu, ".2f")]
        )  # fmt: skip
    return markdown_table(TABLE_HEADER, cells, TABLE_ALIGN)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; returns 0."""
    parser = bench_parser("env", __doc__)
    parser.add_argument("--steps", type=positive_int, default=2000, help="step calls per single-session row")
    parser.add_argument("--sessions", type=positive_int, default=64, help="sessions in the batched rows")
    parser.add_argument("--address", default=None, help="use a running env server instead of starting one")
    parser.add_argument(
        "--no-deltas", dest="deltas", action="store_false", help="remote clients ask for full results"
    )
    parser.add_argument(
        "--env", action="append", choices=list(ENVS), help="measure only this env (repeatable)"
    )
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=4,
        help="interleaved rounds of the N-session rows (fair under load)",
    )
    parser.add_argument(
        "--json", default=None, metavar="PATH", help="also write every number as JSON to PATH"
    )
    args = parser.parse_args(argv)
    check_json_path(parser, args.json)
    load_before = [round(x, 2) for x in os.getloadavg()]
    if args.address is not None:
        rows = run(args.steps, args.sessions, args.address, args.deltas, args.env, args.rounds)
    else:
        # the four remote N-session modes hold their sessions at once (up to 2N each), with room to spare
        flags = ["--max-sessions", str(max(4096, 8 * args.sessions + 16))]
        with Server("env-server", flags) as server:
            rows = run(
                args.steps, args.sessions, server.address, args.deltas, args.env, args.rounds, server.proc.pid
            )
    load_after = [round(x, 2) for x in os.getloadavg()]
    kept = {"steps": args.steps, "sessions": args.sessions, "deltas": args.deltas, "rounds": args.rounds}
    print_report(report(rows, kept, load_before, load_after), table(rows), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
