"""Means over a batch of played episodes: the step's and an evaluation's team, agent and per-task metrics."""

from __future__ import annotations

from services.trainer.rollout.episodes.runner import RUNNER_METRIC_KEYS, EpisodeResult


def episode_metrics(results: list[EpisodeResult]) -> dict[str, float]:
    """Means over episodes: the metrics the episodes' envs declare (``metadata["metrics"]``, in order of first
    appearance; each averaged over the episodes that report it) then the runner's counters
    (:data:`~services.trainer.rollout.episodes.runner.RUNNER_METRIC_KEYS`) as ``team/<metric>``; returns as ``<agent>/reward``
    and ``team/reward`` (the mean of the agents' returns)."""
    out: dict[str, float] = {}
    env_keys = dict.fromkeys(k for r in results for k in r.metrics if k not in RUNNER_METRIC_KEYS)
    for key in (*env_keys, *RUNNER_METRIC_KEYS):
        vals = [r.metrics[key] for r in results if key in r.metrics]
        if vals:
            out[f"team/{key}"] = sum(vals) / len(vals)
    agents = sorted({a for r in results for a in r.returns})
    for a in agents:
        vals = [r.returns[a] for r in results if a in r.returns]
        out[f"{a}/reward"] = sum(vals) / len(vals)
    if agents:
        out["team/reward"] = sum(out[f"{a}/reward"] for a in agents) / len(agents)
    return out


def task_metrics(results: list[EpisodeResult]) -> dict[str, float]:
    """Per-task means: :func:`episode_metrics` of each task's episodes as ``task/<name>/<key>``, plus
    ``task/<name>/episodes`` (count). Episodes without a task are skipped."""
    out: dict[str, float] = {}
    for name in sorted({r.task for r in results if r.task is not None}):
        mine = [r for r in results if r.task == name]
        out[f"task/{name}/episodes"] = float(len(mine))
        for k, v in episode_metrics(mine).items():
            out[f"task/{name}/{k}"] = v
    return out
