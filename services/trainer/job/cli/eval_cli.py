"""``marti eval CONFIG --checkpoint PATH``: held-out evaluation of a checkpoint against the untrained models.

Prints task completion rate, resource utilization, format validity and mean reward per role on the config's
held-out seeds (``rollout.eval_seeds``), greedy decoding (with ``rollout.eval_samples`` N > 1: N samples of each
seed, and pass@k and the majority vote), for the base models and for the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from marti.errors import MartiError
from services.trainer.job.cli.train_cli import add_override_flags, add_service_flags, service_addresses


def format_table(results: dict[str, dict[str, float]], roles: dict[str, str]) -> str:
    """A markdown table: one row per metric, one column per evaluated policy (``base``, ``checkpoint``)."""
    cols = list(results)
    keys = sorted({k for m in results.values() for k in m})
    lines = ["| metric | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for key in keys:
        scope, _, name = key.partition("/")
        label = f"{roles[scope]} ({scope}) {name}" if scope in roles else key
        vals = [f"{results[c][key]:.3f}" if key in results[c] else "-" for c in cols]
        lines.append(f"| {label} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run ``marti eval``; returns 0 on success, 2 on a bad config, checkpoint or model."""
    from marti.config import load_config
    from services.trainer.job.run.loop import TrainingLoop, latest_checkpoint

    p = argparse.ArgumentParser(prog="marti eval", description="evaluate a checkpoint on held-out seeds")
    p.add_argument("config", help="training config YAML")
    p.add_argument("--checkpoint", default=None, help="checkpoint dir; default: the run's newest checkpoint")
    add_override_flags(p)
    p.add_argument("--no-baseline", action="store_true", help="skip the untrained base models")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    add_service_flags(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        cfg = load_config(args.config, args.overrides, args.unset)
        ckpt = Path(args.checkpoint) if args.checkpoint else latest_checkpoint(cfg.run_dir)
        if args.checkpoint and not ckpt.is_dir():
            raise MartiError(f"checkpoint {str(ckpt)!r} is not a directory")
        if ckpt is None and args.no_baseline:
            raise MartiError(f"no checkpoint given and none found under {cfg.run_dir / 'checkpoints'}")
        with service_addresses(cfg, args) as addresses:
            loop = TrainingLoop(cfg, addresses, show_progress=False)
            cfg = loop.cfg  # a dataset job's: the held-out seeds are its held-out rows (DatasetTasks.fit)
            results = loop.evaluate_checkpoint(str(ckpt) if ckpt else None, baseline=not args.no_baseline)
    except MartiError as exc:
        print(f"marti eval: {exc}", file=sys.stderr)
        return 2
    roles = {a.name: a.role for a in cfg.agents}
    print(f"held-out seeds: {cfg.rollout.resolved_eval_seeds}; checkpoint: {ckpt or '(none)'}")
    print(format_table(results, roles))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"checkpoint": str(ckpt) if ckpt else None, **results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
