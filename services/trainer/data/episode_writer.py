"""The actors' end of the trainable agents' tables: each finished episode goes into its agents' tables.

The episode runner inserts each finished episode's trajectory of every trainable agent (an empty one when the agent
did not act, so each episode adds exactly one item per table) as soon as the episode ends, and the gateway inserts
the episodes external clients report (``rollout.source`` external or mixed). The store owns exactly-once:

- every insert is the store's idempotent insert by ``(table, episode_id)``: an insert interrupted by a store
  outage is retried, and an item whose first answer was lost does not land twice (the scope is the job: the job
  resets its tables when it starts, :func:`services.trainer.data.tables.claim_tables`);
- a rollout replayed after an outage deletes the episodes its failed attempt had inserted from the agents' tables
  (the store's ``Delete``; a late retry of one of their inserts is then a duplicate), so a step trains only on the
  attempt that finished.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from typing import Any

from marti.errors import CancelledError, MartiError, RateLimitedError
from marti.types.trajectory import Trajectory

from .external import ExternalEpisodes
from .tables import Reconnecting

_LOG = logging.getLogger("marti.trainer.episodes")
#: Seconds one insert waits in the store for room in a full table before the writer checks whether to stop.
INSERT_POLL_S = 2.0
#: Seconds between two insert attempts into a full table (the store's own wait comes on top).
FULL_RETRY_PAUSE_S = 0.1
#: Seconds between two looks at the agents' tables while an episode waits for room in all of them.
ROOM_POLL_S = 0.2


class EpisodeWriter:
    """Inserts finished episodes into the trainable agents' tables of one job.

    Args:
        store: An :class:`marti.ExperienceSharingClient` (one channel, reused for every call).
        tables: Per trainable agent, its table (:func:`services.trainer.data.tables.claim_tables`).
        reconnecting: Runs a call again while the store restarts.
        external: The job's external episodes (recorded as they are inserted).
        full_timeout_s: Seconds an insert keeps trying while its table stays full before it gives up with a
            :class:`~marti.errors.RateLimitedError` naming the table (the job passes
            ``services.reconnect_timeout_s``).
        stop: The job's stop event: while it is set, an insert into a full table stops waiting
            (:class:`~marti.errors.CancelledError`) within about :data:`INSERT_POLL_S` seconds.
    """

    def __init__(
        self,
        store: Any,
        tables: dict[str, str],
        reconnecting: Reconnecting,
        external: ExternalEpisodes,
        full_timeout_s: float = 120.0,
        stop: threading.Event | None = None,
    ) -> None:
        self.store = store
        self.tables = tables
        self._reconnecting = reconnecting
        self.external = external
        self.full_timeout_s = full_timeout_s
        self.stop = stop
        self._lock = threading.Lock()
        self._attempt: list[str] = []  # episode ids inserted by the rollout attempt in progress
        self.inserted = 0

    # ------------------------------------------------------------------------------------------ attempts
    def begin_attempt(self) -> None:
        """A rollout attempt starts: the episodes it inserts are recorded (see :meth:`retract_attempt`)."""
        with self._lock:
            self._attempt = []

    def retract_attempt(self) -> None:
        """The rollout attempt failed and will be replayed: the episodes it inserted are deleted from every
        agent's table (the store's ``Delete``, retried while the store restarts)."""
        with self._lock:
            ids, self._attempt = sorted(set(self._attempt)), []
        if ids:
            for table in self.tables.values():
                self._reconnecting(
                    lambda t=table: self.store.delete(t, ids),
                    f"deleting a failed attempt's episodes from {table!r}",
                )

    # ------------------------------------------------------------------------------------------ inserts

    def insert_episode(
        self,
        trajectories: dict[str, Trajectory],
        *,
        external: bool = False,
        stop: threading.Event | None = None,
    ) -> None:
        """Insert one finished episode: one trajectory per trainable agent, into the agent's table.

        The episode goes in whole or not at all, as far as the writer can ensure it (the agents' tables must stay
        aligned, one item per episode each): an external episode of several agents first waits until every
        agent's table has room (looked up with the store's table info every :data:`ROOM_POLL_S` seconds), and
        only that wait and the first item's insert end when ``stop`` or the writer's stop event is set; once an
        item is in, the others are inserted whatever the stop events say (with room they do not wait). A built-in
        episode skips the look (no table-info call): it belongs to the current rollout attempt, and an attempt
        that fails part-way is retracted (:meth:`retract_attempt`), which deletes what did go in. Retried while
        the store restarts (the store's insert is idempotent by episode id: a retried item does not land twice).
        An insert into a
        full table (the learner is behind: normal backpressure with asynchronous rollouts) waits for room in steps
        of :data:`INSERT_POLL_S` seconds, for at most ``full_timeout_s`` seconds in all (the wait for room in every
        table counts too). If an insert still fails after an earlier item went in (a table filled meanwhile, or
        the store went away), the error keeps its type and its message says which tables got the episode and
        which did not.

        Args:
            trajectories: Per trainable agent, its trajectory of the episode (possibly with no turns).
            external: An episode an external client played through the inference gateway: it belongs to no
                rollout attempt, so a built-in rollout replayed meanwhile does not retract it.
            stop: Set while shutting down (the gateway's ``closing`` event): a wait for room ends.

        Raises:
            RateLimitedError: The table stayed full for ``full_timeout_s`` seconds; the message names the table,
                its size and limit, and says the learner is not consuming (metadata as the store's error).
            CancelledError: ``stop`` or the writer's stop event was set while a table was full (nothing inserted).
            UnavailableError: The store stayed unreachable (see :func:`~services.trainer.job.connections.reconnect.call_with_reconnect`).
        """
        if not external:
            with self._lock:  # recorded first: an attempt that fails part-way retracts what it did insert
                self._attempt.extend({t.episode_id for t in trajectories.values()})
        started = time.monotonic()
        if external and len(trajectories) > 1:
            self._wait_for_room([self.tables[a] for a in trajectories], stop, started)
        done: list[str] = []
        for agent, traj in trajectories.items():
            table = self.tables[agent]
            if external:  # recorded before the insert: the learner may take the item as soon as it lands
                self.external.inserting(agent, traj.episode_id)
            try:
                self._insert_one(traj, table, stop, started, interruptible=not done)
            except MartiError as exc:
                self.external.not_inserted(agent, traj.episode_id)
                if not done:
                    raise
                missing = [self.tables[a] for a in trajectories if self.tables[a] not in done]
                raise _partial(exc, traj.episode_id, done, missing) from exc
            done.append(table)
            with self._lock:
                self.inserted += 1

    def _wait_for_room(self, tables: list[str], stop: threading.Event | None, started: float) -> None:
        """Return once every table in ``tables`` holds fewer items than its ``max_size``.

        Raises:
            CancelledError: ``stop`` or the writer's stop event was set while a table was full.
            RateLimitedError: A table stayed full for ``full_timeout_s`` seconds (counted from ``started``).
        """
        logged = False
        while True:
            full = []
            for table in tables:
                info = self._reconnecting(lambda t=table: self.store.info(t), f"reading table {table!r}")
                if info.size >= info.config.max_size:
                    full.append((table, info.size, info.config.max_size))
            if not full:
                return
            table, size, max_size = full[0]
            what = (
                f"inserting an episode into {[t for t, _, _ in full]!r}: table {table!r} is full "
                f"({size}/{max_size} items)"
            )
            if self._stopping(stop):
                raise CancelledError(f"{what}: stopped before any item of the episode was inserted")
            waited = time.monotonic() - started
            if waited >= self.full_timeout_s:
                raise RateLimitedError(
                    f"{what} and stayed full for {waited:.0f}s (limit {self.full_timeout_s:.0f}s, "
                    "services.reconnect_timeout_s): the learner is not consuming its items (it is behind, or no "
                    "longer training); the episode is not inserted. The store is reachable: this is not an outage",
                    table=table,
                    size=size,
                    max_size=max_size,
                )
            if not logged:
                _LOG.info("%s; waiting for the learner to consume", what)
                logged = True
            self._pause(stop, ROOM_POLL_S)

    def _insert_one(
        self,
        traj: Trajectory,
        table: str,
        stop: threading.Event | None,
        started: float | None = None,
        *,
        interruptible: bool = True,
    ) -> None:
        """Insert one trajectory, waiting for room while its table is full (see :meth:`insert_episode`); the
        stop events end the wait only when ``interruptible``."""
        what = f"inserting episode {traj.episode_id} into {table!r}"
        first: float | None = started
        attempts = 0
        while True:
            try:
                self._reconnecting(lambda: self.store.insert(table, [traj], timeout_s=INSERT_POLL_S), what)
                return
            except RateLimitedError as exc:
                attempts += 1
                now = time.monotonic()
                first = now if first is None else first
                full = f"table {table!r} is full ({_size_text(exc)})"
                if interruptible and self._stopping(stop):
                    raise CancelledError(
                        f"{what}: stopped while {full}; the episode is not inserted"
                    ) from exc
                if now - first >= self.full_timeout_s:
                    raise RateLimitedError(
                        f"{what}: {full} and stayed full for {now - first:.0f}s over {attempts} attempts "
                        f"(limit {self.full_timeout_s:.0f}s, services.reconnect_timeout_s): the learner is not "
                        "consuming its items (it is behind, or no longer training); the episode is not inserted. "
                        "The store is reachable: this is not an outage",
                        table=table,
                        size=exc.size,
                        max_size=exc.max_size,
                    ) from exc
                if attempts == 1:
                    _LOG.info("%s: %s; waiting for the learner to consume", what, full)
                if interruptible:
                    self._pause(stop, FULL_RETRY_PAUSE_S)
                else:
                    time.sleep(FULL_RETRY_PAUSE_S)

    def _stopping(self, stop: threading.Event | None) -> bool:
        """Whether ``stop`` or the writer's own stop event is set."""
        return (stop is not None and stop.is_set()) or (self.stop is not None and self.stop.is_set())

    def _pause(self, stop: threading.Event | None, seconds: float) -> None:
        """Sleep ``seconds``, ending early when ``stop`` is set."""
        if stop is not None:
            stop.wait(seconds)
        elif self.stop is not None:
            self.stop.wait(seconds)
        else:
            time.sleep(seconds)


def _partial(exc: MartiError, episode_id: str, done: list[str], missing: list[str]) -> MartiError:
    """``exc`` (same type and metadata) with a message that says which tables got episode ``episode_id``."""
    err = copy.copy(exc)
    err.message = (
        f"episode {episode_id} is only partly inserted: it is in {done!r} but not in {missing!r} (its items in "
        f"the other tables are left there): {exc.message}"
    )
    err.args = (err.message,)
    return err


def _size_text(exc: RateLimitedError) -> str:
    """``"size 4/4 items"`` from a rate-limited insert's metadata (``"size unknown"`` when the store did not
    send it)."""
    if exc.size < 0 or exc.max_size < 0:
        return "size unknown"
    return f"{exc.size}/{exc.max_size} items"
