"""What env each episode of a job plays: env configs from the training config, multi-task scheduling and the
difficulty curriculum's glue (the pure cores are :mod:`services.trainer.rollout.episodes.scheduler`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from marti.config import TaskConfig, TrainConfig
from marti.errors import InvalidArgumentError, UnknownConfigKeyError
from services.trainer.rollout.episodes.scheduler import Curriculum, TaskScheduler, TaskSpec

if TYPE_CHECKING:
    from services.trainer.rollout.episodes.runner import EpisodeResult

_LOG = logging.getLogger("marti.trainer")


#: The keys :func:`env_config` sets in every env's config (``scenario``, ``difficulty`` and ``role_weight`` when
#: the job has them): a registered env the job plays must declare them in its schema.
JOB_ENV_KEYS = (
    "max_turns", "reward_type", "observation_format", "num_agents", "roles", "history_messages", "role_weight",
    "scenario", "difficulty",
)  # fmt: skip


@contextlib.contextmanager
def env_context(task: str | None, env_name: str, level: str | None) -> Iterator[None]:
    """Prefix an env's refusal of its config (:class:`~marti.errors.InvalidArgumentError`) with the job's task
    and curriculum level, so that the message says which part of the training config to fix (a job with neither
    gets the env's message unchanged); an unknown key that the job itself sets (:data:`JOB_ENV_KEYS`) is
    prefixed with the env's name (and task, level) and gets a note saying so and what to do."""
    try:
        yield
    except InvalidArgumentError as e:
        key = e.metadata.get("config_key") if isinstance(e, UnknownConfigKeyError) else None
        note = (
            f"; the job sets {key!r} in every env's config ({', '.join(JOB_ENV_KEYS)}), so an env it plays by "
            "name must declare these keys in its schema, or be named by import path (a factory may ignore "
            "them; docs/workflows.md, 'Custom environments')"
            if key in JOB_ENV_KEYS
            else ""
        )
        if task is None and level is None and not note:
            raise
        at = f" at curriculum level {level!r}" if level is not None else ""
        where = f"task {task!r} ({env_name}){at}" if task is not None else f"environment {env_name!r}{at}"
        raise InvalidArgumentError(f"{where}: {e}{note}", metadata=e.metadata) from e


def env_config(
    cfg: TrainConfig, task: TaskConfig | None = None, difficulty: str | None = None
) -> dict[str, Any]:
    """Env config for ``marti.make`` from the ``environment`` section and ``reward_alloc``.

    The trainer carries the team's conversation over comm_broker, so the env's own transcript is off
    (``history_messages=0``) unless ``environment.options`` sets it. The env's role weight is
    ``role_weight / team_weight``; returns are then scaled by ``team_weight`` (see :func:`agent_return`), so an
    agent's reward is ``team_weight * team + role_weight * role``.

    Args:
        cfg: The training config.
        task: A task of a multi-task job: its ``scenario``, ``difficulty``, ``max_turns`` and ``options``
            override the ``environment`` section's.
        difficulty: The curriculum's level for the task (overrides both).
    """
    e = cfg.environment
    out: dict[str, Any] = {
        "max_turns": (task.max_turns if task and task.max_turns else None) or e.max_turns,
        "reward_type": e.reward_type,
        "observation_format": e.observation_format,
        "num_agents": len(cfg.agents),
        "roles": [a.role for a in cfg.agents],
        "history_messages": 0,
    }
    scenario = (task.scenario if task else None) or e.scenario
    if scenario:
        out["scenario"] = scenario
    level = difficulty or (task.difficulty if task else None) or e.difficulty
    if level:
        out["difficulty"] = level
    ra = cfg.reward_alloc
    if ra.team_weight > 0 and scenario != "debate":
        out["role_weight"] = ra.role_weight / ra.team_weight
    out.update(e.options)
    if task is not None:
        out.update(task.options)
    return out


def agent_return(cfg: TrainConfig, env_return: float) -> float:
    """Scale an env return by ``reward_alloc.team_weight`` (see :func:`env_config`)."""
    w = cfg.reward_alloc.team_weight
    return env_return * w if w > 0 else env_return


def build_scheduler(cfg: TrainConfig) -> TaskScheduler | None:
    """The job's :class:`TaskScheduler` over its ``tasks`` (weights, ``seed``, ``task_sampling``); None without
    tasks."""
    if not cfg.tasks:
        return None
    return TaskScheduler([TaskSpec(t.name, t.weight) for t in cfg.tasks], cfg.seed, cfg.task_sampling)


def build_curriculum(cfg: TrainConfig) -> Curriculum | None:
    """The job's difficulty :class:`Curriculum` (``curriculum`` section) over its tasks (``default`` without
    tasks), starting each at its configured difficulty when that is one of the levels; None when disabled."""
    cur = cfg.curriculum
    if not cur.enabled:
        return None
    start = {t.name: t.difficulty for t in cfg.tasks if t.difficulty in cur.levels} or (
        {"default": cfg.environment.difficulty} if cfg.environment.difficulty in cur.levels else None
    )
    names = list(dict.fromkeys(t.name for t in cfg.tasks)) or ["default"]
    return Curriculum(names, cur.levels, cur.threshold, cur.window, start=start)


def success_value(result: EpisodeResult, metric: str) -> float:
    """The episode's ``metric`` (an env metric or runner counter), or its mean credited return if absent."""
    if metric in result.metrics:
        return result.metrics[metric]
    vals = list(result.returns.values())
    return sum(vals) / len(vals) if vals else 0.0


def curriculum_step(cur: Curriculum, cfg: TrainConfig, results: list[EpisodeResult]) -> dict[str, float]:
    """Feed a step's episodes to the curriculum (success: ``curriculum.metric >= curriculum.success_value``);
    returns ``task/<name>/difficulty_level`` (0-based index), ``task/<name>/success_rate`` and
    ``task/<name>/level_up`` (1 if the level rose this step)."""
    c = cfg.curriculum
    out: dict[str, float] = {}
    for name in cur.index:
        mine = [r for r in results if (r.task or "default") == name]
        ok = [success_value(r, c.metric) >= c.success_value for r in mine]
        rose = cur.record(name, ok) if ok else False
        out[f"task/{name}/success_rate"] = cur.success_rate(name)
        out[f"task/{name}/difficulty_level"] = float(cur.index[name])
        out[f"task/{name}/level_up"] = float(rose)
        if rose:
            _LOG.info("curriculum: task %s moves up to %s", name, cur.level(name))
    return out


def episode_env(
    cfg: TrainConfig,
    data: Any,
    task: str | None,
    level: str | None,
    seed: int,
    make: Callable[[str, int, dict[str, Any]], Any],
) -> Any:
    """The env an episode of ``task`` (None: the ``environment`` section's) plays at curriculum ``level`` (None:
    none), made by ``make(env_name, seed, config)``; an env's refusal of its config names the task and level
    (:func:`env_context`).

    Args:
        cfg: The training config.
        data: A dataset job's problems (:class:`~services.trainer.data.tasks.DatasetTasks`: the episode's row
            travels in its env config), or None.
        task: A task name of ``cfg.tasks``, or None.
        level: The task's curriculum level, or None.
        seed: The episode's problem seed.
        make: Builds the env: the job's env server, or ``marti.make`` in process.
    """
    t = next(x for x in cfg.tasks if x.name == task) if task is not None else None
    name = (t.env_name if t is not None else None) or cfg.environment.env_name
    with env_context(task, name, level):
        if data is not None:
            return make(name, seed, data.env_config(cfg, seed))
        return make(name, seed, env_config(cfg, task=t, difficulty=level))


def check_envs(
    cfg: TrainConfig,
    curriculum: Curriculum | None,
    data: Any,
    make: Callable[[str, int, dict[str, Any]], Any],
) -> None:
    """Make (and close) each task's env at its current level and, with a curriculum, at every level it can reach
    above it, so that an env that refuses its config (a bad ``environment.options`` value, a level it lacks) fails
    the job before anything slow starts, not at the first rollout or when the level is reached. A job whose
    episodes all come from outside (``rollout.source: external``, ``eval_every`` 0) plays no env and checks none.

    Args:
        cfg: The training config.
        curriculum: The job's curriculum (its current levels), or None.
        data: A dataset job's problems, or None (see :func:`episode_env`).
        make: Builds an env, as for :func:`episode_env`; it may return None for an env it cannot build here
            (nothing is checked then).

    Raises:
        InvalidArgumentError: An env refused its config; the message names the task and the level.
    """
    if cfg.rollout.source == "external" and not cfg.rollout.eval_every:
        return
    levels = list(cfg.curriculum.levels)
    for task in [t.name for t in cfg.tasks] or [None]:
        reach: list[str | None] = [None]
        if curriculum is not None:
            reach = levels[levels.index(curriculum.level(task or "default")) :]
        for level in reach:
            env = episode_env(cfg, data, task, level, 0, make)
            close = getattr(env, "close", None)
            if callable(close):
                close()
