"""``marti up``'s restart policy (``--restart``, ``--max-restarts``, ``--restart-window-s``,
``--restart-backoff-s``): whether and when a failed service is started again; used by :mod:`marti.command.supervise`."""

from __future__ import annotations

import signal
from collections import deque
from dataclasses import dataclass, field

from marti.errors import InvalidArgumentError

#: Longest wait before a restart, seconds: the backoff doubles per restart within the window up to this.
MAX_BACKOFF_S = 30.0


@dataclass
class RestartPolicy:
    """When and how often a failed service is started again.

    Args:
        mode: ``on-failure``: restart a service that fails: exits with a non-zero code, is killed by a signal, or
            hangs (one that exits 0 by itself was stopped on purpose and stops the stack); ``no``: any exit or
            hang stops the stack.
        max_restarts: Most restarts of one service within ``window_s``; one more failure stops the stack (>= 0).
        window_s: The window the restarts are counted in, seconds (> 0).
        backoff_s: Wait before the first restart in the window, seconds (>= 0); doubled for each further restart
            of that service within the window, at most :data:`MAX_BACKOFF_S`.

    Raises:
        InvalidArgumentError: a value out of range, naming its ``marti up`` flag and the value.
    """

    mode: str = "on-failure"
    max_restarts: int = 5
    window_s: float = 60.0
    backoff_s: float = 1.0
    _restarts: dict[str, deque[float]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for flag, value, ok in (
            ("--restart", self.mode, self.mode in ("on-failure", "no")),
            ("--max-restarts", self.max_restarts, self.max_restarts >= 0),
            ("--restart-window-s", self.window_s, self.window_s > 0),
            ("--restart-backoff-s", self.backoff_s, 0 <= self.backoff_s <= MAX_BACKOFF_S),
        ):
            if not ok:
                raise InvalidArgumentError(f"{flag} {value!r} is out of range ({_RANGES[flag]})")

    def restarts(self, name: str, now: float) -> int:
        """How many times ``name`` was restarted within the window ending at ``now`` (``time.monotonic()``)."""
        times = self._restarts.setdefault(name, deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return len(times)

    def next_restart(self, name: str, failed: bool, now: float) -> float | None:
        """Decide on a service that ended at ``now`` (``failed``: not by a clean exit 0 of its own) and count the
        restart it gets.

        Returns:
            The wait before restarting it, seconds, or ``None`` when it is not restarted (mode ``no``, a clean
            exit 0, or ``max_restarts`` restarts already within the window).
        """
        if self.mode == "no" or not failed:
            return None
        done = self.restarts(name, now)
        if done >= self.max_restarts:
            return None
        self._restarts[name].append(now)
        return min(self.backoff_s * 2 ** min(done, 1000), MAX_BACKOFF_S)  # 2**1024 overflows a float


_RANGES = {
    "--restart": "on-failure or no",
    "--max-restarts": ">= 0",
    "--restart-window-s": "> 0 seconds",
    "--restart-backoff-s": f"0 to {MAX_BACKOFF_S:g} seconds",
}


def describe_exit(code: int) -> str:
    """``code 1`` or ``code -9 (SIGKILL)``: a child's return code as a person reads it."""
    if code < 0:
        try:
            return f"code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"code {code}"


def why_not(policy: RestartPolicy, failed: bool) -> str:
    """Why a service that ended (``failed``: not by a clean exit 0) is not restarted under ``policy``."""
    if policy.mode == "no":
        return "not restarted (--restart no)"
    if not failed:
        return (
            "a clean exit is a stop from outside, not a failure (--restart on-failure restarts failures only)"
        )
    return (
        f"restarted {policy.max_restarts} times within {policy.window_s:g} s already "
        f"(--max-restarts {policy.max_restarts}, --restart-window-s {policy.window_s:g})"
    )
