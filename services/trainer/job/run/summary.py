"""What a training job reports when it ends (:class:`RunSummary`), its ``max_epochs`` note, and the config keys
that name user code (a service may refuse to import it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from marti.config import TrainConfig
from marti.team.workflow import is_import_path


@dataclass
class RunSummary:
    """What a finished run reports.

    Attributes:
        run_dir: Output directory.
        steps: Training steps completed (including resumed ones).
        start_step: The step the run resumed at (0 for a fresh run).
        stopped: True if stopped early (StopJob, wall-time budget).
        last_checkpoint: Path of the newest checkpoint.
        report: Path of report.md.
        eval_history: ``(step, metrics)`` of each evaluation.
        external_episodes: External episodes (played by clients through the gateway) the updates trained on:
            per update, the most any trainable agent took.
        untrained_external: Episodes clients reported (answered 200 or 202) that no update took: left in the
            agents' tables when the job ended (reported after the last update's take, e.g. during
            ``gateway.linger_s``), lost when the gateway closed (``gateway/backlog_lost_at_close``,
            ``gateway/held_lost_at_close``), or, with ``rollout.source: builtin``, every reported one.
        epochs: Passes over the finite training problem set completed (``max_epochs``; fractional), or None
            when the problem set is unbounded (``rollout.num_train_seeds`` null).
        epoch_limited: True when ``max_epochs`` ended the job before ``max_steps``.
    """

    run_dir: Path
    steps: int = 0
    start_step: int = 0
    stopped: bool = False
    last_checkpoint: str | None = None
    report: Path | None = None
    eval_history: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    external_episodes: int = 0
    untrained_external: int = 0
    epochs: float | None = None
    epoch_limited: bool = False


def epoch_limit_message(cfg: TrainConfig) -> str | None:
    """The log line of a job that ``max_epochs`` ends before ``max_steps``, or None when it does not.

    Example: ``max_epochs=2: 2 passes over the 6 training problems (rollout.num_train_seeds) take 6 steps,
    fewer than max_steps=100; the job ends after step 6``.
    """
    if cfg.total_steps >= cfg.max_steps:
        return None
    return (
        f"max_epochs={cfg.max_epochs}: {cfg.max_epochs} passes over the {cfg.rollout.num_train_seeds} training "
        f"problems (rollout.num_train_seeds) take {cfg.total_steps} steps, fewer than max_steps={cfg.max_steps}; "
        f"the job ends after step {cfg.total_steps}"
    )


def user_code_paths(cfg: TrainConfig) -> list[str]:
    """Config keys that name user code by import path (custom envs, workflow functions), as ``key=value``."""
    found = []
    if is_import_path(cfg.environment.env_name):
        found.append(f"environment.env_name={cfg.environment.env_name}")
    for i, t in enumerate(cfg.tasks):
        if is_import_path(t.env_name):
            found.append(f"tasks.{i}.env_name={t.env_name}")
    w = cfg.workflow
    for key in ("next_speakers", "factory", "reward_fn"):
        if getattr(w, key):
            found.append(f"workflow.{key}={getattr(w, key)}")
    for i, r in enumerate(w.roles):
        for key in ("prompt_builder", "parser", "scripted"):
            if getattr(r, key):
                found.append(f"workflow.roles.{i}.{key}={getattr(r, key)}")
    found += [f"reward.functions.{i}={fn}" for i, fn in enumerate(cfg.reward.functions)]
    return found
