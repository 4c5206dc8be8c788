"""What a :class:`~.table.Table` does when the store opens: index the items storage restored, then bring the table
within its limits when it was restarted with smaller ones than its stored items need."""

from __future__ import annotations

from collections.abc import Sequence

from marti.errors import InvalidArgumentError

from .storage import ItemRecord


class Restoring:
    """The restore half of :class:`~.table.Table` (a mixin over its lock, index, remover and storage)."""

    def restore(self, records: Sequence[ItemRecord]) -> None:
        """Index items loaded from storage (in insertion order), without committing anything.

        Raises:
            InvalidArgumentError: an item whose priority this config's sampler or remover cannot weigh (a restart
                with a larger ``priority_exponent``), naming the table, the item and its priority.
        """
        with self._cond:
            for rec in records:
                try:
                    self._check_priority(
                        rec.priority, f"table {self.name!r}: the priority of its item {rec.key}"
                    )
                except InvalidArgumentError as e:
                    raise InvalidArgumentError(
                        f"{e.message}; start the store with the table's old config, then lower that priority or "
                        "delete the item"
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
