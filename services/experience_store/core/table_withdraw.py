"""What a :class:`~.table.Table` does when an insert's commit failed (a full disk, a closed storage): the failed
items' result slots get the error (the items committed before, while the call waited for room, keep their keys),
the items leave the table again uncounted, and the items evicted to make room for them come back, uncounted too
(their delete never reached the database either)."""

from __future__ import annotations

from dataclasses import dataclass, field

from marti.errors import MartiError

from .storage import CommitTicket, ItemRecord
from .table_records import Duplicate


@dataclass(slots=True)
class Flushed:
    """One submitted part of an insert call (:meth:`~.table.Table._flush`).

    Attributes:
        ticket: The operation's commit ticket.
        keys: Keys of the items it inserts, the ones evicted again before the submission (``fresh``) included.
        fresh: Keys of items of this part evicted before it was submitted (never sent to storage).
        evicted: Records of the stored items it evicted (its deletes).
        resets: The table's reset count at the submission (a reset since empties the table for good).
        unsure: Keys of ``evicted`` whose own insert was not settled at the submission, with its ticket (done,
            so settled, once this part's is: storage finishes operations in order).
    """

    ticket: CommitTicket
    keys: list[int]
    fresh: set[int] = field(default_factory=set)
    evicted: list[ItemRecord] = field(default_factory=list)
    resets: int = 0
    unsure: dict[int, CommitTicket] = field(default_factory=dict)


class Withdrawing:
    """The failed-commit half of :class:`~.table.Table` (a mixin over its lock, index, counters and storage)."""

    def _settle(self, parts: list[Flushed], results: list[int | Duplicate | MartiError]) -> None:
        """Wait for every part's commit; for a part that failed, put its error in the result slots of its items
        and :meth:`_withdraw` it (the caller does not hold the lock)."""
        slot = {r: i for i, r in enumerate(results) if type(r) is int}
        for part in parts:
            try:
                part.ticket.wait()
            except MartiError as e:
                self._withdraw(part)
                for key in part.keys:
                    results[slot[key]] = e
            else:
                with self._cond:
                    self._settled(part)

    def _settled(self, part: Flushed) -> None:
        """Forget a part's inserts as in flight (caller holds the lock)."""
        for key in part.keys:
            self._in_flight.pop(key, None)
            self._evicted_in_flight.discard(key)

    def _withdraw(self, part: Flushed) -> None:
        """Take back a failed commit: its items still in the table leave it, not counted as inserted or deleted
        (the rate limiter and the idempotent-insert index as if they never came); one an open take holds is
        remembered, so the take's release does not put it back; one evicted again before its submission is
        uncounted as inserted, deleted and evicted, and so is one another insert evicted before this commit failed.
        The stored items it evicted come back to their place (their delete was not committed), uncounted as
        deleted and evicted; after a reset of the table since, or a delete of their episode, they stay out and
        their delete is sent again instead. An item it evicted whose own insert failed too does not come back
        (that insert's withdrawal uncounts it)."""
        with self._cond:
            state, same = self.rate_limiter.state, part.resets == self._resets
            for key in part.keys:
                if key in self._held_keys:  # an open take holds it: its release must not put it back
                    self._withdrawn.add(key)
                elif not same:  # a reset deleted it and zeroed the counters
                    continue
                elif key in self._items:
                    self._unindex(key)
                    state.deletes -= 1  # _unindex counted a delete
                    state.inserts -= 1
                elif key in part.fresh or key in self._evicted_in_flight:
                    state.inserts -= 1
                    state.deletes -= 1
                    self.evictions -= 1
            self._settled(part)
            lost = {k for k, t in part.unsure.items() if t.failed}  # never stored
            gone = [
                r
                for r in part.evicted
                if r.key not in lost and (not same or self.episodes.was_deleted(r.episode_id))
            ]
            for rec in part.evicted:
                if rec.key not in lost and rec.key not in {r.key for r in gone}:
                    self._index(rec)
                    state.deletes -= 1
                    self.evictions -= 1
            if gone:
                self._storage.submit(self.name, deletes=[r.key for r in gone])
            self._cond.notify_all()
