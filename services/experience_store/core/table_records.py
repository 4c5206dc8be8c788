"""The records a :class:`~.table.Table` takes and gives: an item to insert (:class:`NewItem`), an idempotent
insert's answer (:class:`Duplicate`), a sampled item (:class:`SampledItem`), a sample's held take (:class:`Take`),
and the priority check every insert and update applies."""

from __future__ import annotations

import copy
import math
from collections import Counter
from dataclasses import dataclass, field

from marti.errors import InvalidArgumentError
from marti.types.trajectory import TrajectorySummary

from .storage import ItemRecord


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item to insert: its compressed payload, its summary and its priority; ``idempotent`` inserts it at
    most once per episode id (see :meth:`Table.insert`)."""

    payload: bytes
    summary: TrajectorySummary
    priority: float = 1.0
    idempotent: bool = False


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The result of an idempotent insert whose episode the table held or had taken: nothing was inserted.

    Attributes:
        key: The episode's item still in the table, or 0 once it was taken.
    """

    key: int


@dataclass(frozen=True, slots=True)
class SampledItem:
    """One sampled item.

    Attributes:
        record: The item's metadata after this sample (``times_sampled`` already incremented).
        payload: The stored (compressed) payload.
        probability: Probability that this item was the one selected.
        table_size: Number of items the selection was made among.
        importance_weight: Prioritized samplers: ``(table_size * probability)^-beta`` normalised by the batch
            maximum; 1.0 for other samplers.
        stale: True when the item was beyond the table's ``max_policy_lag``: it was removed instead of returned
            and ``payload`` is empty.
        dropped: True when a whole-groups sample removed the (fresh) item with its group because another member
            was stale; ``payload`` is empty.
    """

    record: ItemRecord
    payload: bytes
    probability: float
    table_size: int
    importance_weight: float
    stale: bool = False
    dropped: bool = False


@dataclass(slots=True)
class Take:
    """Items one sample took from a table and holds, not yet committed: :meth:`Table.commit` makes the take
    durable, :meth:`Table.release` puts every item back where it was (order, sample counts, rate-limiter
    counters), as if the sample never happened.

    Attributes:
        items: The sampled items (stale ones included, flagged), in selection order.
        removed: Original records of the items the take removed from the table (sampled out or stale), by key.
        bumps: How many times the take sampled each key.
        stale: How many of ``removed`` were removed as stale.
        dropped: Keys of ``removed`` dropped with a stale member's group (whole-groups samples).
        dropped_groups: Group ids the take dropped whole, each with how many of its members were not in the
            table yet (whole-groups samples).
        late: Group ids of earlier dropped groups whose late members the take dropped, with how many.
        unfillable: Group ids the take passed over because their ``group_size`` is over the ``max_size`` of a table
            that blocks when full (the group can never be in it whole), each with its ``group_size``.
        open: True until the take is committed or released.
    """

    items: list[SampledItem] = field(default_factory=list)
    removed: dict[int, ItemRecord] = field(default_factory=dict)
    bumps: Counter = field(default_factory=Counter)
    stale: int = 0
    dropped: set[int] = field(default_factory=set)
    dropped_groups: dict[str, int] = field(default_factory=dict)
    late: Counter = field(default_factory=Counter)
    unfillable: dict[str, int] = field(default_factory=dict)
    open: bool = True

    @property
    def consumed(self) -> int:
        """Slots of the sample this take filled: returned plus stale items."""
        return len(self.items)


def check_priority(priority: float, where: str = "priority") -> float:
    """Return ``priority`` as float if finite and >= 0.

    Raises:
        InvalidArgumentError: naming the value when it is NaN, infinite or negative.
    """
    p = float(priority)
    if not math.isfinite(p) or p < 0:
        raise InvalidArgumentError(f"{where} must be finite and >= 0, got {priority}")
    return p


def snapshot(rec: ItemRecord) -> ItemRecord:
    """A copy of ``rec`` that later changes to the table's record (sample counts, priority) do not reach."""
    return copy.copy(rec)
