"""How a :class:`~.table.Table` hands items out: a sample takes items under the rate limiter and the filter
(whole batches, whole groups, stale items removed), holds them uncommitted in a :class:`~.table_records.Take`,
then commits the take (durable) or releases it (as if it never happened)."""

from __future__ import annotations

import threading
import time

from marti.errors import InvalidArgumentError, MartiError, OutOfRangeError
from marti.types.experience import SampleFilter

from .episodes import grouped
from .selectors import Candidate
from .storage import ItemRecord
from .table_records import SampledItem, Take, snapshot

NO_FILTER = SampleFilter()


class Sampling:
    """The sampling half of :class:`~.table.Table` (a mixin over its lock, index, sampler, rate limiter, episode
    index and storage)."""

    def sample(
        self,
        num_samples: int,
        timeout_s: float,
        filt: SampleFilter = NO_FILTER,
        current_policy_version: int | None = None,
        whole: bool = False,
        groups: bool = False,
    ) -> list[SampledItem]:
        """Sample and commit at once: :meth:`take` then :meth:`commit` (see :meth:`take` for arguments, returns
        and errors; InternalError, UnavailableError when storage could not commit the sample counts)."""
        take = self.take(num_samples, timeout_s, filt, current_policy_version, whole, groups=groups)
        self.commit(take)
        return take.items

    def take(
        self,
        num_samples: int,
        timeout_s: float,
        filt: SampleFilter = NO_FILTER,
        current_policy_version: int | None = None,
        whole: bool = False,
        abandoned: threading.Event | None = None,
        groups: bool = False,
    ) -> Take:
        """Take between 1 and ``num_samples`` items (with replacement, as Reverb) and hold them, uncommitted.

        Waits until at least one sample may proceed (rate limiter and filter), then takes as many more as may
        proceed right away; with ``whole``, takes nothing until all ``num_samples`` may proceed at once. Items
        that reach ``max_times_sampled`` leave the table (other samplers cannot take them) but keep their room;
        nothing is committed until :meth:`commit`, and :meth:`release` puts everything back. Returns only once
        every insert of the taken items is committed.

        With ``current_policy_version`` and the table's ``max_policy_lag`` set, a selected item whose
        ``policy_version`` is below ``current_policy_version - max_policy_lag`` is removed instead of returned
        (``stale=True``, no payload, counted in ``stale_removed``); it takes one of the ``num_samples`` slots
        and one rate-limiter sample, so a FIFO queue is consumed in order whether its items are fresh or stale.
        An item without turns is never stale (no weights generated anything in it).

        With ``groups``, items of a group (a ``group_id`` and ``group_size`` >= 2) are taken together, in
        insertion order, once ``group_size`` of them are in the table (a group missing members is passed over;
        ``probability`` and ``table_size`` are those of the member the sampler selected); a group is the first
        ``group_size`` items of its id, so a later group reusing the id (the next problem of a seed, a client's
        next group) is its own. A group with a stale member is removed whole (its fresh members ``dropped``), and
        so are the members it still lacked when they arrive (only those). A group may carry the take past
        ``num_samples``, so no group is split across two takes.

        Args:
            num_samples: Most items to take (>= 1); with ``whole``, exactly this many.
            timeout_s: Longest wait in seconds for the first item (``whole``: for the whole batch).
            filt: Restriction on the items sampled.
            current_policy_version: The sampler's policy version (>= 0); None = no staleness check.
            whole: All ``num_samples`` or nothing: a wait that runs out leaves the table unchanged.
            abandoned: Set (then :meth:`notify`) when the caller went away: a waiting take gives up at once.
            groups: Take whole groups (see above).

        Returns:
            The open :class:`Take`.

        Raises:
            InvalidArgumentError: when ``num_samples`` < 1 or ``current_policy_version`` < 0.
            OutOfRangeError: ``whole`` with more ``num_samples`` than the table can ever hand out at once
                (:meth:`_check_fillable`), or ``groups`` meeting a group bigger than a blocking table
                (:meth:`_refuse_unfillable`); nothing is taken.
            DeadlineExceededError: when nothing (``whole``: not the whole batch) could be taken in time; the
                table is unchanged.
            UnavailableError: when the store is shutting down or ``abandoned`` was set.
        """
        if num_samples < 1:
            raise InvalidArgumentError(f"num_samples must be >= 1, got {num_samples}")
        if current_policy_version is not None and current_policy_version < 0:
            raise InvalidArgumentError(f"current_policy_version must be >= 0, got {current_policy_version}")
        lag = self.config.max_policy_lag
        oldest = None if lag is None or current_policy_version is None else current_policy_version - lag
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            if whole:
                self._check_fillable(num_samples)
            while True:
                take, picked = self._take(num_samples, filt, oldest, groups)
                if take.unfillable:
                    self._undo(take)
                    self._refuse_unfillable(take.unfillable)
                if picked and (not whole or len(picked) >= num_samples):
                    break
                self._undo(take)
                self._wait(deadline, "sample", abandoned)
            stale = {rec.key for rec, _, _ in picked if _is_stale(rec, oldest)}
            gone = stale | take.dropped
            payloads = self._storage.get_payloads(rec.key for rec, _, _ in picked if rec.key not in gone)
            barrier = self._storage.submit(self.name, counters=self.counters())  # after the items' inserts
        weights = self.sampler.importance_weights([p for _, p, _ in picked], [n for _, _, n in picked])
        take.items = [
            SampledItem(rec, payloads.get(rec.key, b""), p, n, w, rec.key in stale, rec.key in take.dropped)
            for (rec, p, n), w in zip(picked, weights, strict=True)
        ]
        try:
            barrier.wait()
        except MartiError:
            self.release(take)
            raise
        return take

    def _refuse_unfillable(self, unfillable: dict[str, int]) -> None:
        """Raise for groups a whole-groups sample can never take from a table that blocks when full (a queue): it
        holds at most ``max_size`` items, fewer than the group's ``group_size``, so the sampler would wait for
        members that cannot all be in the table while the writer waits for room that only taking the group would
        free. (A table that evicts passes such a group over, as one missing members: its members come and go.)

        Raises:
            OutOfRangeError: naming the table, its ``max_size``, the first such group and its ``group_size``.
        """
        group, size = next(iter(unfillable.items()))
        raise OutOfRangeError(
            f"group {group!r} has group_size {size} but table {self.name!r} holds at most max_size "
            f"{self.config.max_size} items: a whole-groups sample can never take it (it would wait, and a writer "
            f"blocked on a full table with it). Create the table with max_size >= {size}, or sample without "
            "whole_groups"
        )

    def _check_fillable(self, num_samples: int) -> None:
        """Refuses a whole-batch take that no state of the table can fill (caller holds the lock): with
        ``max_times_sampled`` set, a take holds each item at most that many times, and the table at most
        ``max_size`` items (a restart with a smaller one evicts the excess at open: :meth:`fit_to_limits`).

        Raises:
            OutOfRangeError: ``num_samples`` over that bound, naming the SDK's ``batch_size``, the table and
                both settings (it would wait its whole timeout, then time out).
        """
        per_item = self.config.max_times_sampled
        most = max(self.config.max_size, len(self._items)) * per_item
        if per_item and num_samples > most:
            raise OutOfRangeError(
                f"batch_size {num_samples} (num_samples) can never be filled by table {self.name!r}: it holds at "
                f"most max_size {self.config.max_size} items, each taken at most max_times_sampled {per_item} "
                f"times ({most} in all); a whole-batch sample would wait its whole timeout. Ask for at most "
                f"{most}, or pass allow_partial=True"
            )

    def _take(
        self, num_samples: int, filt: SampleFilter, oldest: int | None = None, groups: bool = False
    ) -> tuple[Take, list[tuple[ItemRecord, float, int]]]:
        """Select up to ``num_samples`` items into an open take (caller holds the lock); those with
        ``policy_version < oldest`` are removed (stale); with ``groups``, whole groups (see :meth:`take`).
        Returns the take and the selections."""
        take, picked = Take(), []
        now = time.time()
        passed: set[str] = set()  # groups still missing members, passed over by this take
        while len(picked) < num_samples and self.rate_limiter.can_sample(len(self._items)):
            chosen = self._select(filt, now, passed)
            if chosen is None:
                break
            key, prob, n = chosen
            rec = self._items[key]
            if not (groups and grouped(rec)):
                self._pick(take, picked, key, prob, n, oldest)
                continue
            members = sorted(self.episodes.members(rec.group_id), key=lambda k: self._items[k].seq)
            late = self.episodes.group_dropped(rec.group_id) - take.late[rec.group_id]
            if late > 0:  # the late members of a group dropped before
                members = members[:late]
                take.late[rec.group_id] += len(members)
                drop = True
            else:  # a group is its first group_size members: a later group may reuse the id
                members = members[: rec.group_size]
                drop = any(_is_stale(self._items[k], oldest) for k in members)
                if not drop and len(members) < rec.group_size:
                    passed.add(rec.group_id)
                    if rec.group_size > self.config.max_size and self.config.full_policy == "block":
                        take.unfillable[rec.group_id] = rec.group_size
                    continue
                if drop:
                    take.dropped_groups[rec.group_id] = rec.group_size - len(members)
            for k in members:
                self._pick(take, picked, k, prob, n, oldest, drop)
        self._hold(take, +1)
        return take, picked

    def _select(self, filt: SampleFilter, now: float, passed: set[str]) -> tuple[int, float, int] | None:
        """The sampler's next ``(key, probability, items selected among)`` under the filter, skipping the groups
        in ``passed``; None when no item qualifies (caller holds the lock)."""
        if filt.is_empty() and not passed:
            if not self._items:
                return None
            key, prob = self.sampler.select(self._rng)
            return key, prob, len(self._items)
        cands = [
            Candidate(r.key, r.priority, r.seq)
            for r in self._items.values()
            if filt.matches(r, now) and not (grouped(r) and r.group_id in passed)
        ]
        if not cands:
            return None
        key, prob = self.sampler.select_among(cands, self._rng)
        return key, prob, len(cands)

    def _pick(
        self, take: Take, picked: list, key: int, prob: float, n: int, oldest: int | None, drop: bool = False
    ) -> None:
        """Sample item ``key`` into ``take``: count it, and remove it when stale, ``drop`` (its group is dropped)
        or sampled ``max_times_sampled`` times (caller holds the lock)."""
        rec = self._items[key]
        rec.times_sampled += 1
        take.bumps[key] += 1
        self.rate_limiter.state.samples += 1
        picked.append((snapshot(rec), prob, n))
        if _is_stale(rec, oldest):
            self.stale_removed += 1
            take.stale += 1
            take.removed[key] = self._unindex(key)
        elif drop:
            take.dropped.add(key)
            take.removed[key] = self._unindex(key)
        elif self.config.max_times_sampled and rec.times_sampled >= self.config.max_times_sampled:
            take.removed[key] = self._unindex(key)

    def _hold(self, take: Take, sign: int) -> None:
        """Add (+1) or remove (-1) a take's uncommitted effects from the held counters."""
        held = self._held
        held["samples"] += sign * sum(take.bumps.values())
        held["deletes"] += sign * len(take.removed)
        held["stale"] += sign * take.stale
        held["items"] += sign * len(take.removed)
        held["bytes"] += sign * sum(r.num_bytes for r in take.removed.values())
        if sign > 0:
            self._held_keys.update(take.removed)
        else:
            self._held_keys.difference_update(take.removed)
        self.episodes.hold(take.removed.values(), sign)

    def _undo(self, take: Take) -> None:
        """Put a take's items back (caller holds the lock): removed items return to their place (by insertion
        sequence), sample counts and counters go back."""
        self._hold(take, -1)
        state = self.rate_limiter.state
        for rec in take.removed.values():
            if rec.key in self._withdrawn:  # its insert failed meanwhile (:meth:`_withdraw`): it stays out
                self._withdrawn.discard(rec.key)
                state.inserts -= 1
            else:
                self._index(rec)
        for key, n in take.bumps.items():
            if key in self._items:
                self._items[key].times_sampled -= n
        state.samples -= sum(take.bumps.values())
        state.deletes -= len(take.removed)
        self.stale_removed -= take.stale
        take.open = False

    def commit(self, take: Take) -> None:
        """Make an open take durable: its removals, sample counts and counters, committed before returning.

        Raises:
            InternalError, UnavailableError: when storage could not commit it (the items stay taken in memory;
                storage still holds them, so a restart brings them back).
        """
        with self._cond:
            if not take.open:
                return
            take.open = False
            self._hold(take, -1)
            self._withdrawn.difference_update(take.removed)
            self.episodes.taken(take.removed.values())
            for group_id, count in take.late.items():
                self.episodes.late_dropped(group_id, count)
            for group_id, to_come in take.dropped_groups.items():
                self.episodes.drop_group(group_id, to_come)
            updates = [
                (k, self._items[k].priority, self._items[k].times_sampled)
                for k in take.bumps
                if k in self._items
            ]
            ticket = self._storage.submit(
                self.name, deletes=list(take.removed), updates=updates, counters=self.counters()
            )
            self._cond.notify_all()
        ticket.wait()

    def release(self, take: Take) -> None:
        """Put an open take's items back, as if it never happened (nothing was committed); a no-op for a take
        already committed or released. Wakes waiting callers."""
        with self._cond:
            if take.open:
                self._undo(take)
                self._cond.notify_all()


def _is_stale(rec: ItemRecord, oldest: int | None) -> bool:
    """Whether an item is older than the sampler's bound: it has turns, and its ``policy_version`` (the oldest
    of its turns) is below ``oldest``; None = no bound."""
    return oldest is not None and rec.num_turns > 0 and rec.policy_version < oldest
