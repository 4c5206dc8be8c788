"""Single-agent against multi-agent training on resource_allocation (issue 7, deliverable 5).

``marti bench team_comparison [--steps S] [--seeds 0 1 2] [--model NAME] [--run | --summarize-only]``

Both arms are ``marti train`` runs of ``examples/resource_allocation.yaml`` (embedded stack, local Ray,
transformers rollouts, GRPO, LoRA r=8 on SmolLM2-135M-Instruct by default) with the same budget: the same
number of training steps, the same episodes per step and group size, the same problem seeds (``seed`` drives
the training seeds, the held-out evaluation seeds are the config's), the same learning rate, sampling and
``max_turns``:

- **multi**: the three-agent team (``agent_1`` leader, ``agent_2`` executor, ``agent_3`` evaluator), one LoRA
  adapter per agent on one shared base.
- **single**: one agent (``agent_1``, the executor role) solves the task alone with one LoRA adapter: the
  env's documented single-agent baseline (``num_agents: 1``, docs/environments.md), which plans, submits and
  judges by itself (a valid submission ends the episode; otherwise it retries until ``max_turns``).

Measured per run (from ``runs/team_comparison/<arm>_s<seed>/metrics.jsonl`` and ``eval.jsonl``):
task completion rate and resource utilization on the held-out seeds (greedy, before and after training), the
team score per training step (the env's team score, the same quantity for both arms, unlike the per-agent
returns), the spread of the final team score across seeds (stability), and the first step at which the
training team score reaches ``--threshold``.

Every number is printed with the load average measured before and after its run (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
BASE_CONFIG = ROOT / "examples" / "resource_allocation.yaml"
ARMS = ("single", "multi")


def load_avg() -> float:
    """Return the 1-minute load average of this machine."""
    return os.getloadavg()[0]


def arm_config(
    arm: str, *, seed: int, steps: int, model: str, episodes: int, group: int, out_dir: Path
) -> dict:
    """Build one arm's training config from ``examples/resource_allocation.yaml``.

    Args:
        arm: ``single`` (one executor agent) or ``multi`` (the three-agent team).
        seed: Training seed (model init of the adapters, problem seeds, sampling).
        steps: Training steps (``max_steps``); evaluation runs at step 0 and at the last step.
        model: ``pretrain_model`` of every agent.
        episodes: Episodes per step (``rollout.episodes_per_step``); a multiple of ``group``.
        group: GRPO group size (episodes per problem seed).
        out_dir: The run's output directory.

    Returns:
        The config as a dict, ready to dump as YAML.

    Raises:
        ValueError: Unknown arm, or ``episodes`` not a positive multiple of ``group``.
    """
    if arm not in ARMS:
        raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
    if episodes <= 0 or group <= 0 or episodes % group:
        raise ValueError(f"episodes ({episodes}) must be a positive multiple of group ({group})")
    cfg = yaml.safe_load(BASE_CONFIG.read_text())
    cfg["training_name"] = f"teamcmp_{arm}_s{seed}"
    cfg["seed"] = seed
    cfg["max_steps"] = steps
    for agent in cfg["agents"]:
        agent["pretrain_model"] = model
    if arm == "single":
        executor = next(a for a in cfg["agents"] if a["role"] == "executor")
        cfg["agents"] = [{**executor, "name": "agent_1"}]
        cfg["num_agents"] = 1
    cfg["rollout"].update(episodes_per_step=episodes, group_size=group, eval_every=steps)
    cfg["output"] = {"dir": str(out_dir), "save_every": 0, "log_every": 1, "log_with": []}
    cfg["budget"] = {"max_wall_time_s": 3600}
    return cfg


def run_arm(cfg: dict, out_dir: Path) -> dict[str, Any]:
    """Run ``marti train`` on ``cfg`` in a subprocess; returns wall time, loads and the exit code."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    load_before = load_avg()
    t0 = time.monotonic()
    with open(out_dir / "train.log", "w") as log:
        rc = subprocess.call(
            [sys.executable, "-m", "marti.cli", "train", str(path), "--no-progress"],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    info = {"rc": rc, "wall_s": time.monotonic() - t0, "load_before": load_before, "load_after": load_avg()}
    (out_dir / "bench_run.json").write_text(json.dumps(info))
    return info


def read_jsonl(path: Path) -> list[dict]:
    """Return the JSON objects of a .jsonl file (an empty list if it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize_run(out_dir: Path, threshold: float) -> dict[str, Any]:
    """Numbers of one finished run.

    Returns:
        ``steps``, ``train_team_score`` (list per step), ``first_eval`` / ``last_eval`` (eval tables at the
        first and last evaluation), ``steps_to_threshold`` (first step whose training team score is
        >= ``threshold``, or None), ``wall_s``, ``load_before``, ``load_after``, ``rc``.
    """
    metrics = read_jsonl(out_dir / "metrics.jsonl")
    evals = read_jsonl(out_dir / "eval.jsonl")
    info = (
        json.loads((out_dir / "bench_run.json").read_text()) if (out_dir / "bench_run.json").exists() else {}
    )
    scores = [
        (m["step"], m["metrics"].get("team/team_score")) for m in metrics if "team/team_score" in m["metrics"]
    ]
    reached = next((s for s, v in scores if v is not None and v >= threshold), None)
    return {
        "steps": len(scores),
        "train_team_score": [v for _, v in scores],
        "first_eval": evals[0]["table"] if evals else {},
        "last_eval": evals[-1]["table"] if evals else {},
        "steps_to_threshold": reached,
        **info,
    }


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def table(results: dict[str, dict[int, dict[str, Any]]], threshold: float) -> str:
    """Format the per-run and per-arm tables (markdown)."""
    lines = [
        "| arm | seed | steps | eval format validity first -> last | eval completion first -> last "
        "| eval utilization first -> last | eval team score first -> last | train team score per step "
        f"| steps to >= {threshold} | wall s | load before/after |",
        "|---|---:|---:|---|---|---|---|---|---:|---:|---|",
    ]
    for arm, runs in results.items():
        for seed, r in sorted(runs.items()):
            fe, le = r["first_eval"], r["last_eval"]

            def pair(key: str, fe: dict = fe, le: dict = le) -> str:
                a, b = fe.get(key), le.get(key)
                return "-" if a is None or b is None else f"{a:.2f} -> {b:.2f}"

            trace = " ".join(f"{v:.2f}" for v in r["train_team_score"])
            lines.append(
                f"| {arm} | {seed} | {r['steps']} | {pair('team/format_valid')} | {pair('team/task_completion')} | "
                f"{pair('team/resource_utilization')} | {pair('team/team_score')} | {trace} | "
                f"{r['steps_to_threshold'] if r['steps_to_threshold'] is not None else 'not reached'} | "
                f"{r.get('wall_s', float('nan')):.0f} | {r.get('load_before', float('nan')):.1f}/"
                f"{r.get('load_after', float('nan')):.1f} |"
            )
    lines += [
        "",
        "| arm | eval format validity (last) | eval completion (last) | eval utilization (last) "
        "| eval violations (last) | eval team score (last) | final train team score (spread across seeds) "
        "| mean train team score, all steps | reached threshold |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, runs in results.items():
        rs = [r for r in runs.values() if r["steps"] > 0]  # unfinished or not-run seeds are left out

        def col(key: str, rs: list = rs) -> str:
            return _mean_std([r["last_eval"][key] for r in rs if key in r["last_eval"]])

        finals = [r["train_team_score"][-1] for r in rs if r["train_team_score"]]
        alls = [statistics.mean(r["train_team_score"]) for r in rs if r["train_team_score"]]
        reached = sum(r["steps_to_threshold"] is not None for r in rs)
        lines.append(
            f"| {arm} | {col('team/format_valid')} | {col('team/task_completion')} | "
            f"{col('team/resource_utilization')} | {col('team/constraint_violations')} | {col('team/team_score')} | "
            f"{_mean_std(finals)} | {_mean_std(alls)} | {reached}/{len(rs)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run both arms for every seed (or only summarize existing runs) and print the tables.

    Args:
        argv: Command-line arguments (see ``--help``).

    Returns:
        0 on success, 1 if any run exited non-zero.
    """
    p = argparse.ArgumentParser(prog="marti bench team_comparison", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4, help="training steps per run (default 4)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds (default 0 1 2)")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS, help="which arms to run")
    p.add_argument("--model", default="smollm2-135m-instruct", help="pretrain_model of every agent")
    p.add_argument("--episodes", type=int, default=6, help="episodes per step (default 6)")
    p.add_argument("--group", type=int, default=3, help="GRPO group size (default 3)")
    p.add_argument("--threshold", type=float, default=0.5, help="team-score threshold for steps-to-threshold")
    p.add_argument("--out", default=str(ROOT / "runs" / "team_comparison"), help="output root")
    p.add_argument("--summarize-only", action="store_true", help="do not train; summarize existing runs")
    args = p.parse_args(argv)
    out_root = Path(args.out)
    failed = False
    results: dict[str, dict[int, dict[str, Any]]] = {arm: {} for arm in args.arms}
    for seed in args.seeds:
        for arm in args.arms:  # alternate arms so both see similar background load
            out_dir = out_root / f"{arm}_s{seed}"
            if not args.summarize_only:
                cfg = arm_config(
                    arm,
                    seed=seed,
                    steps=args.steps,
                    model=args.model,
                    episodes=args.episodes,
                    group=args.group,
                    out_dir=out_dir,
                )
                info = run_arm(cfg, out_dir)
                print(
                    f"{arm} seed {seed}: rc={info['rc']} {info['wall_s']:.0f}s "
                    f"load {info['load_before']:.1f}->{info['load_after']:.1f}",
                    flush=True,
                )
                failed |= info["rc"] != 0
            results[arm][seed] = summarize_run(out_dir, args.threshold)
    print(table(results, args.threshold))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
