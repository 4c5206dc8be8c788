"""Keep a :class:`~marti.stack.LocalStack` running: restart a service that fails (exits, or hangs per
:class:`~marti.liveness.HealthProbe`), as docker-compose's ``restart: on-failure`` does for exits, within a bounded
restart policy (``marti up --restart``)."""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

from marti.errors import InvalidArgumentError, MartiError
from marti.liveness import KILL_GRACE_S, HealthProbe
from marti.stack import LocalStack
from marti.stop_signals import Interrupted

#: Longest wait before a restart, seconds: the backoff doubles per restart within the window up to this.
MAX_BACKOFF_S = 30.0
#: How often the supervisor looks at its services, seconds.
POLL_S = 0.2


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


def supervise(
    stack: LocalStack,
    policy: RestartPolicy,
    stopping: Callable[[], bool],
    say: Callable[[str], None],
    *,
    probe: HealthProbe | None = None,
    interruptible: Callable[[], AbstractContextManager] = nullcontext,
) -> int:
    """Watch ``stack``'s services until ``stopping()`` is true, restarting the ones that fail per ``policy``
    (each on the port it had, with the same data dir and log file).

    Args:
        stack: A started stack.
        policy: The restart policy.
        stopping: Returns True once the stack should stop (a signal arrived).
        say: Prints one log line (``marti up: ...``).
        probe: Liveness probe: a service it finds hung is killed (SIGTERM, SIGKILL after
            :data:`~marti.liveness.KILL_GRACE_S`) and counts as a failure; ``None`` checks exits only.
        interruptible: Returns the context (:meth:`marti.stop_signals.StopSignals.interruptible`) in which a
            stop signal raises :class:`~marti.stop_signals.Interrupted`: each restart (its wait for SERVING) runs
            in it, so a signal ends that wait at once.

    Returns:
        0 when ``stopping()`` became true; 1 when a service exited or hung and was not restarted (the policy's
        limit, a clean exit, or ``--restart no``), after saying which, its exit code and why.
    """
    try:
        while not stopping():
            for name, svc in list(stack.running.items()):
                code = svc.process.poll()
                if code is None:
                    continue
                what = f"{name} exited with {describe_exit(code)}"
                if not _bring_back(stack, policy, name, what, code != 0, stopping, say, interruptible):
                    return 0 if stopping() else 1
            for name, failures, last in probe.hung(stack, time.monotonic()) if probe else ():
                if not _restart_hung(
                    stack, policy, probe, (name, failures, last), stopping, say, interruptible
                ):
                    return 0 if stopping() else 1
            time.sleep(POLL_S)
        return 0
    finally:
        if probe is not None:
            probe.close()


def _restart_hung(
    stack: LocalStack,
    policy: RestartPolicy,
    probe: HealthProbe,
    found: tuple[str, int, str],
    stopping: Callable[[], bool],
    say: Callable[[str], None],
    interruptible: Callable[[], AbstractContextManager],
) -> bool:
    """Kill the hung service of ``found`` (name, failures, last status) and restart it as a failure."""
    name, failures, last = found
    pid = stack.running[name].process.pid
    say(
        f"marti up: {name} (pid {pid}) failed {failures} health checks in a row (every {probe.interval_s:g} s, "
        f"{probe.timeout_s:g} s timeout; last: {last}); killing it (SIGTERM, SIGKILL after {KILL_GRACE_S:g} s)"
    )
    code = stack.kill(name, KILL_GRACE_S)  # a signal meanwhile is seen by _bring_back, before any restart
    what = f"{name} hung and was killed ({describe_exit(code)})"
    return _bring_back(stack, policy, name, what, True, stopping, say, interruptible)


def _bring_back(
    stack: LocalStack,
    policy: RestartPolicy,
    name: str,
    what: str,
    failed: bool,
    stopping: Callable[[], bool],
    say: Callable[[str], None],
    interruptible: Callable[[], AbstractContextManager],
) -> bool:
    """Restart ``name``, which ended as ``what`` says, until it serves again or the policy says no (said, False)
    or a stop signal arrives (False)."""
    while True:
        delay = policy.next_restart(name, failed, time.monotonic())
        if delay is None:
            say(f"marti up: error: {what}; {_why_not(policy, failed)}; stopping the stack")
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
            with interruptible():  # the wait for SERVING takes up to a minute: a signal ends it at once
                address = stack.restart(name)
        except Interrupted:
            return False
        except MartiError as exc:  # it failed again before serving: counts as the next failure
            what, failed = f"{name} did not come back ({exc})", True
            continue
        say(f"marti up: {name} SERVING again at {address} (restart {count})")
        return True


def _why_not(policy: RestartPolicy, failed: bool) -> str:
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
