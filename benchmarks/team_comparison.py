"""``marti bench team_comparison``: a single agent against the team, on resource_allocation or private_allocation.

``marti bench team_comparison [--scenario resource_allocation|private_allocation] [--budget samples|walltime]
[--config PATH] [--steps S] [--seeds 0 1 2] [--arms ...] [--model NAME] [--json PATH] [--summarize-only]``

Every arm is a ``marti train`` run of the scenario's example config, or of ``--config`` (a team config of the
same scenario, e.g. ``examples/private_allocation_pick.yaml``) (embedded stack, local Ray, transformers
rollouts, GRPO, LoRA r=8 on SmolLM2-135M-Instruct by default). Within a comparison every arm keeps the same
episodes per step and group size, problem-seed schedule, held-out seeds, learning rate, sampling, ``max_turns``
and ``max_new_tokens``; ``seed`` (the run seed: adapter initialisation and sampling) is the same across arms.

``--scenario resource_allocation`` (default; ``examples/resource_allocation.yaml``):

- **multi** (reference): the three-agent team (``agent_1`` leader, ``agent_2`` executor, ``agent_3``
  evaluator), one LoRA adapter per agent on one shared base.
- **single**: one agent (``agent_1``, the executor role) solves the task alone with one LoRA adapter: the
  env's documented single-agent baseline (``num_agents: 1``, docs/environments.md), which plans, submits and
  judges by itself (a valid submission ends the episode; otherwise it retries until ``max_turns``).

``--scenario private_allocation`` (``examples/private_allocation.yaml``: the problem's facts are split, the
leader sees the task values, the executor the resources, uses and limits):

- **team** (reference): the example's three agents (leader, executor, evaluator), one adapter each.
- **solo_part**: one agent alone with the executor's part only (``num_agents: 1``, env option
  ``solo_view: executor``): what one agent of the team can do by itself.
- **solo_all**: one agent alone that sees both parts (``solo_view: all``): the upper bound of information,
  same model.

The solo arms are the example's executor agent (``response_prefix`` included) renamed ``agent_1``; they play
the same problems as the team (the same seeds give the same problems).

Budgets (``--budget``):

- ``samples`` (default): every arm trains ``--steps`` steps of ``--episodes`` episodes. Samples are counted per
  agent turn (one trained row per turn with a response), so the arms' sample counts differ and are reported;
  a safety limit ``budget.max_wall_time_s: 3600`` stays set.
- ``walltime``: every arm trains until the same ``budget.max_wall_time_s`` (``--wall-time``; counted by the
  trainer from the first evaluation, the final evaluation included; startup excluded), capped at ``--steps``
  steps (default 1000); the steps and samples each arm reached are reported.

Measured per run (from ``<out>/<arm>_s<seed>/metrics.jsonl``, ``eval.jsonl`` and ``bench_run.json``): steps,
samples (sum over agents and steps of ``<agent>/num_samples``), wall time, and on the held-out seeds (greedy)
task completion, utilization, violations, format validity and the env's team score (the same quantity for every
arm) at the first evaluation (step 0) and the last; the training team score per step and the first step at which
it reaches ``--threshold``. Per arm over the seeds: the mean and a 95% interval (Student t, n - 1 degrees of
freedom) of held-out completion and team score before and after training, the difference from the reference arm
paired by seed (same interval), and the samples and wall time (of the whole ``marti train`` process) as
ratios of the reference's (the steps too, in the JSON).

Every run is printed with the load average before and after it (the machine is shared), and the load average of
the whole command; ``--json PATH`` writes every number.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks.report import bench_parser, check_json_path, markdown_table, write_json
from marti.config import load_config
from marti.errors import InvalidArgumentError

ROOT = Path(__file__).resolve().parent.parent
BASE_CONFIG = ROOT / "examples" / "resource_allocation.yaml"
PRIVATE_CONFIG = ROOT / "examples" / "private_allocation.yaml"
ARMS = ("single", "multi")
PRIVATE_ARMS = ("team", "solo_part", "solo_all")
#: scenario -> (example config, its arms, the reference arm that ratios and differences are taken against).
SCENARIOS: dict[str, tuple[Path, tuple[str, ...], str]] = {
    "resource_allocation": (BASE_CONFIG, ARMS, "multi"),
    "private_allocation": (PRIVATE_CONFIG, PRIVATE_ARMS, "team"),
}
#: private_allocation's single-agent arms -> the env's ``solo_view``.
SOLO_VIEWS = {"solo_part": "executor", "solo_all": "all"}
BUDGETS = ("samples", "walltime")
#: ``budget.max_wall_time_s`` of a run under the samples budget: a safety limit, not the budget.
SAFETY_WALL_TIME_S = 3600.0
DEFAULT_WALLTIME_MAX_STEPS = 1000


def load_avg() -> float:
    """Return the 1-minute load average of this machine."""
    return os.getloadavg()[0]


def arm_config(
    arm: str,
    *,
    seed: int,
    steps: int,
    model: str,
    episodes: int,
    group: int,
    out_dir: Path,
    scenario: str = "resource_allocation",
    budget: str = "samples",
    wall_time_s: float | None = None,
    eval_episodes: int | None = None,
    config: Path | None = None,
) -> dict:
    """Build one arm's training config from the scenario's example config.

    Args:
        arm: An arm of ``scenario`` (:data:`SCENARIOS`): ``single``/``multi`` or ``team``/``solo_part``/``solo_all``.
        seed: Run seed (adapter initialisation and sampling); the problem seeds are the config's.
        steps: Training steps (``max_steps``): the budget under ``samples``, the cap under ``walltime``;
            evaluation runs at step 0 and after the last step.
        model: ``pretrain_model`` of every agent.
        episodes: Episodes per step (``rollout.episodes_per_step``); a multiple of ``group``.
        group: GRPO group size (episodes per problem seed).
        out_dir: The run's output directory.
        scenario: ``resource_allocation`` or ``private_allocation``.
        budget: ``samples`` (the same steps for every arm; ``budget.max_wall_time_s`` is the safety limit
            :data:`SAFETY_WALL_TIME_S`) or ``walltime`` (``budget.max_wall_time_s = wall_time_s``).
        wall_time_s: The wall-time budget in seconds; required with ``walltime``.
        eval_episodes: Held-out episodes per evaluation (``rollout.eval_episodes``); None keeps the config's.
        config: The config to build the arms from (a team of that scenario, e.g.
            ``examples/private_allocation_pick.yaml``); None: the scenario's example config.

    Returns:
        The config as a dict, ready to dump as YAML.

    Raises:
        ValueError: Unknown scenario, arm or budget, ``episodes`` not a positive multiple of ``group``,
            ``walltime`` without a positive ``wall_time_s``, or a ``config`` that :func:`config_problem` refuses
            for this arm (the message names the file).
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {tuple(SCENARIOS)}, got {scenario!r}")
    base, arms, _ = SCENARIOS[scenario]
    if arm not in arms:
        raise ValueError(f"arm of {scenario} must be one of {arms}, got {arm!r}")
    if budget not in BUDGETS:
        raise ValueError(f"budget must be one of {BUDGETS}, got {budget!r}")
    if budget == "walltime" and not (wall_time_s and wall_time_s > 0):
        raise ValueError(f"the walltime budget needs wall_time_s > 0, got {wall_time_s!r}")
    if episodes <= 0 or group <= 0 or episodes % group:
        raise ValueError(f"episodes ({episodes}) must be a positive multiple of group ({group})")
    if config is not None:
        problem = config_problem(config, scenario, (arm,))
        if problem:
            raise ValueError(problem)
    cfg = yaml.safe_load((config or base).read_text())
    prefix = "teamcmp" if scenario == "resource_allocation" else f"teamcmp_{scenario}_{budget}"
    cfg["training_name"] = f"{prefix}_{arm}_s{seed}"
    cfg["seed"] = seed
    cfg["max_steps"] = steps
    for agent in cfg["agents"]:
        agent["pretrain_model"] = model
    if arm in ("single", *SOLO_VIEWS):
        executor = next(a for a in cfg["agents"] if a["role"] == "executor")
        cfg["agents"] = [{**executor, "name": "agent_1"}]
        cfg["num_agents"] = 1
    if arm in SOLO_VIEWS:
        env = cfg["environment"]
        env["options"] = {**(env.get("options") or {}), "solo_view": SOLO_VIEWS[arm]}
    cfg["rollout"].update(episodes_per_step=episodes, group_size=group, eval_every=steps)
    if eval_episodes is not None:
        cfg["rollout"]["eval_episodes"] = eval_episodes
    cfg["output"] = {"dir": str(out_dir), "save_every": 0, "log_every": 1, "log_with": []}
    cfg["budget"] = {"max_wall_time_s": float(wall_time_s) if budget == "walltime" else SAFETY_WALL_TIME_S}
    return cfg


def config_problem(config: Path, scenario: str, arms: Sequence[str]) -> str | None:
    """Why ``config`` cannot give ``arms`` of ``scenario`` (for ``--config``), or None when it can.

    Args:
        config: A training config file.
        scenario: The comparison's scenario (``--scenario``).
        arms: The arms to build from it.

    Returns:
        A message naming the file and what is wrong: it is not a valid training config (as ``marti train``
        would load it; the loader's message), its ``environment.scenario`` (the schema default when absent) is
        not ``scenario``, or a single-agent arm is asked of a config without an agent of role ``executor``.
    """
    try:
        loaded = load_config(config)
    except InvalidArgumentError as e:
        return f"--config: {e}"
    found = loaded.environment.scenario
    if found != scenario:
        return f"{config} is a config of scenario {found!r}, not of --scenario {scenario!r}"
    solo = [a for a in arms if a in ("single", *SOLO_VIEWS)]
    if solo and not any(a.role == "executor" for a in loaded.agents):
        roles = [a.role for a in loaded.agents]
        return f"{config} has no agent of role 'executor' (roles {roles}); the arms {solo} are its executor alone"
    return None


def run_arm(cfg: dict, out_dir: Path) -> dict[str, Any]:
    """Run ``marti train`` on ``cfg`` in a subprocess; returns wall time, loads and the exit code."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    load_before = load_avg()
    t0 = time.monotonic()
    with open(out_dir / "train.log", "w") as log:
        rc = subprocess.call(
            [sys.executable, "-m", "marti.command.main", "train", str(path), "--no-progress"],
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
        ``steps``, ``samples`` (trained rows, one per agent turn: the sum over steps and agents of
        ``<agent>/num_samples``), ``train_team_score`` (list per step), ``first_eval`` / ``last_eval`` (eval
        tables at the first and last evaluation), ``last_eval_step``, ``steps_to_threshold`` (first step whose
        training team score is >= ``threshold``, or None), ``wall_s``, ``load_before``, ``load_after``, ``rc``.
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
    samples = sum(v for m in metrics for k, v in m["metrics"].items() if k.endswith("/num_samples"))
    return {
        "steps": len(scores),
        "samples": int(samples),
        "train_team_score": [v for _, v in scores],
        "first_eval": evals[0]["table"] if evals else {},
        "last_eval": evals[-1]["table"] if evals else {},
        "last_eval_step": evals[-1]["step"] if evals else None,
        "steps_to_threshold": reached,
        **info,
    }


def _mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def _pair(fe: dict, le: dict, key: str) -> str:
    """``first -> last`` of one evaluation metric, or ``-`` where either evaluation lacks it."""
    a, b = fe.get(key), le.get(key)
    return "-" if a is None or b is None else f"{a:.2f} -> {b:.2f}"


def _run_cells(arm: str, seed: int, r: dict[str, Any]) -> list[Any]:
    """One run's row of the per-run table."""
    fe, le = r["first_eval"], r["last_eval"]
    pairs = [
        _pair(fe, le, f"team/{k}")
        for k in ("format_valid", "task_completion", "resource_utilization", "team_score")
    ]
    reached = r["steps_to_threshold"] if r["steps_to_threshold"] is not None else "not reached"
    load = f"{r.get('load_before', float('nan')):.1f}/{r.get('load_after', float('nan')):.1f}"
    trace = " ".join(f"{v:.2f}" for v in r["train_team_score"])
    return [arm, seed, r["steps"], *pairs, trace, reached, f"{r.get('wall_s', float('nan')):.0f}", load]


def _arm_cells(arm: str, runs: dict[int, dict[str, Any]]) -> list[Any]:
    """One arm's row of the per-arm table: means ± spread over its finished runs."""
    rs = [r for r in runs.values() if r["steps"] > 0]  # unfinished or not-run seeds are left out
    keys = ("format_valid", "task_completion", "resource_utilization", "constraint_violations", "team_score")
    cols = [
        _mean_std([r["last_eval"][f"team/{k}"] for r in rs if f"team/{k}" in r["last_eval"]]) for k in keys
    ]
    finals = [r["train_team_score"][-1] for r in rs if r["train_team_score"]]
    alls = [statistics.mean(r["train_team_score"]) for r in rs if r["train_team_score"]]
    reached = sum(r["steps_to_threshold"] is not None for r in rs)
    return [arm, *cols, _mean_std(finals), _mean_std(alls), f"{reached}/{len(rs)}"]


def table(results: dict[str, dict[int, dict[str, Any]]], threshold: float) -> str:
    """The per-run and per-arm tables (Markdown, :func:`benchmarks.report.markdown_table`)."""
    runs = markdown_table(
        ["arm", "seed", "steps", "eval format validity first -> last", "eval completion first -> last",
         "eval utilization first -> last", "eval team score first -> last", "train team score per step",
         f"steps to >= {threshold}", "wall s", "load before/after"],
        [_run_cells(arm, seed, r) for arm, runs in results.items() for seed, r in sorted(runs.items())],
        "lrrlllllrrl",
    )  # fmt: skip
    arms = markdown_table(
        ["arm", "eval format validity (last)", "eval completion (last)", "eval utilization (last)",
         "eval violations (last)", "eval team score (last)", "final train team score (spread across seeds)",
         "mean train team score, all steps", "reached threshold"],
        [_arm_cells(arm, runs) for arm, runs in results.items()],
        "lllllllll",
    )  # fmt: skip
    return runs + "\n\n" + arms


def _t_pdf(x: float, df: int) -> float:
    c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(c - (df + 1) / 2 * math.log1p(x * x / df))


def t_cdf(x: float, df: int, intervals: int = 2000) -> float:
    """Student t distribution function with ``df`` degrees of freedom (Simpson's rule on the density).

    Args:
        x: The point.
        df: Degrees of freedom, >= 1.
        intervals: Simpson intervals on ``[0, |x|]`` (even); 2000 gives about 1e-9 for ``|x| <= 15``.

    Returns:
        ``P(T <= x)``.

    Raises:
        ValueError: ``df < 1``.
    """
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    a = abs(x)
    if a == 0:
        return 0.5
    h = a / intervals
    total = _t_pdf(0.0, df) + _t_pdf(a, df)
    total += sum((4 if i % 2 else 2) * _t_pdf(i * h, df) for i in range(1, intervals))
    half = min(total * h / 3, 0.5)
    return 0.5 + half if x > 0 else 0.5 - half


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom, for ``0.5 <= p < 1`` (bisection on
    :func:`t_cdf`, to 1e-9).

    Raises:
        ValueError: ``p`` outside ``[0.5, 1)`` or ``df < 1``.
    """
    if not 0.5 <= p < 1:
        raise ValueError(f"p must be in [0.5, 1), got {p}")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2
    while hi - lo > 1e-9:
        mid = (lo + hi) / 2
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def interval95(values: list[float]) -> dict[str, Any]:
    """Mean and 95% interval of ``values`` (Student t over them: ``mean +- t(0.975, n-1) * s / sqrt(n)``).

    Returns:
        ``{"n", "mean", "half", "low", "high"}``; with one value ``half``, ``low`` and ``high`` are None, with none
        all but ``n`` are None.
    """
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "half": None, "low": None, "high": None}
    mean = statistics.mean(values)
    if n == 1:
        return {"n": 1, "mean": mean, "half": None, "low": None, "high": None}
    half = t_quantile(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return {"n": n, "mean": mean, "half": half, "low": mean - half, "high": mean + half}


#: Held-out metrics summarised with an interval: key in the eval table -> column name.
SUMMARY_METRICS = {"team/task_completion": "completion", "team/team_score": "team score"}


def summarize_arms(
    results: dict[str, dict[int, dict[str, Any]]], reference: str
) -> dict[str, dict[str, Any]]:
    """Per arm over its finished seeds: intervals of the held-out metrics and the cost against ``reference``.

    Args:
        results: arm -> seed -> :func:`summarize_run` output; runs with no step are left out.
        reference: The arm that ratios and differences are taken against (it may be absent from ``results``).

    Returns:
        arm -> ``seeds`` (those that trained at least one step), ``evaluated_after`` (those whose last held-out
        evaluation is at their last step), ``steps``/``samples``/``wall_s`` (per-seed lists and ``*_mean``),
        ``ratio_samples``/``ratio_wall_s``/``ratio_steps`` (mean over mean of the reference, None without it),
        and per metric of :data:`SUMMARY_METRICS` ``<name> before`` (:func:`interval95` of the first held-out
        evaluation), ``<name> after`` (of the last, over ``evaluated_after``) and ``<name> after - <reference>``
        (of the per-seed differences of the last evaluation, over the seeds in both arms' ``evaluated_after``).
    """
    done = {arm: {s: r for s, r in runs.items() if r.get("steps", 0) > 0} for arm, runs in results.items()}
    out: dict[str, dict[str, Any]] = {}
    for arm, runs in done.items():
        seeds = sorted(runs)
        row: dict[str, Any] = {"seeds": seeds}
        for key in ("steps", "samples", "wall_s"):
            vals = [runs[s].get(key) for s in seeds if runs[s].get(key) is not None]
            row[key] = vals
            row[f"{key}_mean"] = statistics.mean(vals) if vals else None
        finished = [s for s in seeds if runs[s].get("last_eval_step") == runs[s]["steps"]]
        row["evaluated_after"] = finished
        for key, name in SUMMARY_METRICS.items():
            for when, table_key, which in (("before", "first_eval", seeds), ("after", "last_eval", finished)):
                row[f"{name} {when}"] = interval95(
                    [runs[s][table_key][key] for s in which if key in runs[s][table_key]]
                )
        out[arm] = row
    ref = out.get(reference)
    for arm, row in out.items():
        for key in ("steps", "samples", "wall_s"):
            a, b = row[f"{key}_mean"], ref[f"{key}_mean"] if ref else None
            row[f"ratio_{key}"] = a / b if a is not None and b else None
        for key, name in SUMMARY_METRICS.items():
            both = [s for s in row["evaluated_after"] if ref and s in ref["evaluated_after"]]
            diffs = [
                done[arm][s]["last_eval"][key] - done[reference][s]["last_eval"][key]
                for s in both
                if key in done[arm][s]["last_eval"] and key in done[reference][s]["last_eval"]
            ]
            row[f"{name} after - {reference}"] = interval95(diffs)
    return out


def equal_under(budget: str, *, steps: int, episodes: int, group: int, wall_time_s: float | None) -> str:
    """One sentence: what is equal across the arms under ``budget`` and what is not."""
    same = (
        f"{episodes} episodes per step (groups of {group}), the problem-seed schedule, the held-out seeds and "
        "the run seeds"
    )
    if budget == "walltime":
        return (
            f"Equal: a wall-time budget of {wall_time_s:g} s per run (budget.max_wall_time_s, from the first "
            f"evaluation to the end of the last; startup excluded), {same}. Not equal: steps (at most {steps}) "
            "and samples, reported per arm."
        )
    return (
        f"Equal: {steps} training steps x {same}. Not equal: samples (one per agent turn: the team trains one "
        "row per turn of each agent), compute and wall time, reported per arm."
    )


def _fmt_interval(iv: dict[str, Any], signed: bool = False, seeds: int = 0) -> str:
    if iv["mean"] is None:
        return "-"
    mean = f"{iv['mean']:+.3f}" if signed else f"{iv['mean']:.3f}"
    if iv["half"] is None:
        return f"{mean} (n=1)"
    text = f"{mean} [{iv['low']:.3f}, {iv['high']:.3f}]"
    return text if iv["n"] >= seeds else f"{text} (n={iv['n']})"


def _fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _cost_cells(name: str, r: dict[str, Any]) -> list[str]:
    """One arm's row of the cost table: seeds, steps per seed, samples and wall time against the reference."""
    steps = "-" if not r["steps"] else "/".join(str(v) for v in r["steps"])
    samples = "-" if r["samples_mean"] is None else f"{r['samples_mean']:.1f}"
    wall = "-" if r["wall_s_mean"] is None else f"{r['wall_s_mean']:.0f}"
    seeds = " ".join(map(str, r["seeds"])) or "-"
    return [name, seeds, steps, samples, _fmt_ratio(r["ratio_samples"]), wall, _fmt_ratio(r["ratio_wall_s"])]


def summary_table(summary: dict[str, dict[str, Any]], reference: str) -> str:
    """The per-arm tables (Markdown, :func:`benchmarks.report.markdown_table`): cost against the reference, and
    the held-out results with 95% intervals (``(n=k)`` when an interval covers fewer seeds than the arm trained: a
    run without its final evaluation)."""
    names = {arm: f"{arm} (reference)" if arm == reference else arm for arm in summary}
    cost = markdown_table(
        ["arm", "seeds", "steps", "samples (agent turns)", f"samples / {reference}", "wall s", f"wall / {reference}"],
        [_cost_cells(names[arm], r) for arm, r in summary.items()],
        "llrrrrr",
    )  # fmt: skip
    cols = [f"{n} {w}" for n in SUMMARY_METRICS.values() for w in ("before", "after", f"after - {reference}")]
    held_out = markdown_table(
        ["arm", *cols],
        [
            [names[arm], *(_fmt_interval(r[c], c.endswith(f"- {reference}"), len(r["seeds"])) for c in cols)]
            for arm, r in summary.items()
        ],
        "l" * (1 + len(cols)),
    )
    return f"{cost}\n\nheld-out (greedy), mean [95% interval, Student t over the seeds]:\n\n{held_out}"


def main(argv: list[str] | None = None) -> int:
    """Run every arm for every seed (or only summarize existing runs) and print the tables.

    Args:
        argv: Command-line arguments (see ``--help``).

    Returns:
        0 on success, 1 if any run exited non-zero.
    """
    p = bench_parser("team_comparison", __doc__)
    p.add_argument("--scenario", default="resource_allocation", choices=tuple(SCENARIOS), help="which task")
    p.add_argument("--budget", default="samples", choices=BUDGETS, help="what is equal across arms")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"training steps per run (samples budget, default 4); the most steps (walltime budget, default "
        f"{DEFAULT_WALLTIME_MAX_STEPS})",
    )
    p.add_argument(
        "--wall-time", type=float, default=600.0, help="walltime budget: seconds per run (default 600)"
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="run seeds (default 0 1 2)")
    p.add_argument(
        "--arms", nargs="+", default=None, help="which arms to run (default: all of the scenario's)"
    )
    p.add_argument("--model", default="smollm2-135m-instruct", help="pretrain_model of every agent")
    p.add_argument("--episodes", type=int, default=6, help="episodes per step (default 6)")
    p.add_argument("--group", type=int, default=3, help="GRPO group size (default 3)")
    p.add_argument(
        "--eval-episodes", type=int, default=None, help="held-out episodes (default: the config's)"
    )
    p.add_argument("--threshold", type=float, default=0.5, help="team-score threshold for steps-to-threshold")
    p.add_argument(
        "--out",
        default=None,
        help="output root (default runs/team_comparison, or runs/team_comparison/<scenario>_<budget> "
        "for any other scenario or budget, runs/team_comparison/<config name>_<budget> with --config)",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the team config the arms are built from (default: the scenario's example config)",
    )
    p.add_argument("--json", metavar="PATH", help="also write every number to PATH as JSON")
    p.add_argument("--summarize-only", action="store_true", help="do not train; summarize existing runs")
    args = p.parse_args(argv)
    _, scenario_arms, reference = SCENARIOS[args.scenario]
    arms = args.arms or list(scenario_arms)
    unknown = [a for a in arms if a not in scenario_arms]
    if unknown:
        p.error(f"--arms {unknown} not of scenario {args.scenario} (its arms: {' '.join(scenario_arms)})")
    if args.config is not None:
        problem = config_problem(args.config, args.scenario, arms)
        if problem:
            p.error(problem)
    check_json_path(p, args.json)
    steps = args.steps or (DEFAULT_WALLTIME_MAX_STEPS if args.budget == "walltime" else 4)
    if args.out:
        out_root = Path(args.out)
    elif args.config is not None:
        out_root = ROOT / "runs" / "team_comparison" / f"{args.config.stem}_{args.budget}"
    elif args.scenario == "resource_allocation" and args.budget == "samples":
        out_root = ROOT / "runs" / "team_comparison"
    else:
        out_root = ROOT / "runs" / "team_comparison" / f"{args.scenario}_{args.budget}"
    load_before = [round(x, 2) for x in os.getloadavg()]
    print("load average before: " + " ".join(f"{x:.2f}" for x in load_before), flush=True)
    failed = False
    results: dict[str, dict[int, dict[str, Any]]] = {arm: {} for arm in arms}
    for seed in args.seeds:
        for arm in arms:  # alternate arms so all see similar background load
            out_dir = out_root / f"{arm}_s{seed}"
            if not args.summarize_only:
                cfg = arm_config(
                    arm,
                    seed=seed,
                    steps=steps,
                    model=args.model,
                    episodes=args.episodes,
                    group=args.group,
                    out_dir=out_dir,
                    scenario=args.scenario,
                    budget=args.budget,
                    wall_time_s=args.wall_time,
                    eval_episodes=args.eval_episodes,
                    config=args.config,
                )
                info = run_arm(cfg, out_dir)
                print(
                    f"{arm} seed {seed}: rc={info['rc']} {info['wall_s']:.0f}s "
                    f"load {info['load_before']:.1f}->{info['load_after']:.1f}",
                    flush=True,
                )
                failed |= info["rc"] != 0
            results[arm][seed] = summarize_run(out_dir, args.threshold)
    summary = summarize_arms(results, reference)
    equal = equal_under(
        args.budget, steps=steps, episodes=args.episodes, group=args.group, wall_time_s=args.wall_time
    )
    load_after = [round(x, 2) for x in os.getloadavg()]
    print(f"scenario {args.scenario}, budget {args.budget}. {equal}")
    print()
    print(table(results, args.threshold))
    print()
    print(summary_table(summary, reference))
    print()
    print("load average after: " + " ".join(f"{x:.2f}" for x in load_after))
    if args.json:
        doc = {
            "scenario": args.scenario,
            "config": str(args.config or SCENARIOS[args.scenario][0]),
            "budget": args.budget,
            "reference": reference,
            "equal": equal,
            "steps": steps,
            "wall_time_s": args.wall_time if args.budget == "walltime" else None,
            "episodes": args.episodes,
            "group": args.group,
            "model": args.model,
            "seeds": args.seeds,
            "runs": {arm: {str(s): r for s, r in runs.items()} for arm, runs in results.items()},
            "arms": summary,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        }
        write_json(args.json, doc)
        print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
