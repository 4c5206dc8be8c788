"""``python -m benchmarks.trainer.step_profile SPEC MODE``: where a step of our side of ``marti bench trainer`` spends
its time. A development tool, not a benchmark (no baseline arm): it runs our side exactly as the bench does
(:func:`benchmarks.trainer.ours.worker_config`, ``PolicyWorker`` in this process, the task's prompts in groups) from
a bench run's ``spec.json`` (``marti bench trainer --out DIR`` writes ``DIR/spec.json``).

After ``--warmup`` steps (default 4), MODE is:

- ``time``: the remaining steps of the spec; prints the median generation and update seconds and each step's
  policy loss (equal losses across two runs or two versions show the same computation);
- ``generation`` / ``update``: one step; prints torch.profiler's table of that phase's operators by self CPU time
  (``--shapes`` groups them by input shapes, ``--rows`` sets the table's length);
- ``lean``: the remaining steps, alternating the rollout engine's lean forward on and off
  (:class:`~services.trainer.rollout.engines.static.StaticCacheRolloutEngine` ``lean``); prints the median
  generation seconds of each. A spec whose engine is not ``hf_static``, or a step that ran the other forward than
  asked, is refused (the A/B would time one forward twice);
- ``lean_update``: the remaining steps, alternating the update's lean training forward on and off
  (:attr:`~services.trainer.models.policy.MultiAgentPolicy.lean_training`, :mod:`~services.trainer.models.
  lean_training`); prints the median update seconds of each and each step's policy loss.

The update is ``PolicyWorker.train`` alone (the bench's update phase also scores the samples, a few microseconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

MODES = ("time", "generation", "update", "lean", "lean_update")


class StepRunner:
    """Our side of the bench over a spec, one step at a time.

    Args:
        spec: A bench run's spec (``spec.json``).
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        from benchmarks.trainer.ours import worker_config
        from marti.config import config_from_dict
        from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config

        self.spec = spec
        self.worker = PolicyWorker(
            policy_actor_config(config_from_dict(worker_config(spec))), num_threads=spec["threads"]
        )
        self.generation_s: list[float] = []
        self.update_s: list[float] = []
        self.losses: list[float] = []
        self._counts = {"completion_tokens": 0, "prompt_tokens": 0, "samples": 0}

    def step(self, index: int, profiler: Any = None, phase: str | None = None) -> None:
        """Run step ``index`` (its prompts are the spec's problems ``index * P`` to ``(index + 1) * P``), timing
        both phases; ``profiler`` (started and stopped here) records ``phase`` when given."""
        from benchmarks.trainer.ours import _our_samples, step_prompts

        batch, chats = step_prompts(self.spec, index)
        with _recording(profiler, phase == "generation"):
            start = time.perf_counter()
            gens = self.worker.generate("solver", chats)
            self.generation_s.append(time.perf_counter() - start)
        samples = _our_samples(index, gens, batch, self.spec["group_size"], self._counts)
        with _recording(profiler, phase == "update"):
            start = time.perf_counter()
            stats = self.worker.train("solver", samples)
            self.update_s.append(time.perf_counter() - start)
        self.losses.append(float(stats["policy_loss"]))


class _recording:
    """Context: ``profiler.start()`` / ``stop()`` around the block when ``on``."""

    def __init__(self, profiler: Any, on: bool) -> None:
        self.profiler = profiler if on else None

    def __enter__(self) -> None:
        if self.profiler is not None:
            self.profiler.start()

    def __exit__(self, *exc: object) -> None:
        if self.profiler is not None:
            self.profiler.stop()


def run(spec: dict[str, Any], mode: str, warmup: int = 4, rows: int = 30, shapes: bool = False) -> str:
    """Run ``mode`` (module docstring) over ``spec`` and return the printed report.

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`, or ``warmup`` leaves no step of the spec to measure.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    steps = spec["steps"]
    if not 0 <= warmup < steps:
        raise ValueError(f"--warmup must be in [0, {steps}) for a spec of {steps} steps, got {warmup}")
    runner = StepRunner(spec)
    for index in range(warmup):
        runner.step(index)
    if mode in ("generation", "update"):
        from torch.profiler import ProfilerActivity, profile

        profiler = profile(activities=[ProfilerActivity.CPU], record_shapes=shapes)
        runner.step(warmup, profiler, mode)
        table = profiler.key_averages(group_by_input_shape=shapes)
        return table.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60)
    if mode == "lean":
        return _lean_ab(runner, range(warmup, steps))
    if mode == "lean_update":
        return _lean_update_ab(runner, range(warmup, steps))
    for index in range(warmup, steps):
        runner.step(index)
    return (
        f"median generation {statistics.median(runner.generation_s[warmup:]):.3f} s, "
        f"median update {statistics.median(runner.update_s[warmup:]):.3f} s over steps {warmup + 1}-{steps}\n"
        f"policy losses: {[round(x, 6) for x in runner.losses]}"
    )


def _lean_ab(runner: StepRunner, indices: range) -> str:
    """Alternate the engine's lean forward (on for even steps) and report each side's median generation time.

    Raises:
        ValueError: The spec's rollout engine has no lean forward (not ``hf_static``), or a step ran another forward
            than the one asked for (a model the lean forward does not support): the A/B would compare one forward
            with itself.
    """
    engine = runner.worker.engine
    if not hasattr(engine, "lean"):
        raise ValueError(
            f"the lean mode needs rollout_engine hf_static, the spec's engine is {type(engine).__name__}"
        )
    times: dict[bool, list[float]] = {True: [], False: []}
    for index in indices:
        lean = index % 2 == 0
        engine.lean = lean
        runner.step(index)
        ran = engine.last_stats.get("forward")
        if ran != ("lean" if lean else "transformers"):
            raise ValueError(f"step {index + 1} ran the {ran} forward with lean={lean}: nothing to compare")
        times[lean].append(runner.generation_s[-1])
    return "\n".join(_medians("lean forward", "generation", times))


def _medians(label: str, phase: str, times: dict[bool, list[float]]) -> list[str]:
    """One line per side of an A/B (``times``: on/off -> seconds of ``phase`` per step): its median and steps."""
    return [
        f"{label} {'on ' if on else 'off'}: median {phase} {statistics.median(t):.3f} s "
        f"({len(t)} steps: {', '.join(f'{x:.3f}' for x in t)})"
        for on, t in times.items()
        if t
    ]


def _lean_update_ab(runner: StepRunner, indices: range) -> str:
    """Alternate the update's lean training forward (on for even steps) and report each side's median update
    time and the steps' policy losses.

    Raises:
        ValueError: A step with the lean training forward on did not run it (a model or sequence it does not
            serve): the A/B would time the transformers forward twice.
    """
    from services.trainer.models import lean_training

    policy = runner.worker.policy
    times: dict[bool, list[float]] = {True: [], False: []}
    original, calls = lean_training.response_logits, []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    lean_training.response_logits = counted
    try:
        for index in indices:
            lean = index % 2 == 0
            policy.lean_training, before = lean, len(calls)
            runner.step(index)
            if lean and len(calls) == before:
                raise ValueError(
                    f"step {index + 1} ran the transformers forward with lean_training on: nothing to compare"
                )
            times[lean].append(runner.update_s[-1])
    finally:
        lean_training.response_logits = original
        policy.lean_training = True
    losses = [round(x, 6) for x in runner.losses[-len(indices) :]]
    return "\n".join(
        [*_medians("lean training forward", "update", times), f"policy losses (on, off, on, ...): {losses}"]
    )


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.trainer.step_profile", description=__doc__)
    parser.add_argument("spec", type=Path, help="spec.json of a marti bench trainer run (its --out folder)")
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--warmup", type=int, default=4, help="steps run before measuring (default 4)")
    parser.add_argument("--rows", type=int, default=30, help="profiler table rows (default 30)")
    parser.add_argument("--shapes", action="store_true", help="profiler table by input shapes")
    args = parser.parse_args(argv)
    if not args.spec.is_file():
        parser.error(
            f"no spec file at {args.spec} (run marti bench trainer --out DIR first; it writes DIR/spec.json)"
        )
    spec = json.loads(args.spec.read_text())
    try:
        print(run(spec, args.mode, args.warmup, args.rows, args.shapes))
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
