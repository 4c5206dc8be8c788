"""Item selectors, used both as samplers (which item a sample returns) and removers (which item is evicted).

Definitions (Reverb's selectors; n = number of items, p_i = priority of item i):

- ``uniform``: P(i) = 1/n.
- ``prioritized``: P(i) = p_i^alpha / sum_j p_j^alpha (Schaul et al. 2016, "Prioritized Experience Replay",
  eq. 1); importance weight w_i = (n * P(i))^(-beta), normalised by the largest weight in the batch (ibid. 3.4).
- ``fifo``: the oldest item (smallest insertion sequence number), P = 1.
- ``lifo``: the newest item, P = 1.
- ``max_heap``: the item with the largest priority, ties broken by age (oldest first), P = 1.
- ``min_heap``: the item with the smallest priority, ties broken by age (oldest first), P = 1.

Each selector keeps an index for O(1) or O(log n) selection over all items. Selection among a filtered subset
(:meth:`Selector.select_among`) applies the same definition to the subset in O(n).
"""

from __future__ import annotations

import heapq
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from marti.errors import FailedPreconditionError, InvalidArgumentError


@dataclass(frozen=True, slots=True)
class Candidate:
    """An item as seen by :meth:`Selector.select_among`.

    Attributes:
        key: Item key.
        priority: Item priority (>= 0).
        seq: Insertion sequence number (larger = newer).
    """

    key: int
    priority: float
    seq: int


class Selector(ABC):
    """Chooses one item among those it indexes. Not thread-safe: the owning table holds the lock."""

    #: Name used in configs and GetTableInfo.
    kind: str = ""

    @abstractmethod
    def insert(self, key: int, priority: float, seq: int) -> None:
        """Index a new item (``key`` must not be indexed)."""

    @abstractmethod
    def update(self, key: int, priority: float) -> None:
        """Change an indexed item's priority."""

    @abstractmethod
    def delete(self, key: int) -> None:
        """Stop indexing an item."""

    @abstractmethod
    def select(self, rng: random.Random) -> tuple[int, float]:
        """Choose an item.

        Returns:
            ``(key, probability)``: the chosen key and the probability that it was the one chosen.

        Raises:
            FailedPreconditionError: when the selector is empty.
        """

    @abstractmethod
    def select_among(self, candidates: Sequence[Candidate], rng: random.Random) -> tuple[int, float]:
        """Apply this selector's definition to a non-empty subset of items, in O(len(candidates))."""

    @abstractmethod
    def __len__(self) -> int: ...

    def options(self) -> dict[str, float]:
        """Return the selector's numeric settings (for GetTableInfo)."""
        return {}

    def check_priority(self, priority: float, where: str = "priority") -> None:
        """Refuse a (finite, >= 0) priority this selector cannot index, before the table changes anything; every
        one here (see :class:`PrioritizedSelector`).

        Raises:
            InvalidArgumentError: naming ``where`` and the priority.
        """
        return None

    def importance_weights(self, probabilities: Sequence[float], sizes: Sequence[int]) -> list[float]:
        """Importance weights of a batch: item i was chosen with ``probabilities[i]`` among ``sizes[i]`` items.

        Returns 1.0 for every item here; prioritized selectors override it.
        """
        return [1.0] * len(probabilities)

    def _empty(self) -> FailedPreconditionError:
        return FailedPreconditionError(f"{self.kind} selector has no items to select from")


class UniformSelector(Selector):
    """Uniform selection, P(i) = 1/n, O(1) insert, delete and select."""

    kind = "uniform"

    def __init__(self) -> None:
        self._keys: list[int] = []
        self._index: dict[int, int] = {}

    def insert(self, key: int, priority: float, seq: int) -> None:
        self._index[key] = len(self._keys)
        self._keys.append(key)

    def update(self, key: int, priority: float) -> None:
        return None

    def delete(self, key: int) -> None:
        i = self._index.pop(key)
        last = self._keys.pop()
        if last != key:
            self._keys[i] = last
            self._index[last] = i

    def select(self, rng: random.Random) -> tuple[int, float]:
        if not self._keys:
            raise self._empty()
        return self._keys[rng.randrange(len(self._keys))], 1.0 / len(self._keys)

    def select_among(self, candidates: Sequence[Candidate], rng: random.Random) -> tuple[int, float]:
        return candidates[rng.randrange(len(candidates))].key, 1.0 / len(candidates)

    def __len__(self) -> int:
        return len(self._keys)


class PrioritizedSelector(Selector):
    """Proportional prioritized selection on a sum tree: P(i) = p_i^alpha / sum_j p_j^alpha, O(log n).

    An item's weight p_i^alpha is at most :attr:`MAX_WEIGHT` (:meth:`check_priority`), so the sum over any
    number of items a table can hold (up to 2**63) stays a finite float: an infinite total made :meth:`select`
    draw forever.

    Args:
        priority_exponent: alpha, finite and >= 0 (0 = uniform, 1 = proportional).
        importance_beta: beta in [0, 1] for the importance weights returned with samples.

    Raises:
        InvalidArgumentError: when alpha is negative or not finite, or beta outside [0, 1].
    """

    kind = "prioritized"
    #: Largest weight p^alpha of one item: 2**63 of them still sum to a finite float (< 1.8e308).
    MAX_WEIGHT = 1e280

    def __init__(self, priority_exponent: float = 1.0, importance_beta: float = 1.0) -> None:
        if not 0 <= priority_exponent < math.inf:
            raise InvalidArgumentError(f"priority_exponent must be finite and >= 0, got {priority_exponent}")
        if not 0.0 <= importance_beta <= 1.0:
            raise InvalidArgumentError(f"importance_beta must be in [0, 1], got {importance_beta}")
        self.alpha = float(priority_exponent)
        self.beta = float(importance_beta)
        self._capacity = 16
        self._tree = [0.0] * (2 * self._capacity)
        self._slot: dict[int, int] = {}
        self._key_at: list[int | None] = [None] * self._capacity
        self._free: list[int] = list(range(self._capacity - 1, -1, -1))

    def _weight(self, priority: float) -> float:
        return priority**self.alpha if self.alpha else 1.0

    def check_priority(self, priority: float, where: str = "priority") -> None:
        """Refuse a priority whose weight ``priority ** alpha`` is over :attr:`MAX_WEIGHT` (or overflows).

        Raises:
            InvalidArgumentError: naming ``where``, the priority, alpha and the limit.
        """
        try:
            weight = self._weight(priority)
        except OverflowError:
            weight = math.inf
        if weight > self.MAX_WEIGHT:
            raise InvalidArgumentError(
                f"{where} is {priority!r}; its weight, {priority!r} ** priority_exponent {self.alpha!r}, is over "
                f"{self.MAX_WEIGHT:g}, the largest a prioritized selector takes (the sum of every item's weight "
                "must stay a finite number)"
            )

    def _set(self, slot: int, value: float) -> None:
        i = slot + self._capacity
        tree = self._tree
        tree[i] = value
        i //= 2
        while i >= 1:
            tree[i] = tree[2 * i] + tree[2 * i + 1]
            i //= 2

    def _grow(self) -> None:
        old_cap, old_leaves = self._capacity, self._tree[self._capacity :]
        self._capacity *= 2
        self._tree = [0.0] * (2 * self._capacity)
        self._tree[self._capacity : self._capacity + old_cap] = old_leaves
        for i in range(self._capacity - 1, 0, -1):
            self._tree[i] = self._tree[2 * i] + self._tree[2 * i + 1]
        self._key_at.extend([None] * old_cap)
        self._free.extend(range(self._capacity - 1, old_cap - 1, -1))

    def insert(self, key: int, priority: float, seq: int) -> None:
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self._slot[key] = slot
        self._key_at[slot] = key
        self._set(slot, self._weight(priority))

    def update(self, key: int, priority: float) -> None:
        self._set(self._slot[key], self._weight(priority))

    def delete(self, key: int) -> None:
        slot = self._slot.pop(key)
        self._key_at[slot] = None
        self._set(slot, 0.0)
        self._free.append(slot)

    def select(self, rng: random.Random) -> tuple[int, float]:
        if not self._slot:
            raise self._empty()
        total = self._tree[1]
        if total <= 0.0:  # every priority is 0: fall back to uniform over the items
            keys = list(self._slot)
            return keys[rng.randrange(len(keys))], 1.0 / len(keys)
        tree, cap = self._tree, self._capacity
        while True:
            u = rng.random() * total
            i = 1
            while i < cap:
                left = tree[2 * i]
                if u < left:
                    i = 2 * i
                else:
                    u -= left
                    i = 2 * i + 1
            key = self._key_at[i - cap]
            if key is not None and tree[i] > 0.0:  # rounding can land on an empty leaf: draw again
                return key, tree[i] / total

    def select_among(self, candidates: Sequence[Candidate], rng: random.Random) -> tuple[int, float]:
        weights = [self._weight(c.priority) for c in candidates]
        total = sum(weights)
        if total <= 0.0:
            return candidates[rng.randrange(len(candidates))].key, 1.0 / len(candidates)
        i = rng.choices(range(len(candidates)), weights=weights)[0]
        return candidates[i].key, weights[i] / total

    def __len__(self) -> int:
        return len(self._slot)

    def options(self) -> dict[str, float]:
        return {"priority_exponent": self.alpha, "importance_beta": self.beta}

    def importance_weights(self, probabilities: Sequence[float], sizes: Sequence[int]) -> list[float]:
        """w_i = (n_i * P(i))^(-beta) / max_batch w (Schaul et al. 2016, section 3.4)."""
        raw = [(n * p) ** (-self.beta) if p > 0 else 0.0 for p, n in zip(probabilities, sizes, strict=True)]
        top = max(raw, default=0.0)
        return [w / top if top > 0 else 1.0 for w in raw]


class _OrderSelector(Selector):
    """FIFO or LIFO on an insertion-ordered dict, O(1)."""

    newest_first = False

    def __init__(self) -> None:
        self._order: dict[int, int] = {}

    def insert(self, key: int, priority: float, seq: int) -> None:
        newest = next(reversed(self._order.values()), -1)
        self._order[key] = seq
        if seq < newest:  # an item put back (a released sample) returns to its place: O(n), rare
            self._order = dict(sorted(self._order.items(), key=lambda kv: kv[1]))

    def update(self, key: int, priority: float) -> None:
        return None

    def delete(self, key: int) -> None:
        del self._order[key]

    def select(self, rng: random.Random) -> tuple[int, float]:
        if not self._order:
            raise self._empty()
        it = reversed(self._order) if self.newest_first else iter(self._order)
        return next(it), 1.0

    def select_among(self, candidates: Sequence[Candidate], rng: random.Random) -> tuple[int, float]:
        pick = max if self.newest_first else min
        return pick(candidates, key=lambda c: c.seq).key, 1.0

    def __len__(self) -> int:
        return len(self._order)


class FifoSelector(_OrderSelector):
    """Selects the oldest item."""

    kind = "fifo"


class LifoSelector(_OrderSelector):
    """Selects the newest item."""

    kind = "lifo"
    newest_first = True


class _HeapSelector(Selector):
    """Max- or min-priority selection on a binary heap with lazy deletion, O(log n) amortised."""

    largest_first = False

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int]] = []
        self._live: dict[int, tuple[float, int]] = {}

    def _entry(self, key: int, priority: float, seq: int) -> tuple[float, int, int]:
        return (-priority if self.largest_first else priority, seq, key)

    def insert(self, key: int, priority: float, seq: int) -> None:
        self._live[key] = (priority, seq)
        heapq.heappush(self._heap, self._entry(key, priority, seq))

    def update(self, key: int, priority: float) -> None:
        _, seq = self._live[key]
        self.insert(key, priority, seq)
        if len(self._heap) > 4 * len(self._live) + 64:  # compact stale entries
            self._heap = [self._entry(k, p, s) for k, (p, s) in self._live.items()]
            heapq.heapify(self._heap)

    def delete(self, key: int) -> None:
        del self._live[key]

    def select(self, rng: random.Random) -> tuple[int, float]:
        heap = self._heap
        while heap:
            score, seq, key = heap[0]
            live = self._live.get(key)
            if live is not None and self._entry(key, *live) == (score, seq, key):
                return key, 1.0
            heapq.heappop(heap)
        raise self._empty()

    def select_among(self, candidates: Sequence[Candidate], rng: random.Random) -> tuple[int, float]:
        sign = -1.0 if self.largest_first else 1.0
        return min(candidates, key=lambda c: (sign * c.priority, c.seq)).key, 1.0

    def __len__(self) -> int:
        return len(self._live)


class MaxHeapSelector(_HeapSelector):
    """Selects the item with the largest priority (oldest first among equal priorities)."""

    kind = "max_heap"
    largest_first = True


class MinHeapSelector(_HeapSelector):
    """Selects the item with the smallest priority (oldest first among equal priorities)."""

    kind = "min_heap"


SELECTOR_KINDS = ("uniform", "prioritized", "fifo", "lifo", "max_heap", "min_heap")


def make_selector(kind: str, priority_exponent: float = 1.0, importance_beta: float = 1.0) -> Selector:
    """Build a selector by name.

    Args:
        kind: One of :data:`SELECTOR_KINDS`.
        priority_exponent: alpha, for ``prioritized`` only.
        importance_beta: beta, for ``prioritized`` only.

    Returns:
        A new, empty selector.

    Raises:
        InvalidArgumentError: naming the unknown kind.
    """
    classes: dict[str, type[Selector]] = {
        "uniform": UniformSelector,
        "fifo": FifoSelector,
        "lifo": LifoSelector,
        "max_heap": MaxHeapSelector,
        "min_heap": MinHeapSelector,
    }
    if kind == "prioritized":
        return PrioritizedSelector(priority_exponent, importance_beta)
    if kind not in classes:
        raise InvalidArgumentError(f"unknown selector {kind!r}; expected one of {', '.join(SELECTOR_KINDS)}")
    return classes[kind]()
