"""``report.md`` of a run: PNG plots, a first-versus-last evaluation table and an auto-written summary.

:func:`write_report` reads only what the run wrote (``metrics.jsonl``, ``eval.jsonl``, ``config.yaml``), so a
report can be rebuilt at any time, also for a run that stopped early. Every sentence of the summary is computed
from those numbers, including when a change is smaller than the step-to-step spread of its curve (then it says
so) and when a metric was never logged (then its plot is left out and the report says that too).
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

from marti.plumbing.yaml_load import load_yaml
from services.trainer.observe.episodes_log import evaluated_seeds
from services.trainer.observe.metrics import (
    CLIP_FRAC,
    CONFIG_FILE,
    ENTROPY,
    EXTERNAL_REWARD,
    FORMAT_VALID,
    KL,
    POLICY_LOSS,
    RESOURCE_UTILIZATION,
    REWARD,
    TASK_COMPLETION,
    TEAM,
    TEAM_SCORE,
    TOKENS_PER_S,
    VALUE_LOSS,
    VERSION_LAG,
    MetricRecord,
    read_evals,
    read_metrics,
    series,
)

__all__ = ["REPORT_FILE", "PLOTS_DIR", "describe_change", "write_report"]

REPORT_FILE = "report.md"
PLOTS_DIR = "plots"
_HEADLINE = (
    f"{TEAM}/{REWARD}",
    f"{TEAM}/{TEAM_SCORE}",
    f"{TEAM}/{TASK_COMPLETION}",
    f"{TEAM}/{RESOURCE_UTILIZATION}",
    f"{TEAM}/{FORMAT_VALID}",
)
_DIAGNOSTICS = (KL, ENTROPY, POLICY_LOSS, VALUE_LOSS, CLIP_FRAC, TOKENS_PER_S, VERSION_LAG)
_NON_AGENT_SCOPES = {TEAM, "eval", "system", "time", "train"}


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def _label(key: str) -> str:
    """``team/task_completion`` -> ``team task completion``; ``team/team_score`` -> ``team score``."""
    scope, _, name = key.partition("/")
    if not name:
        return key
    if scope == TEAM and name.startswith(f"{TEAM}_"):
        return f"{TEAM} {name[len(TEAM) + 1 :].replace('_', ' ')}"
    return f"{scope} {name.replace('_', ' ')}"


def _reward_key(records: list[MetricRecord], agent: str) -> str:
    """The metric that carries ``agent``'s reward in training: ``<agent>/reward`` (the job's own episodes), else
    ``<agent>/external_reward`` (the mean return of the external episodes an update took: a job that plays none
    of its own, ``rollout.source: external``, logs only that)."""
    own = f"{agent}/{REWARD}"
    external = f"{agent}/{EXTERNAL_REWARD}"
    if any(own in r.values for r in records) or not any(external in r.values for r in records):
        return own
    return external


def describe_change(label: str, before: float, after: float, spread: float | None = None) -> str:
    """One honest sentence about how a metric moved, e.g. ``team reward went from 0.1 to 0.3 (rose by 0.2)``.

    Args:
        label: What the numbers are (``team reward on held-out seeds``).
        before: The earlier value.
        after: The later value.
        spread: Typical noise of the metric (standard deviation of its curve); when the change is smaller,
            the sentence says it is within that spread.

    Returns:
        A sentence ending with a full stop.
    """
    if not (math.isfinite(before) and math.isfinite(after)):
        return f"{label} went from {_fmt(before)} to {_fmt(after)} (not finite: no trend can be read)."
    delta = after - before
    if delta == 0:
        trend = "unchanged"
    else:
        trend = f"{'rose' if delta > 0 else 'fell'} by {_fmt(abs(delta))}"
    text = f"{label} went from {_fmt(before)} to {_fmt(after)} ({trend})"
    if spread is not None and math.isfinite(spread) and delta != 0 and abs(delta) < spread:
        text += f", a change smaller than the curve's spread (std {_fmt(spread)}), so not a clear trend"
    return text + "."


def _agents(config: dict[str, Any] | None, records: list[MetricRecord]) -> list[str]:
    if config and isinstance(config.get("agents"), list):
        return [str(a.get("name")) for a in config["agents"] if isinstance(a, dict)]
    seen: list[str] = []
    for rec in records:
        for key in rec.values:
            scope = key.partition("/")[0]
            if "/" in key and scope not in _NON_AGENT_SCOPES and scope not in seen:
                seen.append(scope)
    return seen


def _plot(path: Path, title: str, ylabel: str, curves: list[tuple[str, list[int], list[float], str]]) -> None:
    """Draw curves ``(label, steps, values, style)``; style ``-`` a line, ``o`` eval markers, ``--`` dashed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for label, steps, values, style in curves:
        if style == "o":
            ax.plot(steps, values, "o-", label=label, markersize=6, linewidth=1)
        else:
            ax.plot(steps, values, style, label=label, linewidth=1.5)
    ax.set_title(title)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


def _plot_grid(path: Path, panels: list[tuple[str, list[tuple[str, list[int], list[float]]]]]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = 2 if len(panels) > 1 else 1
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(6 * cols, 3.2 * rows), dpi=100)
    FigureCanvasAgg(fig)
    for i, (title, curves) in enumerate(panels):
        ax = fig.add_subplot(rows, cols, i + 1)
        for label, steps, values in curves:
            ax.plot(steps, values, "-", label=label, linewidth=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step", fontsize=8)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


def _std(values: list[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.pstdev(finite) if len(finite) >= 2 else None


def _window_trend(label: str, values: list[float]) -> str | None:
    """Compare the mean of the first and last quarter of a training curve (at least one step each)."""
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < 2:
        return None
    k = max(1, len(finite) // 4)
    head, tail = statistics.fmean(finite[:k]), statistics.fmean(finite[-k:])
    what = f"{label} (mean of the first {k} vs the last {k} logged steps)"
    return describe_change(what, head, tail, _std(finite))


def _eval_summary(evals: list[MetricRecord]) -> list[str]:
    if not evals:
        return ["No held-out evaluation was recorded, so nothing can be said about generalisation."]
    first, last = evals[0], evals[-1]
    keys = [k for k in _HEADLINE if k in first.values or k in last.values]
    if len(evals) == 1:
        found = ", ".join(f"{_label(k)} {_fmt(first.values[k])}" for k in keys if k in first.values)
        return [
            f"Only one held-out evaluation (step {first.step}): {found or 'no headline metric'}; no trend."
        ]
    out = []
    for key in keys:
        if key in first.values and key in last.values:
            _, vals = series(evals, key)
            label = f"{_label(key)} on held-out seeds (step {first.step} to step {last.step})"
            out.append(describe_change(label, first.values[key], last.values[key], _std(vals)))
    return out or ["The evaluations recorded no team metric (team/reward, team/task_completion, ...)."]


def _eval_table(evals: list[MetricRecord]) -> list[str]:
    if not evals:
        return ["No evaluation records."]
    first, last = evals[0], evals[-1]
    keys = sorted(set(first.values) | set(last.values), key=lambda k: (k not in _HEADLINE, k))
    lines = [
        f"| metric | first (step {first.step}) | last (step {last.step}) | change |",
        "| --- | --- | --- | --- |",
    ]
    for key in keys:
        a, b = first.values.get(key), last.values.get(key)
        change = _fmt(b - a) if a is not None and b is not None else "-"
        if a is not None and b is not None and math.isfinite(b - a) and b - a > 0:
            change = "+" + change
        lines.append(
            f"| {key} | {'-' if a is None else _fmt(a)} | {'-' if b is None else _fmt(b)} | {change} |"
        )
    return lines


_ACCURACY_NOTE = (
    "Fraction of held-out problems solved: by the team's final answer (`team/task_completion`), by each agent's "
    "own last answer (`team/accuracy/<agent>`, per-agent accuracy), and with `rollout.eval_samples` N > 1 by the "
    "majority vote over a problem's N samples and by some of k samples (pass@k, Chen et al. 2021); the team and "
    "agent columns are then means over all samples."
)


def _accuracy_keys(evals: list[MetricRecord]) -> list[str]:
    """The held-out accuracy keys the evaluations logged: the team's (``task_completion``), each agent's own
    (``team/accuracy/<agent>``, the ``dataset_task`` env), the majority vote and pass@k (``rollout.eval_samples``)."""
    seen = dict.fromkeys(k for r in evals for k in r.values)
    own = sorted(k for k in seen if k.startswith(f"{TEAM}/accuracy/"))
    sampled = sorted(
        (k for k in seen if k.startswith(f"{TEAM}/pass@")), key=lambda k: int(k.rsplit("@", 1)[1])
    )
    if not own and not sampled:
        return []
    extra = [f"{TEAM}/majority_vote"] if f"{TEAM}/majority_vote" in seen else []
    return [f"{TEAM}/{TASK_COMPLETION}", *own, *extra, *sampled]


def _accuracy_section(evals: list[MetricRecord], plots: Path) -> list[str]:
    """``## Held-out accuracy``: a table of every evaluation step and a plot (``plots/heldout_accuracy.png``),
    for runs that logged per-agent accuracy or a sampled evaluation; nothing otherwise."""
    keys = _accuracy_keys(evals)
    if not keys:
        return []
    names = {f"{TEAM}/{TASK_COMPLETION}": "team (final answer)"}
    names.update(
        {k: f"{k.rsplit('/', 1)[1]} (own answer)" for k in keys if k.startswith(f"{TEAM}/accuracy/")}
    )
    names.update({k: k.split("/", 1)[1] for k in keys if k not in names})
    lines = [
        "## Held-out accuracy",
        "",
        _ACCURACY_NOTE,
        "",
        "| step | " + " | ".join(names[k] for k in keys) + " |",
    ]
    lines.append("| --- " * (len(keys) + 1) + "|")
    for r in evals:
        cells = ["-" if k not in r.values else _fmt(r.values[k]) for k in keys]
        lines.append(f"| {r.step} | " + " | ".join(cells) + " |")
    curves = [(names[k], *series(evals, k), "o") for k in keys]
    _plot(plots / "heldout_accuracy.png", "Held-out accuracy", "accuracy", [c for c in curves if c[1]])
    return [*lines, "", f"![Held-out accuracy]({PLOTS_DIR}/heldout_accuracy.png)", ""]


def _load_config(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / CONFIG_FILE
    if not path.exists():
        return None
    data = load_yaml(path.read_text(encoding="utf-8"), str(path))
    return data if isinstance(data, dict) else None


def _headline_plot(
    plots: Path, name: str, key: str, title: str, train: list[MetricRecord], evals: list[MetricRecord]
) -> str | None:
    curves = []
    steps, vals = series(train, key)
    if steps:
        curves.append(("training episodes", steps, vals, "-"))
    esteps, evals_v = series(evals, key)
    if esteps:
        curves.append(("held-out evaluation", esteps, evals_v, "o"))
    if not curves:
        return None
    _plot(plots / name, title, title, curves)
    return f"{PLOTS_DIR}/{name}"


def write_report(run_dir: str | Path) -> Path:
    """Write ``report.md`` and its PNG plots (under ``plots/``) for a run directory.

    Plots: reward per agent (with the team reward), task completion rate, resource utilization (training
    curves and held-out evaluation points), and training diagnostics per agent (KL, entropy, losses, clip
    fraction, tokens/s, policy version lag) for whichever of them were logged.

    Args:
        run_dir: Directory a :class:`~services.trainer.observe.metrics.RunWriter` wrote.

    Returns:
        Path of the written ``report.md``.

    Raises:
        InvalidArgumentError: A metrics file holds a corrupt line (file and line named).
    """
    run_dir = Path(run_dir)
    train, evals = read_metrics(run_dir), read_evals(run_dir)
    config = _load_config(run_dir)
    agents = _agents(config, train + evals)
    plots = run_dir / PLOTS_DIR
    plots.mkdir(parents=True, exist_ok=True)
    name = (config or {}).get("training_name") or run_dir.name

    lines = [f"# Run report: {name}", ""]
    lines += _overview(run_dir, config, train, evals)
    summary, missing = [], []
    summary += _eval_summary(evals)
    for agent in agents + [TEAM]:
        key = _reward_key(train, agent)
        _, vals = series(train, key)
        trend = _window_trend(f"{_label(key)} in training", vals)
        if trend:
            summary.append(trend)
    bad = sorted({k for r in train for k, v in r.values.items() if not math.isfinite(v)})
    if bad:
        summary.append(f"Non-finite values were logged for: {', '.join(bad)}.")

    figures = []
    reward_curves = []
    for agent in agents:
        steps, vals = series(train, _reward_key(train, agent))
        if steps:
            reward_curves.append((agent, steps, vals, "-"))
    steps, vals = series(train, f"{TEAM}/{REWARD}")
    if steps:
        reward_curves.append(("team", steps, vals, "--"))
    esteps, evals_v = series(evals, f"{TEAM}/{REWARD}")
    if esteps:
        reward_curves.append(("team (held-out eval)", esteps, evals_v, "o"))
    if reward_curves:
        _plot(plots / "reward_per_agent.png", "Reward per agent", "mean episode reward", reward_curves)
        figures.append(("Reward per agent", f"{PLOTS_DIR}/reward_per_agent.png"))
    else:
        missing.append("reward (no `<agent>/reward`, `<agent>/external_reward` or `team/reward` metric)")
    for key, fname, title in (
        (f"{TEAM}/{TASK_COMPLETION}", "task_completion.png", "Task completion rate"),
        (f"{TEAM}/{RESOURCE_UTILIZATION}", "resource_utilization.png", "Resource utilization"),
        (f"{TEAM}/{FORMAT_VALID}", "format_valid.png", "Format validity"),
    ):
        rel = _headline_plot(plots, fname, key, title, train, evals)
        if rel:
            figures.append((title, rel))
        elif key != f"{TEAM}/{FORMAT_VALID}":
            missing.append(f"{title.lower()} (no `{key}` metric)")
    panels = []
    for metric in _DIAGNOSTICS:
        curves = [(a, *series(train, f"{a}/{metric}")) for a in agents]
        curves = [c for c in curves if c[1]]
        if curves:
            panels.append((metric.replace("_", " "), curves))
    if panels:
        _plot_grid(plots / "training_diagnostics.png", panels)
        figures.append(("Training diagnostics per agent", f"{PLOTS_DIR}/training_diagnostics.png"))

    lines += ["## Summary", "", "Written automatically from the logged numbers.", ""]
    lines += [f"- {s}" for s in summary] or ["- Nothing was logged."]
    if missing:
        lines += [f"- Not plotted, never logged: {m}." for m in missing]
    lines += ["", "## Plots", ""]
    for title, rel in figures:
        lines += [f"### {title}", "", f"![{title}]({rel})", ""]
    lines += ["## Held-out evaluation: first versus last", ""] + _eval_table(evals) + [""]
    lines += _accuracy_section(evals, plots)
    lines += ["## Last training step", ""] + _last_step_table(train) + [""]
    out = run_dir / REPORT_FILE
    out.write_text("\n".join(lines), encoding="utf-8")
    return out


def _overview(
    run_dir: Path, config: dict[str, Any] | None, train: list[MetricRecord], evals: list[MetricRecord]
) -> list[str]:
    lines = [f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')} from `{run_dir}`.", ""]
    if train:
        wall = train[-1].time - train[0].time
        lines.append(
            f"- Training steps logged: {len(train)} (steps {train[0].step} to {train[-1].step}), "
            f"{wall:.0f} s between the first and last record."
        )
    else:
        lines.append("- No training steps were logged.")
    counted = evaluated_seeds(run_dir, evals[-1].step) if evals else None
    lines.append(
        f"- Held-out evaluations: {len(evals)}"
        + (f" (steps {[e.step for e in evals]})" if evals else "")
        + (f"; the last played {counted[0]} episodes on {counted[1]} held-out problems" if counted else "")
    )
    if config:
        agents = config.get("agents") or []
        team = ", ".join(f"{a.get('name')} ({a.get('role')}, {a.get('pretrain_model')})" for a in agents)
        algo = (config.get("algorithm") or {}).get("advantage_estimator", "?")
        rollout = config.get("rollout") or {}
        source = rollout.get("source", "builtin")
        per_step = rollout.get("episodes_per_step", "?")
        if source == "external":  # the job plays nothing itself: each update takes the external episodes
            per_step = f"{(config.get('external') or {}).get('episodes_per_step', '?')} external"
        elif source == "mixed":
            per_step = (
                f"{per_step} own and {(config.get('external') or {}).get('episodes_per_step', '?')} external"
            )
        lines.append(f"- Team: {team}")
        lines.append(
            f"- Algorithm{' (last job)' if len(_history(run_dir)) > 1 else ''}: {algo}; {per_step} episodes per step in groups of "
            f"{rollout.get('group_size', '?')}; max_steps {config.get('max_steps', '?')}; seed {config.get('seed', '?')}"
        )
    return lines + _sampling(run_dir) + _segments(run_dir, train) + [""]


def _sampling(run_dir: Path) -> list[str]:
    """``- Rollout: engine E, dtype D`` of the run's last job (its ``config_history.jsonl`` record's ``rollout``:
    what ``rollout.engine`` / ``rollout.dtype`` resolved to); nothing when it is not recorded."""
    history = _history(run_dir)
    rollout = history[-1].get("rollout") if history else None
    if not rollout:
        return []
    return [
        f"- Rollout{' (last job)' if len(history) > 1 else ''}: engine {rollout['engine']}, dtype {rollout['dtype']}"
    ]


def _history(run_dir: Path) -> list[dict[str, Any]]:
    """The run's ``config_history.jsonl`` (:func:`services.trainer.job.run.run_dir.read_history`)."""
    from services.trainer.job.run.run_dir import read_history

    return read_history(run_dir)


def _segments(run_dir: Path, train: list[MetricRecord]) -> list[str]:
    """One line per job of a resumed run (``config_history.jsonl``): the steps it trained, its algorithm and the
    config keys it changed; nothing for a run of one job."""
    history = _history(run_dir)
    if len(history) < 2:
        return []
    last = train[-1].step if train else None
    lines = [f"- Jobs of this run ({len(history)}; resumed runs change keys only where a checkpoint allows):"]
    for i, rec in enumerate(history):
        end = history[i + 1]["start_step"] if i + 1 < len(history) else last
        changed = ", ".join(f"{k} {v[0]} -> {v[1]}" for k, v in rec.get("changed", {}).items())
        lines.append(
            f"  - steps {rec['start_step'] + 1} to {end if end is not None else '?'}: {rec.get('algorithm', '?')}"
            + (f" (changed: {changed})" if changed else "")
        )
    return lines


def _last_step_table(train: list[MetricRecord]) -> list[str]:
    if not train:
        return ["No training records."]
    last = train[-1]
    lines = [f"Step {last.step}.", "", "| metric | value |", "| --- | --- |"]
    lines += [f"| {k} | {_fmt(v)} |" for k, v in sorted(last.values.items())]
    return lines
