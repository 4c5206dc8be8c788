"""``marti bench rollout``: service overhead of a training step's rollout, per-episode channels vs shared ones.

Starts the broker and the env server as local processes (:class:`marti.command.stack.LocalStack`, as ``marti train``
does), builds the :class:`services.trainer.job.run.loop.TrainingLoop` of a config and plays each training step's
episodes through the loop's own runner (``TrainingLoop._runner`` and ``_play``), with an instant, deterministic
``generate`` (each agent answers its ``response_prefix`` followed by ``" 1"``) in place of the models. What is
timed is what the trainer spends outside generation: creating and resetting env sessions, broker sessions,
routing messages, stepping envs and closing everything (the time spent inside ``generate`` is subtracted).

Two arms, played against the same services with the same seeds (and tasks), interleaved step by step (which
arm goes first alternates) so that load on the machine affects both alike:

* ``per-episode`` (the baseline, what the trainer did before it kept channels): every env session and every
  comm client dials a channel of its own (``marti.make(..., address=...)`` and ``MartiCommClient(...)`` without
  ``channel=``), comm clients send each message as its own Send (``batching_size=1``, the SDK's default then), and the envs,
  each alone on its channel, are stepped one by one (:func:`marti.env.make.step_many` falls back to ``env.step``).
* ``shared`` (the trainer now): the loop as is, i.e. two long-lived channels (env server, broker), buffered
  comm sends (one Send per reply), and one ``BatchStep`` per turn for the envs that share the env channel.

Printed: per arm, the median and mean seconds per step of non-generation rollout time, gRPC channels opened
per step (counted at ``grpc.insecure_channel``), round trips per step (unary rpcs, plus requests on env
``Session`` streams, counted as ``Session``) and the ratios per-episode / arm of time and round trips; the
round trips by method; the load average before and after. ``--json PATH`` writes all the numbers.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report import (
    bench_parser,
    check_json_path,
    markdown_table,
    non_negative_int,
    positive_int,
    print_report,
)
from services.trainer.job.connections.addresses import Addresses
from services.trainer.job.run.loop import TrainingLoop

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "per-episode"
ARMS = (BASELINE, "shared")


@dataclass
class _Gen:
    text: str
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2, 3])
    response_token_ids: list[int] = field(default_factory=lambda: [4, 5])
    response_logprobs: list[float] = field(default_factory=lambda: [-0.1, -0.2])
    policy_version: int = 0


class FakeRuntime:
    """What ``TrainingLoop._runner`` needs from the Ray runtime: ``versions`` and an instant ``generate``.

    ``generate_s`` accumulates the seconds spent inside ``generate`` (subtracted from the rollout time).
    """

    def __init__(self, replies: dict[str, str]) -> None:
        self.replies = replies
        self.generate_s = 0.0

    def versions(self) -> dict[str, int]:
        """Policy version 0 for every agent."""
        return dict.fromkeys(self.replies, 0)

    def generate(self, agent: str, chats: list, greedy: bool = False) -> list[_Gen]:
        """One fixed reply per chat prompt."""
        t0 = time.perf_counter()
        out = [_Gen(self.replies[agent]) for _ in chats]
        self.generate_s += time.perf_counter() - t0
        return out


class PerEpisodeLoop(TrainingLoop):
    """The loop as it was before long-lived channels: a channel per env session and per comm client, the comm
    client sending every message at once (``batching_size=1``), and, since no two envs share a channel, envs
    stepped one by one by :func:`marti.env.make.step_many`."""

    def _env_for(self, env_name: str, seed: int, config: dict[str, Any]) -> Any:
        import marti

        return marti.make(env_name, address=self.addr.env, seed=seed, token=self.addr.token, **config)

    def _comm(self, agent: str, session: str) -> Any:
        from marti.clients.broker import MartiCommClient

        return MartiCommClient(
            agent, self.addr.broker, session=session, token=self.addr.token, batching_size=1
        )


class Counters:
    """gRPC channels opened and round trips made in this process, by method (see :func:`counting`)."""

    def __init__(self) -> None:
        self.channels = 0
        self.trips: Counter[str] = Counter()

    def snapshot(self) -> tuple[int, Counter[str]]:
        """The current counts (a copy)."""
        return self.channels, Counter(self.trips)


@contextmanager
def counting() -> Iterator[Counters]:
    """Count channels opened at ``grpc.insecure_channel`` and round trips (unary rpcs by method; requests on
    env ``Session`` streams as ``Session``) while the context is open; the patches are undone on exit."""
    import grpc

    from marti.clients.env import SessionStream

    counters = Counters()
    real_channel = grpc.insecure_channel
    real_roundtrip = SessionStream._roundtrip

    class Count(grpc.UnaryUnaryClientInterceptor):
        def intercept_unary_unary(self, continuation, details, request):
            counters.trips[details.method.rsplit("/", 1)[-1]] += 1
            return continuation(details, request)

    def channel(*a: Any, **k: Any) -> Any:
        counters.channels += 1
        return grpc.intercept_channel(real_channel(*a, **k), Count())

    def roundtrip(self: Any, **op: Any) -> Any:
        counters.trips["Session"] += 1
        return real_roundtrip(self, **op)

    grpc.insecure_channel = channel
    SessionStream._roundtrip = roundtrip
    try:
        yield counters
    finally:
        grpc.insecure_channel = real_channel
        SessionStream._roundtrip = real_roundtrip


@dataclass
class ArmStats:
    """One arm's per-step measurements."""

    seconds: list[float] = field(default_factory=list)
    channels: list[int] = field(default_factory=list)
    trips: list[Counter[str]] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    episodes: int = 0

    def summary(self) -> dict[str, Any]:
        """Median, mean, min and per-step seconds; channels, round trips (total and by method), turns per step."""
        n = len(self.seconds)
        by_method: Counter[str] = Counter()
        for c in self.trips:
            by_method.update(c)
        return {
            "median_s": statistics.median(self.seconds),
            "mean_s": statistics.mean(self.seconds),
            "min_s": min(self.seconds),
            "step_s": self.seconds,
            "channels_per_step": sum(self.channels) / n,
            "round_trips_per_step": sum(by_method.values()) / n,
            "round_trips_by_method": {k: v / n for k, v in sorted(by_method.items())},
            "episodes_per_step": self.episodes,
            "turns_per_step": sum(self.turns) / n,
        }


def _play_step(
    loop: TrainingLoop, replies: dict[str, str], seeds: list[int], tasks: list[str] | None, what: str
) -> tuple[float, list]:
    """Play one step's episodes; returns (seconds outside ``generate``, results)."""
    runtime = FakeRuntime(replies)
    t0 = time.perf_counter()
    results = loop._play(loop._runner(runtime, greedy=False), seeds, tasks, what)
    return time.perf_counter() - t0 - runtime.generate_s, results


def run(config: str, steps: int, warmup: int) -> dict[str, Any]:
    """Measure both arms (see module docstring) and return every number (what ``--json`` writes)."""
    from marti.command.stack import LocalStack
    from marti.config import load_config

    cfg = load_config(config)
    replies = {a.name: f"{a.response_prefix or ''} 1".strip() for a in cfg.agents}
    stats = {arm: ArmStats() for arm in ARMS}
    load_before = os.getloadavg()
    # The services log to a temporary folder, so their shutdown lines stay out of the table.
    with (
        tempfile.TemporaryDirectory(prefix="marti-bench-rollout-") as logs,
        counting() as counters,
        LocalStack(services=("broker", "env-server"), log_dir=Path(logs)) as stack,
    ):
        a = stack.addresses
        addrs = Addresses(a["broker"], a["env-server"], store="")
        loops: dict[str, TrainingLoop] = {
            BASELINE: PerEpisodeLoop(cfg, addrs),
            "shared": TrainingLoop(cfg, addrs),
        }
        try:
            for step in range(warmup + steps):
                seeds = cfg.rollout.train_seeds(step)
                sched = loops["shared"].scheduler
                tasks = sched.assign(step, len(seeds), cfg.rollout.group_size) if sched else None
                order = ARMS if step % 2 == 0 else ARMS[::-1]
                for arm in order:
                    channels, trips = counters.snapshot()
                    dt, results = _play_step(loops[arm], replies, seeds, tasks, f"{arm} step {step}")
                    if step < warmup:
                        continue
                    s = stats[arm]
                    s.seconds.append(dt)
                    s.channels.append(counters.channels - channels)
                    s.trips.append(counters.trips - trips)
                    s.turns.append(int(sum(r.metrics["num_turns"] for r in results)))
                    s.episodes = len(results)
        finally:
            for loop in loops.values():
                loop.close_channels()
    load_after = os.getloadavg()
    arms = {arm: stats[arm].summary() for arm in ARMS}
    base = arms[BASELINE]
    for summary in arms.values():
        summary["ratio_median_s"] = base["median_s"] / summary["median_s"]
        summary["ratio_mean_s"] = base["mean_s"] / summary["mean_s"]
        summary["ratio_round_trips"] = base["round_trips_per_step"] / summary["round_trips_per_step"]
    path = Path(config).resolve()
    return {
        "benchmark": "rollout",
        "config": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "steps": steps,
        "warmup": warmup,
        "baseline": BASELINE,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "arms": arms,
    }


def table(out: dict[str, Any]) -> str:
    """The markdown table of both arms, then the round trips by method."""
    arms = out["arms"]
    header = [
        "arm",
        "median s/step",
        "mean s/step",
        "channels/step",
        "round trips/step",
        f"{BASELINE} / arm, time (median)",
        f"{BASELINE} / arm, round trips",
    ]
    rows = [
        [f"{arm} (baseline)" if arm == BASELINE else arm, f"{s['median_s']:.4f}", f"{s['mean_s']:.4f}",
         f"{s['channels_per_step']:.1f}", f"{s['round_trips_per_step']:.1f}", f"{s['ratio_median_s']:.2f}x",
         f"{s['ratio_round_trips']:.2f}x"]
        for arm, s in arms.items()
    ]  # fmt: skip
    methods = sorted({m for s in arms.values() for m in s["round_trips_by_method"]})
    by_method = [
        [m, *(f"{s['round_trips_by_method'].get(m, 0.0):.1f}" for s in arms.values())] for m in methods
    ]
    return (
        markdown_table(header, rows, "lrrrrrr")
        + "\n\n"
        + markdown_table(["round trips/step by method", *arms], by_method, "l" + "r" * len(arms))
    )


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table (and write ``--json``); returns 0."""
    p = bench_parser("rollout", __doc__)
    p.add_argument(
        "--config",
        default=str(ROOT / "examples" / "resource_allocation.yaml"),
        help="training config (default examples/resource_allocation.yaml)",
    )
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps per arm (default 10)")
    p.add_argument(
        "--warmup", type=non_negative_int, default=1, help="untimed steps per arm first (default 1)"
    )
    p.add_argument("--json", metavar="PATH", help="also write every number to PATH as JSON")
    args = p.parse_args(argv)
    check_json_path(p, args.json)
    out = run(args.config, args.steps, args.warmup)
    s = out["arms"][BASELINE]
    print(
        f"config: {out['config']}; {args.steps} steps (+{args.warmup} warm-up) per arm, interleaved; "
        f"{s['episodes_per_step']} episodes and {s['turns_per_step']:.0f} turns per step"
    )
    print_report(out, table(out), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
