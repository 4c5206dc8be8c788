"""What a :class:`~.table.Table` does when the store opens: index the items storage restored, then bring the table
within its limits when it was restarted with smaller ones than its stored items need."""

from __future__ import annotations

import math
from collections.abc import Sequence

from marti.errors import InvalidArgumentError

from .selectors import PrioritizedSelector
from .storage import ItemRecord


class Restoring:
    """The restore half of :class:`~.table.Table` (a mixin over its lock, index, remover and storage)."""

    def restore(self, records: Sequence[ItemRecord]) -> None:
        """Index items loaded from storage (in insertion order), without committing anything.

        Raises:
            InvalidArgumentError: an item whose priority this config's sampler or remover cannot weigh (a restart
                with a larger ``priority_exponent``, or an item an older version took under the same config),
                naming the table, the item, its priority and a config that opens the table
                (:func:`_reopen_advice`).
        """
        with self._cond:
            for rec in records:
                try:
                    self._check_priority(
                        rec.priority, f"table {self.name!r}: the priority of its item {rec.key}"
                    )
                except InvalidArgumentError as e:
                    raise InvalidArgumentError(
                        f"{e.message}; {_reopen_advice(self.name, rec.priority)}"
                    ) from None
                self._index(rec)

    def fit_to_limits(self) -> int:
        """Bring a restored table within its ``max_size`` and ``max_bytes`` (a restart with smaller ones than its
        stored items need), so the next insert does not evict the excess all at once.

        A ``full_policy: evict`` table evicts the excess now, in its remover's order, counted as evictions and
        committed before the store serves; a ``block`` table (whose items are never dropped to make room) is
        refused instead.

        Returns:
            How many items were evicted (0 when the table fits).

        Raises:
            InvalidArgumentError: a ``block`` table over a limit, naming the table, what it holds and the limit.
            InternalError, UnavailableError: when storage could not commit the evictions.
        """
        with self._cond:
            if len(self._items) <= self.config.max_size and self._bytes <= self.config.max_bytes:
                return 0
            if self.config.full_policy == "block":
                raise InvalidArgumentError(
                    f"table {self.name!r} holds {len(self._items)} items of {self._bytes} bytes, more than its "
                    f"max_size {self.config.max_size} or max_bytes {self.config.max_bytes}, and its full_policy "
                    f"block never drops items; raise the limit to what it holds, or start with the old config "
                    f"and sample or delete items first"
                )
            evicted = []
            while len(self._items) > self.config.max_size or self._bytes > self.config.max_bytes:
                key, _ = self.remover.select(self._rng)
                self._unindex(key)
                evicted.append(key)
            self.evictions += len(evicted)
            ticket = self._storage.submit(self.name, deletes=evicted, counters=self.counters())
        ticket.wait()
        return len(evicted)


def _reopen_advice(table: str, priority: float) -> str:
    """How to open a table whose stored item of ``priority`` its config cannot weigh: a ``--config`` under which
    the item can be weighed, whether or not the config changed (an older version took such a priority under the
    config the table still has), then lower the priority or delete the item and restart with the wanted config.

    Returns:
        The advice, naming the largest ``priority_exponent`` that weighs ``priority`` (a finite priority over 1;
        one in [0, 1] is weighed under any exponent, so any other is not finite or negative: a damaged database).
    """
    fix = "then lower that priority or delete the item and restart with the config you want"
    # one in [0, 1] is weighed under any exponent, so a priority refused here that is not over 1 and finite is
    # not finite or negative: no config takes it
    if not (math.isfinite(priority) and priority > 1.0):
        return "no config opens it: a priority must be finite and >= 0 under every config (the database is damaged)"
    alpha = math.floor(math.log(PrioritizedSelector.MAX_WEIGHT) / math.log(priority) * 1e4) / 1e4
    return (
        f"start the store with --config giving table {table!r} its old config if it changed, else one whose "
        f"priority_exponent is at most {alpha} or whose sampler and remover are not prioritized; {fix}"
    )
