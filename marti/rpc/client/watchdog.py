"""One daemon thread that runs a callback when a deadline passes, for waits that have no timeout of their own
(the next response of a gRPC bidi stream).

Each owner (a stream) has at most one armed deadline at a time; arming and disarming are O(1) under one lock.
The thread wakes at the earliest armed deadline, every :data:`IDLE_TICK_S` for a while when nothing is armed, and
when an arm sets a deadline earlier than its next wake-up: so a stream making many short calls with the same
timeout costs two lock round trips per call, and neither a thread start nor a thread wake-up.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

#: While nothing is armed, the thread looks again every ``IDLE_TICK_S`` seconds, ``IDLE_TICKS`` times, then
#: sleeps until an arm wakes it.
IDLE_TICK_S = 0.05
IDLE_TICKS = 20


class Watchdog:
    """Runs ``callback()`` on its thread when an owner's armed deadline passes before :meth:`disarm`.

    The callback runs outside the watchdog's lock and must be quick; whatever it raises is swallowed (the
    watchdog must outlive it). A caller whose :meth:`disarm` returns False must assume the callback ran, or
    is about to run.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, Callable[[], Any]]] = {}
        self._wake_at = float("inf")
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def arm(self, owner: object, timeout_s: float, callback: Callable[[], Any]) -> None:
        """Arm ``owner``'s deadline ``timeout_s`` seconds from now (replacing one it had)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            if self._pid != os.getpid():  # a forked child: the parent's thread is not here
                self._armed.clear()
                self._thread, self._wake_at, self._pid = None, float("inf"), os.getpid()
            self._armed[id(owner)] = (deadline, callback)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="marti-watchdog", daemon=True)
                self._thread.start()
            if deadline < self._wake_at:
                self._wake_at = deadline
                self._cond.notify()

    def disarm(self, owner: object) -> bool:
        """Disarm ``owner``'s deadline; True when it was still armed (False: it fired, or none was armed)."""
        with self._cond:
            return self._armed.pop(id(owner), None) is not None

    def _run(self) -> None:
        idle = 0  # wake-ups in a row that found nothing armed
        with self._cond:
            while True:
                now = time.monotonic()
                due = [k for k, (deadline, _) in self._armed.items() if deadline <= now]
                callbacks = [self._armed.pop(k)[1] for k in due]
                if callbacks:
                    self._cond.release()
                    try:
                        for cb in callbacks:
                            try:
                                cb()
                            except BaseException:  # noqa: BLE001 - the watchdog serves every other owner too
                                pass
                    finally:
                        self._cond.acquire()
                    continue
                if self._armed:
                    idle = 0
                    self._wake_at = min(d for d, _ in self._armed.values())
                else:
                    # Nothing armed (between two calls, usually): look again shortly for a while before
                    # sleeping until the next arm, so that a call arming a later deadline (the usual case)
                    # never has to wake this thread.
                    idle += 1
                    self._wake_at = now + IDLE_TICK_S if idle <= IDLE_TICKS else float("inf")
                self._cond.wait(None if self._wake_at == float("inf") else self._wake_at - now)


#: The process's watchdog (its thread starts at the first :meth:`Watchdog.arm`).
WATCHDOG = Watchdog()
