"""A table of experience items, composed like Reverb's: sampler, remover, max size, max times sampled, rate
limiter and signature, plus a byte cap and a full policy (evict or block).

Thread-safe: one lock per table; inserts and samples that the rate limiter (or a full table under the block
policy) does not let through wait on a condition variable until their deadline (or until their caller went away,
``abandoned``, or the store closes: they give up at once). Every state change is submitted to
:class:`~.storage.Storage` inside the lock (so storage applies them in the table's order) and the call waits
for the commit after releasing the lock (so concurrent callers' commits can be grouped into one transaction)
before it returns.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

from marti.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    MartiError,
    RateLimitedError,
    ResourceExhaustedError,
    UnavailableError,
)
from marti.types.experience import TableConfig
from marti.types.trajectory import TrajectorySummary

from .episodes import EpisodeIndex
from .rate_limiter import RateLimiter, RateLimiterState
from .selectors import Selector, make_selector
from .storage import CommitTicket, ItemRecord, Storage
from .table_records import Duplicate, NewItem, check_priority, snapshot
from .table_restore import Restoring
from .table_sampling import Sampling
from .table_withdraw import Flushed, Withdrawing

#: Taken episode ids a table remembers for idempotent inserts, by default (the store's ``taken_ids_window``).
TAKEN_IDS_WINDOW = 100_000


class Table(Sampling, Restoring, Withdrawing):
    """One experience table.

    Args:
        config: Validated table config.
        storage: Where items and counters are committed.
        next_key: Shared, thread-safe key allocator (``itertools.count``) so keys are never reused.
        next_seq: Shared insertion-sequence allocator.
        seed: Seed of the sampler's random generator (None = from the OS).
        counters: Persisted counters of a restored table.
        taken_ids_window: Taken ids remembered for idempotent inserts (see :mod:`.episodes`).

    Raises:
        InvalidArgumentError: on bad selector or rate limiter settings.
    """

    def __init__(
        self,
        config: TableConfig,
        storage: Storage,
        next_key: Callable[[], int],
        next_seq: Callable[[], int],
        seed: int | None = None,
        counters: dict[str, int] | None = None,
        taken_ids_window: int = TAKEN_IDS_WINDOW,
    ) -> None:
        self.config = config
        self.episodes = EpisodeIndex(taken_ids_window)
        self.name = config.name
        self._storage = storage
        self._next_key, self._next_seq = next_key, next_seq
        self._rng = random.Random(seed)
        self.sampler: Selector = make_selector(
            config.sampler, config.priority_exponent, config.importance_beta
        )
        self.remover: Selector = make_selector(
            config.remover, config.priority_exponent, config.importance_beta
        )
        c = counters or {}
        self.rate_limiter = RateLimiter(
            config.rate_limiter.build(),
            RateLimiterState(
                c.get("inserts", 0), c.get("samples", 0), c.get("deletes", 0), c.get("withdrawn", 0)
            ),
        )
        self.priority_updates_missing = c.get("priority_updates_missing", 0)
        self.priority_updates = c.get("priority_updates", 0)
        self.evictions = c.get("evictions", 0)
        self.stale_removed = c.get("stale_removed", 0)
        self._items: dict[int, ItemRecord] = {}
        self._bytes = 0
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self.waiting: Counter[str] = Counter()  # callers waiting now, by what they wait to do: insert, sample
        self._held = Counter()  # of open takes: samples, deletes, stale, items, bytes (not yet committed)
        self._held_keys: set[int] = set()  # keys of the items open takes removed
        self._withdrawn: set[int] = set()  # those of failed inserts (:meth:`_withdraw`): a release drops them
        # keys of submitted inserts not settled yet (:meth:`_settle`) -> their ticket
        self._in_flight: dict[int, CommitTicket] = {}
        self._evicted_in_flight: set[int] = set()  # of those, the ones an insert evicted meanwhile
        self._resets = 0  # how many times the table was reset (:meth:`_withdraw` undoes nothing across one)

    def _index(self, rec: ItemRecord) -> None:
        self._items[rec.key] = rec
        self.episodes.add(rec)
        self._bytes += rec.num_bytes
        self.sampler.insert(rec.key, rec.priority, rec.seq)
        self.remover.insert(rec.key, rec.priority, rec.seq)

    def _unindex(self, key: int) -> ItemRecord:
        rec = self._items.pop(key)
        self.episodes.remove(rec)
        self._bytes -= rec.num_bytes
        self.sampler.delete(key)
        self.remover.delete(key)
        self.rate_limiter.state.deletes += 1
        return rec

    def counters(self) -> dict[str, int]:
        """Return the counters that are persisted with the table (open takes not counted: they are committed
        with their take, or undone)."""
        s, held = self.rate_limiter.state, self._held
        return {
            "inserts": s.inserts,
            "samples": s.samples - held["samples"],
            "deletes": s.deletes - held["deletes"],
            "withdrawn": s.withdrawn,
            "priority_updates": self.priority_updates,
            "priority_updates_missing": self.priority_updates_missing,
            "evictions": self.evictions,
            "stale_removed": self.stale_removed - held["stale"],
        }

    # ---- signature --------------------------------------------------------------------------------------

    def check_signature(self, s: TrajectorySummary) -> None:
        """Check a trajectory summary against the table signature.

        Raises:
            InvalidArgumentError: naming the first field that does not match.
        """
        sig, t = self.config.signature, self.name
        if sig.agent_ids and s.agent_id not in sig.agent_ids:
            raise InvalidArgumentError(
                f"trajectory.agent_id {s.agent_id!r} not allowed by table {t!r} signature {list(sig.agent_ids)}"
            )
        if sig.roles and s.role not in sig.roles:
            raise InvalidArgumentError(
                f"trajectory.role {s.role!r} not allowed by table {t!r} signature {list(sig.roles)}"
            )
        if s.policy_version < sig.min_policy_version:
            raise InvalidArgumentError(
                f"trajectory.policy_version {s.policy_version} below table {t!r} min_policy_version {sig.min_policy_version}"
            )
        if sig.max_turns is not None and s.num_turns > sig.max_turns:
            raise InvalidArgumentError(
                f"trajectory.turns has {s.num_turns} turns, table {t!r} max_turns is {sig.max_turns}"
            )
        for i in range(s.num_turns):
            if sig.max_prompt_tokens is not None and s.prompt_lengths[i] > sig.max_prompt_tokens:
                raise InvalidArgumentError(
                    f"trajectory.turns[{i}].prompt_token_ids has {s.prompt_lengths[i]} tokens, "
                    f"table {t!r} max_prompt_tokens is {sig.max_prompt_tokens}"
                )
            if sig.max_response_tokens is not None and s.response_lengths[i] > sig.max_response_tokens:
                raise InvalidArgumentError(
                    f"trajectory.turns[{i}].response_token_ids has {s.response_lengths[i]} tokens, "
                    f"table {t!r} max_response_tokens is {sig.max_response_tokens}"
                )
            if sig.require_logprobs and s.logprob_lengths[i] != s.response_lengths[i]:
                raise InvalidArgumentError(
                    f"trajectory.turns[{i}].response_logprobs has {s.logprob_lengths[i]} values, table {t!r} "
                    f"signature requires one per response token ({s.response_lengths[i]})"
                )
            if sig.require_rewards and not s.rewards_present[i]:
                raise InvalidArgumentError(
                    f"trajectory.turns[{i}].reward is missing, table {t!r} signature requires it"
                )

    # ---- insert -----------------------------------------------------------------------------------------

    def _room_for(self, num_bytes: int) -> bool:
        # Items an open take holds keep their room until the take is committed (they may be put back).
        size, held_bytes = len(self._items) + self._held["items"], self._bytes + self._held["bytes"]
        return size < self.config.max_size and held_bytes + num_bytes <= self.config.max_bytes

    def _wait(self, deadline: float, what: str, abandoned: threading.Event | None) -> None:
        """Wait until another call changes the table (caller holds the lock, and checks its own condition again
        after this returns), counted in :attr:`waiting` under ``what`` (``"insert"`` or ``"sample"``) meanwhile.

        Args:
            deadline: ``time.monotonic()`` at which the caller's wait runs out.
            what: What the caller waits to do, for the count and the error messages.
            abandoned: Set (then :meth:`notify`) when the caller went away; None = never.

        Raises:
            UnavailableError: when the store is shutting down or ``abandoned`` is set, before the wait or once it
                woke up (a caller that went away never proceeds).
            RateLimitedError: (``insert``) when ``deadline`` passed.
            DeadlineExceededError: (``sample``) when ``deadline`` passed.
        """
        self._check_wanted(what, abandoned)
        remaining = deadline - time.monotonic()
        self.waiting[what] += 1
        try:
            woke = remaining > 0 and self._cond.wait(remaining)
        finally:
            self.waiting[what] -= 1
        self._check_wanted(what, abandoned)
        if not woke:
            if time.monotonic() >= deadline:
                text = f"{what} on table {self.name!r} timed out waiting ({self._limiter_text()})"
                if what == "insert":  # the table stayed full or rate-limited: backpressure, not an outage
                    raise RateLimitedError(
                        text + ": the table stayed full or its rate limiter did not admit the item; its "
                        "consumer is not taking items as fast as they are inserted",
                        table=self.name,
                        size=len(self._items),
                        max_size=self.config.max_size,
                    )
                raise DeadlineExceededError(text)

    def _check_wanted(self, what: str, abandoned: threading.Event | None) -> None:
        """Raise UnavailableError when the store is shutting down or the caller went away (``abandoned`` set)."""
        if self._closed:
            raise UnavailableError(f"{what} on table {self.name!r}: the store is shutting down")
        if abandoned is not None and abandoned.is_set():
            raise UnavailableError(f"{what} on table {self.name!r} abandoned: its caller went away")

    def _limiter_text(self) -> str:
        rl = self.rate_limiter
        return (
            f"size={len(self._items)}/{self.config.max_size}, bytes={self._bytes}/{self.config.max_bytes}, "
            f"min_size_to_sample={rl.config.min_size_to_sample}, diff={rl.diff()}, "
            f"min_diff={rl.config.min_diff}, max_diff={rl.config.max_diff}"
        )

    def insert(
        self, items: Sequence[NewItem], timeout_s: float, abandoned: threading.Event | None = None
    ) -> list[int | Duplicate | MartiError]:
        """Insert items in order, waiting (up to ``timeout_s`` in all) where the rate limiter or a full table
        under the block policy says so.

        Items that can proceed are submitted to storage as one operation (and the ones before a wait are
        submitted before it, so samplers can make progress); the call returns once all of them are committed. A
        bad item (priority, signature, size) gets its error in its result slot and does not touch the table. An
        ``idempotent`` item whose ``(episode_id, agent_id)`` the table holds, an open sample holds, or was taken
        from the table within its taken-ids window (see :mod:`.episodes`) is not inserted: its result is a
        :class:`Duplicate` (another agent's trajectory of the same episode goes in).

        Args:
            items: Items to insert.
            timeout_s: Longest total wait in seconds (0 = do not wait).
            abandoned: Set (then :meth:`notify`) when the caller went away: a waiting insert gives up at once and
                neither the waiting item nor any after it is inserted (the ones inserted before it stay).

        Returns:
            One entry per item: its new key, a :class:`Duplicate`, or the :class:`MartiError` that refused it (InvalidArgumentError,
            ResourceExhaustedError when it alone exceeds ``max_bytes``, :class:`~marti.errors.RateLimitedError`
            (a DeadlineExceededError, reason ``RATE_LIMITED``, metadata ``table``, ``size``, ``max_size``) when
            the wait for room or for the rate limiter ran out; items after it get the same error), or
            UnavailableError when the store shut down or ``abandoned`` was set during a wait (items after it get
            the same error). An item whose commit failed gets the commit's error: InternalError,
            ResourceExhaustedError when the disk is full, UnavailableError when storage was closed first; the
            items of the same call committed before (while the call waited for room) keep their keys, so the
            caller knows which landed. The failed items leave the table again (:meth:`_withdraw`), so the same
            items sent again are inserted, not :class:`Duplicate` results of items a restart would lose (one a
            sampler took meanwhile was trained on: sent again, it is a Duplicate; one whose take is released
            instead does not come back), and the items evicted to make room for them come back to the table,
            not counted as evicted (their delete did not reach the database either).
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        results: list[int | Duplicate | MartiError] = []
        pending: list[tuple[ItemRecord, bytes]] = []
        evicted: list[ItemRecord] = []
        tickets: list[Flushed] = []
        with self._cond:
            for n, item in enumerate(items):
                try:
                    results.append(self._insert_one(item, deadline, abandoned, pending, evicted, tickets))
                except (DeadlineExceededError, UnavailableError) as e:
                    # the wait ran out, the store is closing or the caller went away: no item after it goes in
                    results.extend([e] * (len(items) - n))
                    break
                except MartiError as e:
                    results.append(e)
            self._flush(pending, evicted, tickets)
        self._settle(tickets, results)
        return results

    def _insert_one(
        self,
        item: NewItem,
        deadline: float,
        abandoned: threading.Event | None,
        pending: list[tuple[ItemRecord, bytes]],
        evicted: list[ItemRecord],
        tickets: list[Flushed],
    ) -> int | Duplicate:
        priority = self._check_priority(item.priority)
        size = len(item.payload)
        if size > self.config.max_bytes:
            raise ResourceExhaustedError(
                f"item of {size} bytes exceeds table {self.name!r} byte cap max_bytes={self.config.max_bytes}"
            )
        self.check_signature(item.summary)
        while True:
            dup = (
                self.episodes.duplicate(item.summary.episode_id, item.summary.agent_id)
                if item.idempotent
                else None
            )
            if dup is not None:  # checked again after every wait: another insert may have landed meanwhile
                return Duplicate(dup)
            if not self._room_for(size) and self.config.full_policy == "evict":
                while self._items and not self._room_for(size):
                    key, _ = self.remover.select(self._rng)
                    evicted.append(self._unindex(key))
                    self.evictions += 1
                    if key in self._in_flight:
                        self._evicted_in_flight.add(key)
            if self._room_for(size) and self.rate_limiter.can_insert(len(self._items)):
                break
            self._flush(pending, evicted, tickets)
            self._wait(deadline, "insert", abandoned)
        s = item.summary
        rec = ItemRecord(
            key=self._next_key(),
            table=self.name,
            seq=self._next_seq(),
            priority=priority,
            times_sampled=0,
            inserted_at=time.time(),
            episode_id=s.episode_id,
            session=s.session,
            agent_id=s.agent_id,
            role=s.role,
            policy_version=s.policy_version,
            created_at=s.created_at,
            num_turns=s.num_turns,
            num_bytes=size,
            group_id=s.group_id,
            group_size=s.group_size,
        )
        self._index(rec)
        self.rate_limiter.state.inserts += 1
        pending.append((rec, item.payload))
        return rec.key

    def _flush(
        self,
        pending: list[tuple[ItemRecord, bytes]],
        evicted: list[ItemRecord],
        tickets: list[Flushed],
    ) -> None:
        """Submit the pending inserts and evictions (caller holds the lock) and wake waiting callers; ``tickets``
        gets the operation's :class:`Flushed`."""
        if not pending and not evicted:
            return
        # Evicted items that were inserted in this same batch never reach storage.
        keys = [rec.key for rec, _ in pending]
        inserts = [(r, p) for r, p in pending if r.key in self._items]
        fresh = set(keys) - {r.key for r, _ in inserts}
        stored = [r for r in evicted if r.key not in fresh]
        deletes = [r.key for r in stored]
        ticket = self._storage.submit(self.name, inserts=inserts, deletes=deletes, counters=self.counters())
        unsure = {k: self._in_flight[k] for k in deletes if k in self._in_flight}
        tickets.append(Flushed(ticket, keys, fresh, stored, self._resets, unsure))
        self._in_flight.update((r.key, ticket) for r, _ in inserts)
        pending.clear()
        evicted.clear()
        self._cond.notify_all()

    # ---- delete -----------------------------------------------------------------------------------------

    def delete(self, episode_ids: Sequence[str]) -> int:
        """Delete every item of these episodes from the table (as Reverb's table delete) and remember the ids as
        taken, so an idempotent insert of them later (by any agent) is a :class:`Duplicate`. The deleted items' inserts are
        withdrawn from the rate limiter's diff (a queue admits as many inserts as before the deleted ones went in).
        Items an open sample holds are not in the table meanwhile and are not deleted (a release puts them back).

        Args:
            episode_ids: Episode ids; ids with no item are skipped.

        Returns:
            How many items were deleted.

        Raises:
            InternalError, UnavailableError: when storage could not commit the deletion.
        """
        ids = set(episode_ids)
        with self._cond:
            keys = self.episodes.keys(ids)
            for key in keys:
                self._unindex(key)
            self.rate_limiter.state.withdrawn += len(keys)
            self.episodes.deleted(sorted(ids))
            ticket = self._storage.submit(self.name, deletes=keys, counters=self.counters())
            self._cond.notify_all()
        ticket.wait()
        return len(keys)

    def reset(self) -> int:
        """Empty the table and start it over (as Reverb's ``Reset``): delete every item, set the rate limiter's
        and the table's counters back to zero, and forget the taken episode ids and dropped groups, so the
        idempotent insert's scope begins anew (a job claims its tables this way). Items an open sample holds are
        not in the table and are not deleted: they stay counted as inserted and sampled, so a commit or a
        release of their take keeps the rate limiter's ``diff`` true to the table. The config is kept.

        Returns:
            How many items were deleted.

        Raises:
            InternalError, UnavailableError: when storage could not commit the reset.
        """
        with self._cond:
            keys = list(self._items)
            for key in keys:
                self._unindex(key)
            held = self._held
            self.rate_limiter.state = RateLimiterState(held["items"], held["samples"], held["deletes"])
            self.stale_removed = held["stale"]
            self.evictions = self.priority_updates = self.priority_updates_missing = 0
            self.episodes.forget_taken()
            self._resets += 1
            ticket = self._storage.submit(self.name, deletes=keys, counters=self.counters())
            self._cond.notify_all()
        ticket.wait()
        return len(keys)

    # ---- priorities, info, queries ----------------------------------------------------------------------

    def _check_priority(self, priority: float, where: str = "priority") -> float:
        """``priority`` as a float when it is finite, >= 0 and the sampler and remover can weigh it.

        Raises:
            InvalidArgumentError: naming ``where`` and the value (:func:`check_priority`,
                :meth:`Selector.check_priority`).
        """
        p = check_priority(priority, where)
        self.sampler.check_priority(p, where)
        self.remover.check_priority(p, where)
        return p

    def update_priorities(self, updates: dict[int, float]) -> tuple[int, int]:
        """Set new priorities. Keys that are not (or no longer) in the table are skipped and counted.

        Args:
            updates: ``key -> priority``; every priority must be finite and >= 0.

        Returns:
            ``(updated, missing)``: how many keys were updated and how many were not in the table.

        Raises:
            InvalidArgumentError: naming the first bad priority (no update is applied then).
            InternalError, UnavailableError: when storage could not commit the update.
        """
        checked = {k: self._check_priority(p, f"priority of key {k}") for k, p in updates.items()}
        with self._cond:
            rows = []
            for key, p in checked.items():
                rec = self._items.get(key)
                if rec is None:
                    continue
                rec.priority = p
                self.sampler.update(key, p)
                self.remover.update(key, p)
                rows.append((key, p, rec.times_sampled))
            missing = len(checked) - len(rows)
            self.priority_updates += len(rows)
            self.priority_updates_missing += missing
            ticket = self._storage.submit(self.name, updates=rows, counters=self.counters())
            self._cond.notify_all()
        ticket.wait()
        return len(rows), missing

    def records(self, predicate: Callable[[ItemRecord], bool] | None = None) -> list[ItemRecord]:
        """Return copies of the records matching ``predicate`` (all when None), in insertion order."""
        with self._cond:
            recs = [r for r in self._items.values() if predicate is None or predicate(r)]
        return [snapshot(r) for r in sorted(recs, key=lambda r: r.seq)]

    def __len__(self) -> int:
        return len(self._items)

    @property
    def num_bytes(self) -> int:
        """Stored payload bytes of the items in the table."""
        return self._bytes

    def info(self) -> dict:
        """Return size, bytes, counters, rate-limiter state, waiting callers and sampler/remover settings."""
        with self._cond:
            return {
                "name": self.name,
                "size": len(self._items),
                "num_bytes": self._bytes,
                "counters": self.counters(),
                "rate_limiter": self.rate_limiter.info(),
                "waiting_inserts": self.waiting["insert"],
                "waiting_samples": self.waiting["sample"],
                "sampler": {"kind": self.sampler.kind, **self.sampler.options()},
                "remover": {"kind": self.remover.kind, **self.remover.options()},
                "config": self.config.model_dump(mode="json"),
            }

    def notify(self) -> None:
        """Wake every waiting caller (they check their condition again and keep waiting if it still fails)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Shut the table: every caller waiting for room or an item, and every later one that would wait, gets
        :class:`UnavailableError` at once (a store shutting down must not leave threads blocked until their
        deadlines)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
