"""Domain types of the experience store's clients: what an insert, a read and a sample return, and a table's live
state (:class:`SampledTrajectory`, the sampled item, lives in :mod:`marti.types.experience`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from marti.types.experience import SampledTrajectory, TableConfig
from marti.types.trajectory import Trajectory


@dataclass(frozen=True, slots=True)
class StoredTrajectory:
    """A stored item as read back by ``get_items``.

    Attributes:
        key: Item key.  table: Its table.  priority: Current priority.
        times_sampled: Samples so far.  trajectory: The trajectory.
    """

    key: int
    table: str
    priority: float
    times_sampled: int
    trajectory: Trajectory


@dataclass(frozen=True, slots=True)
class SampleBatch:
    """What one :meth:`ExperienceSharingClient.sample_batch` call consumed from a table.

    Attributes:
        items: The trajectories returned, in selection order.
        stale_keys: Keys of items the table removed instead of returning, because their ``policy_version`` was
            more than the table's ``max_policy_lag`` behind the caller's ``current_policy_version``. Each took one
            of the ``batch_size`` slots: ``len(items) + len(stale_keys)`` items were consumed.
        stale_episode_ids: The episode id of each ``stale_keys`` entry, in the same order.
        dropped_keys: ``whole_groups``: keys of fresh items removed with their group because another member was
            stale; each took one slot.
        dropped_episode_ids: The episode id of each ``dropped_keys`` entry, in the same order.
    """

    items: list[SampledTrajectory]
    stale_keys: list[int]
    stale_episode_ids: list[str] = field(default_factory=list)
    dropped_keys: list[int] = field(default_factory=list)
    dropped_episode_ids: list[str] = field(default_factory=list)

    @property
    def consumed(self) -> int:
        """Items taken from the table: returned plus removed as stale or dropped with their group."""
        return len(self.items) + len(self.stale_keys) + len(self.dropped_keys)


@dataclass(frozen=True, slots=True)
class Inserted:
    """One item of :meth:`ExperienceSharingClient.insert`.

    Attributes:
        key: The new item's key; for a duplicate, the key of the episode's item still in the table (0 once taken).
        duplicate: The table already held or had taken this episode: nothing was inserted.
    """

    key: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class TableInfo:
    """Live state of a table (see the proto ``TableInfo`` for each field)."""

    name: str
    size: int
    num_bytes: int
    inserts: int
    samples: int
    deletes: int
    evictions: int
    priority_updates: int
    priority_updates_missing: int
    waiting_inserts: int
    waiting_samples: int
    rate_limiter_diff: float
    config: TableConfig
    stale_removed: int = 0
