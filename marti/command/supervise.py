"""Keep a :class:`~marti.command.stack.LocalStack` running: restart a service that fails (exits, or hangs per
:class:`~marti.command.liveness.HealthProbe`), as docker-compose's ``restart: on-failure`` does for exits, within a bounded
restart policy (``marti up --restart``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from marti.command.liveness import HealthProbe
from marti.command.restart_policy import RestartPolicy, describe_exit, why_not
from marti.command.stack import LocalStack
from marti.command.stop_signals import Interrupted
from marti.errors import MartiError

#: How often the supervisor looks at its services, seconds.
POLL_S = 0.2


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
        probe: Liveness probe: a service it finds hung is killed (SIGTERM, SIGKILL after its
            ``kill_grace_s``) and counts as a failure; ``None`` checks exits only.
        interruptible: Returns the context (:meth:`marti.command.stop_signals.StopSignals.interruptible`) in which a
            stop signal raises :class:`~marti.command.stop_signals.Interrupted`: each restart (its wait for SERVING) runs
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
        f"{probe.timeout_s:g} s timeout; last: {last}); killing it "
        f"(SIGTERM, SIGKILL after {probe.kill_grace_s:g} s)"
    )
    try:
        with interruptible():  # a long --health-kill-grace-s must not hold a stop signal back
            code = stack.kill(name, probe.kill_grace_s)
    except Interrupted:  # the caller stops the stack, this service included (SIGTERM again, then SIGKILL)
        return False
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
            say(f"marti up: error: {what}; {why_not(policy, failed)}; stopping the stack")
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
