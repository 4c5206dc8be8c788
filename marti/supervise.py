"""Keep a :class:`~marti.stack.LocalStack` running: restart a service that fails, as docker-compose's
``restart: on-failure`` does, within a bounded restart policy (``marti up --restart``)."""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from marti.errors import InvalidArgumentError, MartiError
from marti.stack import LocalStack

#: Longest wait before a restart, seconds: the backoff doubles per restart within the window up to this.
MAX_BACKOFF_S = 30.0
#: How often the supervisor looks at its services, seconds.
POLL_S = 0.2


@dataclass
class RestartPolicy:
    """When and how often a failed service is started again.

    Args:
        mode: ``on-failure``: restart a service that exits with a non-zero code or is killed by a signal (one
            that exits 0 by itself was stopped on purpose and stops the stack); ``no``: any exit stops the stack.
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

    def next_restart(self, name: str, code: int, now: float) -> float | None:
        """Decide on a service that exited with ``code`` at ``now`` and count the restart it gets.

        Returns:
            The wait before restarting it, seconds, or ``None`` when it is not restarted (mode ``no``, a clean
            exit 0, or ``max_restarts`` restarts already within the window).
        """
        if self.mode == "no" or code == 0:
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


def supervise(
    stack: LocalStack, policy: RestartPolicy, stopping: Callable[[], bool], say: Callable[[str], None]
) -> int:
    """Watch ``stack``'s services until ``stopping()`` is true, restarting the ones that fail per ``policy``
    (each on the port it had, with the same data dir and log file).

    Args:
        stack: A started stack.
        policy: The restart policy.
        stopping: Returns True once the stack should stop (a signal arrived).
        say: Prints one log line (``marti up: ...``).

    Returns:
        0 when ``stopping()`` became true; 1 when a service exited and was not restarted (the policy's limit, a
        clean exit, or ``--restart no``), after saying which, its exit code and why.
    """
    while not stopping():
        for name, svc in list(stack.running.items()):
            code = svc.process.poll()
            if code is not None and not _bring_back(stack, policy, name, code, stopping, say):
                return 0 if stopping() else 1
        time.sleep(POLL_S)
    return 0


def _bring_back(
    stack: LocalStack,
    policy: RestartPolicy,
    name: str,
    code: int,
    stopping: Callable[[], bool],
    say: Callable[[str], None],
) -> bool:
    """Restart ``name``, which exited with ``code``, until it serves again or the policy says no (said, False)."""
    what = f"{name} exited with {describe_exit(code)}"
    while True:
        delay = policy.next_restart(name, code, time.monotonic())
        if delay is None:
            say(f"marti up: error: {what}; {_why_not(policy, code)}; stopping the stack")
            return False
        count = policy.restarts(name, time.monotonic())
        say(
            f"marti up: {what}; restarting it in {delay:g} s "
            f"(restart {count} of at most {policy.max_restarts} within {policy.window_s:g} s)"
        )
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:
            if stopping():
                return False
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        try:
            address = stack.restart(name)
        except MartiError as exc:  # it failed again before serving: counts as the next failure
            what, code = f"{name} did not come back ({exc})", 1
            continue
        say(f"marti up: {name} SERVING again at {address} (restart {count})")
        return True


def _why_not(policy: RestartPolicy, code: int) -> str:
    """Why a service that exited with ``code`` is not restarted under ``policy``."""
    if policy.mode == "no":
        return "not restarted (--restart no)"
    if code == 0:
        return (
            "a clean exit is a stop from outside, not a failure (--restart on-failure restarts failures only)"
        )
    return (
        f"restarted {policy.max_restarts} times within {policy.window_s:g} s already "
        f"(--max-restarts {policy.max_restarts}, --restart-window-s {policy.window_s:g})"
    )
