"""One update's batches: every trainable agent takes its next items from its table, into its policy actor."""

from __future__ import annotations

import threading
import time
from typing import Any

from marti.config import TrainConfig
from marti.errors import DeadlineExceededError

from .batch_reader import BatchReader
from .table_sampler import TrainedRow


def take_step_batches(
    cfg: TrainConfig,
    reader: BatchReader,
    runtime: Any,
    step: int,
    versions: dict[str, int],
    stop: threading.Event | None = None,
    gateway: Any = None,
) -> tuple[dict[str, list[TrainedRow]], dict[str, float]]:
    """Sample every trainable agent's batch of this update from its table, into its policy actor.

    Each agent consumes the next :attr:`~marti.config.TrainConfig.items_per_step` items of its table (one
    per built-in episode of the step, plus ``external.episodes_per_step`` external ones with ``rollout.source``
    external or mixed; items the table removed as staler than the agent's bound count as consumed), stating
    its current policy version. Each turn's lag is that version minus the version that generated the turn.
    External episodes arrive whenever their clients report, so they are waited for, up to
    ``external.wait_timeout_s`` for the whole step.

    Args:
        cfg: The job's config.
        reader: The learner's end of the tables (:class:`~services.trainer.data.batch_reader.BatchReader`).
        runtime: Its policy actors sample and keep the trajectories (``RayRuntime.take_items``); the driver
            gets episode ids and the batch's figures (``RayRuntime.batch_summary``), never a token.
        step: The update (0-based), whose rollout has finished (every built-in item of it is in the tables).
        versions: Each agent's learner version now.
        stop: Set to end a wait for external episodes at once.
        gateway: The job's gateway host (its address and counters name what was waited for), or None.

    Returns:
        ``(batches, metrics)``: per agent the rows of its trajectories that have a turn to train on
        (:class:`~services.trainer.data.table_sampler.TrainedRow`; ``RayRuntime.train_taken`` trains on
        them); metrics ``<agent>/version_lag`` (mean lag of the trained turns), ``<agent>/version_lag_max``,
        ``<agent>/stale_dropped`` (items not trained on because they, or a member of their group, were older
        than the bound) and ``<agent>/items`` (a group is taken whole, see :meth:`BatchReader.take`); with
        external episodes also ``<agent>/external_items``, ``<agent>/external_reward`` (their mean return) and
        ``external/waiting_episodes`` (external episodes inserted that no update has taken yet).

    Raises:
        DeadlineExceededError: External episodes did not arrive within ``external.wait_timeout_s`` (the
            counts and the gateway's counters are named).
        CancelledError: The job was asked to stop while waiting for them.
    """
    count = cfg.items_per_step
    external = cfg.external_episodes_per_step
    deadline = time.monotonic() + cfg.external.wait_timeout_s if external else None
    batches: dict[str, list[TrainedRow]] = {}
    metrics: dict[str, float] = {}
    for agent in cfg.tuning_agents:  # frozen agents act but have no table: nothing would drain it
        try:
            taken = reader.take(agent, count, versions[agent], deadline=deadline, stop=stop)
        except DeadlineExceededError as exc:
            where = f"; gateway {gateway.http_address()}: {gateway.counts()}" if gateway is not None else ""
            raise DeadlineExceededError(
                f"update {step + 1}: {exc} (rollout.source={cfg.rollout.source}: "
                f"{cfg.builtin_episodes_per_step} built-in episodes + external.episodes_per_step={external} "
                f"per update) within external.wait_timeout_s={cfg.external.wait_timeout_s:g}s{where}"
            ) from None
        got = runtime.batch_summary(agent, versions[agent])
        batches[agent] = list(got.trained)
        metrics[f"{agent}/items"] = float(len(taken.item_ids))
        metrics[f"{agent}/version_lag"] = got.lag_mean
        metrics[f"{agent}/version_lag_max"] = float(got.lag_max)
        metrics[f"{agent}/stale_dropped"] = float(taken.stale + taken.dropped)
        if external:
            metrics[f"{agent}/external_items"] = float(got.external_items)
            metrics["external/waiting_episodes"] = float(reader.external.untaken())
            if got.external_reward is not None:
                metrics[f"{agent}/external_reward"] = got.external_reward
    return batches, metrics
