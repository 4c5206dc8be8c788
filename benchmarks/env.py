"""``marti bench env``: in-process vs remote env steps/s and step latency.

For resource_allocation and one PettingZoo classic game (tic-tac-toe with the text wrapper) it measures, in one
run: in-process with 1 session and with N sessions (stepped in a loop), and remote over loopback with 1 session
(one Step per call on the bidi stream, and as a unary rpc) and with N sessions batched into one BatchStep per
turn (``remote batched``), or into two half batches on two streams so that two batches are in flight
(``remote batched/2``). The env server runs in its own process (``python -m services.env_server``), as in a deployment.

Printed per row: steps/s, p50 and p99 latency of one step call (for batched rows, of one batch call), and the
throughput ratio remote / in-process for the same number of sessions. Targets (issue 4): batched remote at least
50% of in-process throughput at 64 sessions; single-step round trip p50 under 1 ms.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import marti.envs as me
from marti.clients.env import EnvClient, StepResult

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


def _row(env: str, mode: str, n: int, rate: float, lat: list[float]) -> Row:
    a = np.asarray(lat) * 1e3
    return Row(env, mode, n, rate, float(np.percentile(a, 50)), float(np.percentile(a, 99)))


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
    def __init__(self, name: str, n: int, address: str, transport: str) -> None:
        env_id, cfg = ENVS[name]
        self.name = name
        self.client = EnvClient(address)
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


def start_server() -> tuple[subprocess.Popen, str]:
    """Start ``python -m services.env_server --port 0`` and return (process, address)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "services.env_server", "--port", "0", "--max-sessions", "4096"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "listening on" in line:
            return proc, line.rsplit("listening on", 1)[1].strip().split()[0]
    proc.kill()
    raise RuntimeError("env server did not report 'listening on HOST:PORT'")


def run(steps: int, sessions: int, address: str) -> list[Row]:
    """Measure every row (see module docstring)."""
    rows: list[Row] = []
    for name in ENVS:
        local1 = _Local(name, 1)
        rows.append(_row(name, "in-process", 1, *_measure(steps, local1.step_all)))
        local_n = _Local(name, sessions)
        rows.append(_row(name, "in-process", sessions, *_measure(steps * 4, local_n.step_all)))
        for transport in ("stream", "unary"):
            remote = _Remote(name, 1, address, transport)
            rows.append(_row(name, f"remote {transport}", 1, *_measure(steps, remote.step_one)))
            remote.close()
        remote_n = _Remote(name, sessions, address, "stream")
        rows.append(_row(name, "remote batched", sessions, *_measure(steps * 4, remote_n.step_batch)))
        remote_n.close()
        rows.append(_row(name, "remote batched/2", sessions, *_pipelined(name, sessions, address, steps * 4)))
    return rows


def _pipelined(name: str, sessions: int, address: str, num_steps: int) -> tuple[float, list[float]]:
    """Two streams in two threads, each batching half of the sessions, so the server's work on one batch
    overlaps the client's decoding of the other (two batches in flight)."""
    halves = [
        _Remote(name, sessions // 2, address, "stream"),
        _Remote(name, sessions - sessions // 2, address, "stream"),
    ]
    lat: list[list[float]] = [[], []]
    counts = [0, 0]

    def worker(i: int) -> None:
        r = halves[i]
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
    rate = sum(counts) / (time.perf_counter() - t0)
    for r in halves:
        r.close()
    return rate, lat[0] + lat[1]


def table(rows: list[Row]) -> str:
    """Format rows with the remote / in-process throughput ratio."""
    base = {(r.env, r.sessions): r.steps_per_s for r in rows if r.mode == "in-process"}
    out = [
        f"{'env':<20} {'mode':<15} {'sessions':>8} {'steps/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'remote/in-proc':>14}"
    ]
    for r in rows:
        ratio = "" if r.mode == "in-process" else f"{r.steps_per_s / base[(r.env, r.sessions)]:.2f}"
        out.append(
            f"{r.env:<20} {r.mode:<15} {r.sessions:>8} {r.steps_per_s:>10.0f} {r.p50_ms:>8.3f} {r.p99_ms:>8.3f} {ratio:>14}"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; returns 0."""
    parser = argparse.ArgumentParser(prog="marti bench env", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="step calls per single-session row")
    parser.add_argument("--sessions", type=int, default=64, help="sessions in the batched rows")
    parser.add_argument("--address", default=None, help="use a running env server instead of starting one")
    args = parser.parse_args(argv)
    proc = None
    address = args.address
    if address is None:
        proc, address = start_server()
    try:
        rows = run(args.steps, args.sessions, address)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
