"""The learner's own take from an agent's table: the trajectories stay where they are trained.

The policy actor that trains an agent holds a :class:`TableSampler` (OpenRLHF's actor-owned buffer, Reverb's
learner dataset): each sample call keeps the items it took and answers with their episode ids only, so the
driver, which runs :class:`~services.trainer.data.batch_reader.BatchReader`'s slot rule and waits, never
deserialises a token. After the take, :meth:`TableSampler.summary` closes the batch and answers the figures the
driver's metrics and the priority allocator read; :meth:`TableSampler.pop` hands the kept trajectories to the
update.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from marti.errors import DeadlineExceededError, FailedPreconditionError
from marti.types.trajectory import Trajectory
from services.trainer.learn.experience import group_key, row_count, trained_tokens, trained_turns

#: Seconds one learner sample call waits for an item before the table counts as dry.
SAMPLE_POLL_S = 2.0


@dataclass(frozen=True)
class SampledIds:
    """What one sample call took from a table, as episode ids (the trajectories stay with the sampler).

    Attributes:
        item_ids: Episode ids of the items taken to train on, in table order (whole groups).
        stale_ids: Episode ids the table removed as older than the agent's bound.
        dropped_ids: Episode ids of fresh items the table removed with their group because a member was stale.
    """

    item_ids: tuple[str, ...] = ()
    stale_ids: tuple[str, ...] = ()
    dropped_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrainedRow:
    """One trajectory of a batch with a turn to train on, as the priority allocator weighs it.

    Attributes:
        index: Its place among the batch's trained trajectories (what :meth:`TableSampler.pop` keeps).
        group: Its group (:func:`~services.trainer.learn.experience.group_key`).
        rows: Its trained turns (:func:`~services.trainer.learn.experience.row_count`).
        tokens: Response tokens of those turns.
    """

    index: int
    group: str
    rows: int
    tokens: int


@dataclass(frozen=True)
class BatchSummary:
    """The figures of one update's batch of an agent that the driver reads.

    Attributes:
        items: Items taken (trained or not).
        lag_mean: Mean policy-version lag of the trained turns (0.0 when none).
        lag_max: Largest lag of a trained turn (0 when none).
        external_items: Items an inference gateway inserted (``metadata["source"] == "gateway"``).
        external_reward: Mean outcome reward of those; None when there are none.
        trained: Per trajectory with a turn to train on, its :class:`TrainedRow`, in batch order.
    """

    items: int = 0
    lag_mean: float = 0.0
    lag_max: int = 0
    external_items: int = 0
    external_reward: float | None = None
    trained: tuple[TrainedRow, ...] = field(default_factory=tuple)


class TableSampler:
    """Takes items from the agents' tables and keeps them until the update (thread-safe).

    Args:
        store: An :class:`marti.ExperienceSharingClient` (one channel, reused for every call).
    """

    def __init__(self, store: Any) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._pending: dict[str, list[Trajectory]] = {}
        self._batch: dict[str, list[Trajectory]] = {}

    def sample(self, agent: str, table: str, count: int, current_version: int) -> SampledIds | None:
        """One sample call: up to ``count`` items of ``table`` in whole groups, kept for ``agent``'s update.

        Args:
            agent: The trainable agent whose table it is.
            table: Its table name.
            count: Items wanted, >= 1.
            current_version: The learner's policy version of the agent, for the table's ``max_policy_lag``.

        Returns:
            The ids taken and removed (:class:`SampledIds`), or None when nothing came within
            :data:`SAMPLE_POLL_S` (an empty table is a wait, not a service outage to reconnect from).

        Raises:
            UnavailableError: the store cannot be reached (the caller reconnects).
        """
        try:
            got = self.store.sample_batch(
                table, count, timeout_s=SAMPLE_POLL_S, allow_partial=True,
                current_policy_version=current_version, whole_groups=True,
            )  # fmt: skip
        except DeadlineExceededError:
            return None
        trajectories = [item.trajectory for item in got.items]
        with self._lock:
            self._pending.setdefault(agent, []).extend(trajectories)
        return SampledIds(
            tuple(t.episode_id for t in trajectories),
            tuple(got.stale_episode_ids),
            tuple(got.dropped_episode_ids),
        )

    def pending(self, agent: str) -> list[Trajectory]:
        """The items taken for ``agent`` since its last :meth:`summary` (a copy), in table order."""
        with self._lock:
            return list(self._pending.get(agent, []))

    def summary(self, agent: str, current_version: int) -> BatchSummary:
        """Close ``agent``'s take: its pending items become the batch :meth:`pop` reads, and their figures.

        Args:
            agent: A trainable agent.
            current_version: Its learner version now; a turn's lag is this minus the version that generated it.

        Returns:
            A :class:`BatchSummary`.
        """
        with self._lock:
            batch = self._batch[agent] = self._pending.pop(agent, [])
        lags = [
            current_version - (t.policy_version if turn.policy_version is None else turn.policy_version)
            for t in batch
            for _, turn in trained_turns(t)
        ]
        ext = [t.outcome_reward for t in batch if t.metadata.get("source") == "gateway"]
        trained = [t for t in batch if trained_turns(t)]
        return BatchSummary(
            items=len(batch),
            lag_mean=sum(lags) / len(lags) if lags else 0.0,
            lag_max=max(lags, default=0),
            external_items=len(ext),
            external_reward=sum(ext) / len(ext) if ext else None,
            trained=tuple(
                TrainedRow(i, group_key(t), row_count(t), trained_tokens([t])) for i, t in enumerate(trained)
            ),
        )

    def pop(self, agent: str, keep: list[int] | None = None) -> list[Trajectory]:
        """The trajectories of ``agent``'s last :meth:`summary` to train on; the batch is then gone.

        Args:
            agent: A trainable agent.
            keep: Indices into the summary's ``trained`` rows (the allocator's cut); None = all of them.

        Returns:
            Those trajectories, in batch order.

        Raises:
            FailedPreconditionError: no batch of ``agent`` is waiting (no :meth:`summary` since the last pop),
                or ``keep`` names an index out of range.
        """
        with self._lock:
            batch = self._batch.pop(agent, None)
        if batch is None:
            raise FailedPreconditionError(
                f"no batch of agent {agent!r} is waiting (take and summarise first)"
            )
        trained = [t for t in batch if trained_turns(t)]
        if keep is None:
            return trained
        bad = [i for i in keep if not 0 <= i < len(trained)]
        if bad:
            raise FailedPreconditionError(
                f"keep names rows {bad} of agent {agent!r}'s batch of {len(trained)} trained trajectories"
            )
        return [trained[i] for i in keep]
