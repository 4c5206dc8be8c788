"""``marti up``'s liveness probe: a ``grpc.health.v1`` ``Check`` of each running service every interval, and the
services that failed too many in a row (hung: the process is alive but does not answer SERVING), with the knobs
of a Kubernetes ``livenessProbe`` (``periodSeconds``, ``timeoutSeconds``, ``failureThreshold``) and Docker's
``HEALTHCHECK`` (``--interval``, ``--timeout``, ``--retries``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from marti.command.stack import LocalStack
from marti.errors import InvalidArgumentError
from marti.rpc.client.health import HealthCheckCall, start_check


@dataclass
class _Watch:
    """The probe state of one service process."""

    pid: int
    due: float
    call: HealthCheckCall | None = None
    failed: int = 0
    last: str = ""


@dataclass
class HealthProbe:
    """When a running service counts as hung.

    Args:
        interval_s: Seconds from the end of one check of a service to the start of the next (> 0; Docker's
            ``--interval``). The first check of a process comes ``interval_s`` after it was first seen.
        timeout_s: Seconds one check may take, its connection included; no answer by then is a failure (> 0;
            ``--timeout``, ``timeoutSeconds``).
        failures: Checks failed in a row (no answer in time, or an answer other than SERVING) that make a
            service hung (>= 1; ``--retries``, ``failureThreshold``); one SERVING answer resets the count.
        kill_grace_s: Seconds a hung service gets to exit after SIGTERM before it is sent SIGKILL (>= 0; 0: the
            SIGKILL follows at once; Kubernetes' ``terminationGracePeriodSeconds``).
        token: Bearer token sent with the checks (health is exempt from auth; a proxy may want it).

    Raises:
        InvalidArgumentError: a value out of range, naming its ``marti up`` flag and the value.
    """

    interval_s: float = 10.0
    timeout_s: float = 5.0
    failures: int = 3
    kill_grace_s: float = 5.0
    token: str | None = None
    _watches: dict[str, _Watch] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        for flag, value, ok in (
            ("--health-interval-s", self.interval_s, math.isfinite(self.interval_s) and self.interval_s > 0),
            ("--health-timeout-s", self.timeout_s, math.isfinite(self.timeout_s) and self.timeout_s > 0),
            ("--health-failures", self.failures, self.failures >= 1),
            (
                "--health-kill-grace-s",
                self.kill_grace_s,
                math.isfinite(self.kill_grace_s) and self.kill_grace_s >= 0,
            ),
        ):
            if not ok:
                want = {"--health-failures": ">= 1", "--health-kill-grace-s": ">= 0 seconds"}.get(
                    flag, "> 0 seconds"
                )
                raise InvalidArgumentError(f"{flag} {value!r} is out of range ({want})")

    def hung(self, stack: LocalStack, now: float) -> list[tuple[str, int, str]]:
        """Start the checks that are due and read the ones answered, without blocking.

        Args:
            stack: The stack whose running (not exited) services are checked.
            now: ``time.monotonic()``.

        Returns:
            ``(name, failures, last status)`` for each service that has just failed :attr:`failures` checks in a
            row (its count starts again); the status is as :func:`marti.rpc.client.health.check_health` says it
            (``UNREACHABLE: DEADLINE_EXCEEDED`` for a check with no answer within :attr:`timeout_s`).
        """
        found = []
        for name, svc in stack.running.items():
            watch = self._watches.get(name)
            if watch is None or watch.pid != svc.process.pid:  # a new process: its first check after a period
                if watch is not None and watch.call is not None:
                    watch.call.cancel()
                watch = self._watches[name] = _Watch(svc.process.pid, now + self.interval_s)
            if svc.process.poll() is not None:
                continue
            if watch.call is None and now >= watch.due:
                watch.call = start_check(
                    svc.address, timeout_s=self.timeout_s, token=self.token, wait_for_ready=True
                )
            elif watch.call is not None and watch.call.done():
                status, watch.call, watch.due = watch.call.status(), None, now + self.interval_s
                watch.failed, watch.last = (0, "") if status == "SERVING" else (watch.failed + 1, status)
                if watch.failed >= self.failures:
                    found.append((name, watch.failed, watch.last))
                    watch.failed = 0
        return found

    def close(self) -> None:
        """Cancel the checks in flight."""
        for watch in self._watches.values():
            if watch.call is not None:
                watch.call.cancel()
        self._watches.clear()
