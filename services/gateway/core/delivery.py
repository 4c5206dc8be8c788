"""Released external episodes on their way to the training sink: the backlog, its limit, and what is lost at close.

:class:`EpisodeDelivery` is the delivery half of :class:`~services.gateway.core.gateway.Gateway`: a report hands it
the episodes the tracker released; it inserts them in report order (one episode's items stay adjacent in every
table), answers within ``gateway.report_wait_s`` while the rest stays in the backlog, and at close counts and logs
every episode that never went in. Every outcome is counted (``released``, ``sink_errors``,
``backlog_lost_at_close``): nothing is dropped without a counter and a log line.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from marti.errors import AbortedError, MartiError, ResourceExhaustedError, UnavailableError
from marti.types.trajectory import Trajectory
from services.gateway.core.calls import DeliveryBatch

_LOG = logging.getLogger("marti.gateway")

#: Receives each released episode (agent -> trajectory); blocking, called from a worker thread. A sink that may
#: wait long (an insert into a full table) should stop waiting once :attr:`EpisodeDelivery.closing` is set.
EpisodeSink = Callable[[dict[str, Trajectory]], None]
#: Most seconds :meth:`EpisodeDelivery.close` waits for the insert in flight before counting the backlog as lost.
CLOSE_DELIVERY_WAIT_S = 10.0


class EpisodeDelivery:
    """Inserts released episodes into ``sink`` in report order, with a bounded backlog.

    Args:
        sink: Where released episodes go (the job's store tables); None = nowhere (each released episode is only
            counted in ``released``).
        max_backlog_episodes: Most released episodes waiting to be inserted (``gateway.max_backlog_episodes``).
        report_wait_s: Most seconds a report waits for its inserts (``gateway.report_wait_s``).
    """

    def __init__(self, sink: EpisodeSink | None, max_backlog_episodes: int, report_wait_s: float) -> None:
        self.sink = sink
        self.max_backlog_episodes = max_backlog_episodes
        self.report_wait_s = report_wait_s
        #: Set when the gateway begins to close: queued episodes are no longer handed to the sink, and a sink
        #: waiting for room should give up (the trainer's sink passes it to ``EpisodeWriter.insert_episode``).
        self.closing = threading.Event()
        self.tasks: set[asyncio.Task[Exception | None]] = set()  # kept: the loop holds tasks weakly
        self._lock = asyncio.Lock()
        self.backlog = 0  # released episodes not yet inserted (or failed)
        self._abandoned = False  # close gave up waiting: later outcomes are no longer counted
        self.released = 0
        self.sink_errors = 0
        self.queued_reports = 0
        self.backlog_refused = 0
        self.backlog_lost_at_close = 0

    def admit(self, episode_id: str, coming: int) -> None:
        """Refuse a valid report whose ``coming`` released episodes do not fit in the backlog.

        A group larger than the limit is taken only while the backlog is empty.

        Raises:
            ResourceExhaustedError: They do not fit (counted in ``backlog_refused``); the message names the
                backlog, the limit and ``episode_id``.
        """
        limit = self.max_backlog_episodes
        if coming and self.backlog and self.backlog + coming > limit:
            self.backlog_refused += 1
            raise ResourceExhaustedError(
                f"{self.backlog} released episodes are waiting to be inserted into training and this report "
                f"would release {coming} more; the limit (gateway.max_backlog_episodes) is {limit}: the "
                f"trainer is not consuming them as fast as they are reported; episode {episode_id!r} was not "
                "changed, report it again later"
            )

    async def deliver(self, episode_id: str, episodes: list[dict[str, Trajectory]]) -> int:
        """Insert the ``episodes`` a report of ``episode_id`` released; returns how many are still queued when
        the report answers (0 when all were inserted within ``report_wait_s``).

        The inserts run in a task the delivery keeps, so neither a caller that goes away nor an answer given
        before they end may lose them; errors of inserts that end after the answer are counted and logged.

        Raises:
            UnavailableError / AbortedError / the sink's own error: as :meth:`batch_error`, when every insert
                ended within ``report_wait_s``.
        """
        if self.sink is None:
            self.released += len(episodes)
            return 0
        batch = DeliveryBatch(episodes, len(episodes))
        self.backlog += batch.left
        task = asyncio.ensure_future(self._deliver(batch))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        done, _ = await asyncio.wait({task}, timeout=self.report_wait_s)
        if task in done:
            task.result()
            error = self.batch_error(batch)
            if error is not None:
                raise error
            return 0
        self.queued_reports += 1
        _LOG.info(
            "report of episode %r answered with %d episodes still queued for training (%d in the backlog)",
            episode_id,
            batch.left,
            self.backlog,
        )
        return batch.left

    async def close(self) -> None:
        """Wait up to :data:`CLOSE_DELIVERY_WAIT_S` for the inserts in flight (call after setting
        :attr:`closing`); count a backlog still waiting then in ``backlog_lost_at_close`` and log every loss."""
        if self.tasks:
            _, pending = await asyncio.wait(set(self.tasks), timeout=CLOSE_DELIVERY_WAIT_S)
            if pending:  # the sink did not return: its thread ends on its own, its outcome no longer counts
                self._abandoned = True
                self.backlog_lost_at_close += self.backlog
                self.backlog = 0
                _LOG.error(
                    "the episode sink did not return within %.0fs of the gateway closing",
                    CLOSE_DELIVERY_WAIT_S,
                )
        if self.backlog_lost_at_close:
            _LOG.error(
                "%d released episodes were still waiting to be inserted when the gateway closed: they are lost to "
                "training (gateway/backlog_lost_at_close)",
                self.backlog_lost_at_close,
            )

    @staticmethod
    def batch_error(batch: DeliveryBatch) -> Exception | None:
        """What a report whose inserts all ended must raise: None when each of its episodes was inserted;
        :class:`UnavailableError` when the gateway closed before some went in; :class:`AbortedError` naming a
        sink's marti error; a sink's other exception as it is (a bug: an HTTP 500 that hides its text)."""
        if not batch.lost and not batch.failed:
            return None
        total = len(batch.episodes)
        inserted = (
            f"; {len(batch.inserted)} of the {total} episodes it released were inserted: {batch.inserted}"
            if batch.inserted
            else ""
        )
        failed = [eid for eid, _ in batch.failed]
        if batch.lost:
            also = (
                f"; episodes {failed} were not inserted either (the sink failed; gateway/sink_errors)"
                if failed
                else ""
            )
            return UnavailableError(
                f"the gateway is shutting down: episodes {batch.lost} this report released were not inserted "
                f"into training and are lost to it (gateway/backlog_lost_at_close){also}{inserted}; do not "
                "report them again"
            )
        cause = batch.failed[0][1]
        if not isinstance(cause, MartiError):
            return cause
        return AbortedError(
            f"the report was taken but episodes {failed} it released were not inserted into training: the sink "
            f"failed ({type(cause).__name__}: {cause}); they are lost to training (gateway/sink_errors), so do "
            f"not report them again (a retry is refused as already reported){inserted}"
        )

    async def _deliver(self, batch: DeliveryBatch) -> Exception | None:
        """Insert each episode of ``batch`` into the sink, unless the gateway is closing (then it is counted in
        ``backlog_lost_at_close``); counts ``released`` / ``sink_errors`` and records each episode's outcome in
        ``batch``; returns the first sink error."""
        first: Exception | None = None
        async with self._lock:  # one episode's items stay adjacent in every table; reports keep their order
            for ep in batch.episodes:
                eid = next(iter(ep.values())).episode_id if ep else "?"
                try:
                    if self.closing.is_set():
                        self._count_lost(eid)
                        batch.lost.append(eid)
                        continue
                    await asyncio.to_thread(self.sink, ep)  # type: ignore[arg-type]
                except Exception as exc:  # noqa: BLE001 - counted, logged, and reported by the report
                    if self.closing.is_set():  # the sink gave up because the gateway is closing
                        self._count_lost(eid, exc)
                        batch.lost.append(eid)
                        continue
                    if not self._abandoned:
                        self.sink_errors += 1
                    _LOG.error("episode %r is lost to training: the sink failed: %s", eid, exc)
                    batch.failed.append((eid, exc))
                    first = first or exc
                else:
                    batch.inserted.append(eid)
                    if not self._abandoned:
                        self.released += 1
                finally:
                    batch.left -= 1
                    if not self._abandoned:
                        self.backlog -= 1
        return first

    def _count_lost(self, episode_id: str, error: Exception | None = None) -> None:
        """Count one backlog episode that the closing gateway did not insert (unless close already counted it);
        ``error`` is what the sink raised when it gave up (logged: it says whether part of the episode went in)."""
        if not self._abandoned:
            self.backlog_lost_at_close += 1
        if error is None:
            _LOG.warning(
                "episode %r is lost to training: the gateway closed before it was inserted", episode_id
            )
        else:
            _LOG.warning(
                "episode %r is lost to training: the sink gave up as the gateway closed: %s",
                episode_id,
                error,
            )

    def stats(self) -> dict[str, float]:
        """``released``, ``sink_errors``, ``backlog``, ``queued_reports``, ``backlog_refused``,
        ``backlog_lost_at_close`` (see :meth:`~services.gateway.core.gateway.Gateway.stats`)."""
        return {
            "released": float(self.released),
            "sink_errors": float(self.sink_errors),
            "backlog": float(self.backlog),
            "queued_reports": float(self.queued_reports),
            "backlog_refused": float(self.backlog_refused),
            "backlog_lost_at_close": float(self.backlog_lost_at_close),
        }
