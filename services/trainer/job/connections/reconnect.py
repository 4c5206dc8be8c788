"""Riding out service restarts: retry one phase of the training loop with exponential backoff.

The SDK clients retry idempotent unary calls for a few seconds on their own; a service restart
(``kill -9`` then a supervisor start, 2 to 10 s) outlasts that, and streams (the env session stream, the
store's Insert and Sample streams) are never retried by the SDK. The training loop therefore wraps each phase
that talks to a service (playing a batch of episodes, exchanging trajectories with the store) in
:func:`call_with_reconnect`, which re-runs the whole phase until it succeeds or ``timeout_s`` passes. Each
phase is written so that re-running it is safe:

* episodes are replayed from their seeds in new env sessions and new broker sessions (new episode ids), so
  nothing of a half-played batch is reused;
* the store exchange re-inserts only the trajectories it has not sampled back yet and drops duplicates
  on read (at-least-once insert, exactly-once use; see ``TrainingLoop._exchange``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from marti.errors import (
    AbortedError,
    CancelledError,
    DeadlineExceededError,
    MartiError,
    RateLimitedError,
    SessionLostError,
    UnavailableError,
)

_LOG = logging.getLogger(__name__)
T = TypeVar("T")

OUTAGE_ERRORS: tuple[type[MartiError], ...] = (
    UnavailableError,
    DeadlineExceededError,
    AbortedError,
    CancelledError,
    SessionLostError,
)
"""Errors a service restart produces: the connection is gone, a call timed out, a stream was torn down, or
the server no longer knows a session it handed out (its state was in memory; the phase recreates it)."""


def is_outage(exc: BaseException) -> bool:
    """True for errors that a restarted service explains, and that re-running the phase can fix.

    Decided by type alone (:data:`OUTAGE_ERRORS`), never by message text: a lost session is a
    :class:`~marti.errors.SessionLostError`, which servers send as NOT_FOUND with a ``google.rpc.ErrorInfo``
    detail (reason ``SESSION_LOST``) and clients rebuild from that detail. Any other ``NotFoundError`` (an
    unknown env id, table or agent) is a configuration error and is not retried. A
    :class:`~marti.errors.RateLimitedError` (an insert into a full table: the store answered, its consumer is
    behind) is backpressure, not an outage, although it is a ``DeadlineExceededError``: the caller that
    inserts decides how long to keep trying (``EpisodeWriter.insert_episode``).
    """
    return isinstance(exc, OUTAGE_ERRORS) and not isinstance(exc, RateLimitedError)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff between attempts.

    Args:
        initial_s: First wait, seconds.
        max_s: Longest single wait, seconds.
        timeout_s: Give up once this long has passed since the first failure, seconds (0 = never retry).
    """

    initial_s: float = 0.5
    max_s: float = 10.0
    timeout_s: float = 120.0


def call_with_reconnect(
    fn: Callable[[], T],
    what: str,
    backoff: Backoff,
    on_retry: Callable[[int, BaseException], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    stop: threading.Event | None = None,
) -> T:
    """Call ``fn()`` until it returns, re-calling it after outages with exponential backoff.

    Args:
        fn: The phase; it must be safe to run again after it failed part-way.
        what: Name of the phase for logs and the final error (e.g. ``"rollout of step 3"``).
        backoff: Waits and the overall limit.
        on_retry: Called with ``(attempt, error)`` before each wait (attempt counts from 1).
        sleep: Sleep function (tests pass a fake).
        clock: Monotonic clock in seconds (tests pass a fake).
        stop: The job's stop event: a :class:`~marti.errors.CancelledError` raised while it is set (a wait the
            phase gave up because the job is stopping) is raised at once, not retried.

    Returns:
        What ``fn`` returned.

    Raises:
        UnavailableError: outages went on for longer than ``backoff.timeout_s``; the message names the phase,
            the number of attempts and the last error (chained as ``__cause__``).
        Exception: any error that is not an outage (see :func:`is_outage`; a ``RateLimitedError`` among them)
            is raised at once, unchanged.
    """
    delay = backoff.initial_s
    deadline: float | None = None
    attempt = 0
    while True:
        try:
            return fn()
        except MartiError as exc:
            if not is_outage(exc) or (isinstance(exc, CancelledError) and stop is not None and stop.is_set()):
                raise
            attempt += 1
            now = clock()
            deadline = now + backoff.timeout_s if deadline is None else deadline
            left = deadline - now
            if left <= 0:
                raise UnavailableError(
                    f"{what}: services still unreachable after {attempt} attempts over "
                    f"{backoff.timeout_s:.0f}s (services.reconnect_timeout_s); last error: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            wait = min(delay, left)
            _LOG.warning(
                "%s failed (%s: %s); retrying in %.1fs (attempt %d)",
                what,
                type(exc).__name__,
                exc,
                wait,
                attempt,
            )
            if on_retry is not None:
                on_retry(attempt, exc)
            sleep(wait)
            delay = min(delay * 2, backoff.max_s)
