"""The service overhead of one training step's rollout: env sessions, broker sessions, channels, round trips.

Starts the broker, env server and store as local processes (:class:`marti.stack.LocalStack`, as ``marti
train`` does), builds the :class:`services.trainer.loop.TrainingLoop` of a config and plays each training
step's episodes through the loop's own runner (``TrainingLoop._runner`` and ``_play``), with an instant,
deterministic ``generate`` (each agent answers its ``response_prefix`` followed by ``" 1"``) in place of the
models. What is timed is therefore what the trainer spends outside generation: creating and resetting env
sessions, broker sessions, routing messages, stepping envs and closing everything.

Usage::

    .venv/bin/python benchmarks/rollout_overhead.py [--config examples/resource_allocation.yaml] [--steps 20]

Prints one JSON object: ``rollout_s`` (median, mean, min over the steps, after one warm-up step),
``channels_per_step`` (gRPC channels opened per step, counted at ``grpc.insecure_channel``),
``round_trips_per_step`` (unary rpcs by method, plus requests on env ``Session`` streams as ``Session``), the
episodes and turns per step, and the load average when it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@dataclass
class _Gen:
    text: str
    prompt_token_ids: list[int] = field(default_factory=lambda: [1, 2, 3])
    response_token_ids: list[int] = field(default_factory=lambda: [4, 5])
    response_logprobs: list[float] = field(default_factory=lambda: [-0.1, -0.2])
    policy_version: int = 0


class _FakeRuntime:
    """What ``TrainingLoop._runner`` needs from the Ray runtime: ``versions`` and an instant ``generate``."""

    def __init__(self, replies: dict[str, str]) -> None:
        self.replies = replies

    def versions(self) -> dict[str, int]:
        return dict.fromkeys(self.replies, 0)

    def generate(self, agent: str, chats: list, greedy: bool = False) -> list[_Gen]:
        return [_Gen(self.replies[agent]) for _ in chats]


def main(argv: list[str] | None = None) -> int:
    """Run the measurement; returns the exit code."""
    import grpc

    from marti.config import load_config
    from marti.stack import LocalStack
    from services.trainer.loop import Addresses, TrainingLoop

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(ROOT / "examples" / "resource_allocation.yaml"))
    p.add_argument("--steps", type=int, default=20, help="timed steps (after one warm-up step)")
    args = p.parse_args(argv)

    cfg = load_config(args.config)
    replies = {a.name: f"{a.response_prefix or ''} 1".strip() for a in cfg.agents}
    from collections import Counter

    from marti.clients.env import SessionStream

    opened = [0]
    trips: Counter[str] = Counter()
    real = grpc.insecure_channel

    class Count(grpc.UnaryUnaryClientInterceptor):
        def intercept_unary_unary(self, continuation, details, request):
            trips[details.method.rsplit("/", 1)[-1]] += 1
            return continuation(details, request)

    def counting(*a, **k):
        opened[0] += 1
        return grpc.intercept_channel(real(*a, **k), Count())

    grpc.insecure_channel = counting
    real_roundtrip = SessionStream._roundtrip

    def roundtrip(self, **op):
        trips["Session"] += 1
        return real_roundtrip(self, **op)

    SessionStream._roundtrip = roundtrip
    with LocalStack() as stack:
        addrs = stack.addresses
        loop = TrainingLoop(cfg, Addresses(addrs["broker"], addrs["env-server"], addrs["store"]))
        runtime = _FakeRuntime(replies)
        times, channels, turns, episodes, per_step = [], [], [], 0, Counter()
        try:
            for step in range(args.steps + 1):
                seeds = cfg.rollout.train_seeds(step)
                before, trips_before = opened[0], Counter(trips)
                t0 = time.perf_counter()
                results = loop._play(loop._runner(runtime, greedy=False), seeds, None, f"step {step}")
                dt = time.perf_counter() - t0
                if step == 0:
                    continue  # warm-up: imports, first connections
                times.append(dt)
                channels.append(opened[0] - before)
                per_step.update(trips - trips_before)
                turns.append(sum(r.metrics["num_turns"] for r in results))
                episodes = len(results)
        finally:
            close = getattr(loop, "close_channels", None)
            if close is not None:
                close()
    out = {
        "config": str(Path(args.config).resolve().relative_to(ROOT)),
        "steps": args.steps,
        "episodes_per_step": episodes,
        "turns_per_step": statistics.mean(turns),
        "rollout_s": {
            "median": round(statistics.median(times), 4),
            "mean": round(statistics.mean(times), 4),
            "min": round(min(times), 4),
        },
        "channels_per_step": statistics.mean(channels),
        "round_trips_per_step": {
            "total": sum(per_step.values()) / args.steps,
            **{k: v / args.steps for k, v in sorted(per_step.items())},
        },
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
