"""``marti up``'s liveness probe (:class:`marti.command.liveness.HealthProbe`) against a real broker process: a stopped
(SIGSTOP) service is found hung after ``failures`` checks in a row, no sooner than ``interval_s`` and
``timeout_s`` allow; an answer within the timeout, or one SERVING answer between failures, is not a hang; a
NOT_SERVING answer is a failure; each flag's range. The kill and restart through ``marti up``:
``tests/integration/test_cli_hung.py``."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from marti.command.liveness import HealthProbe
from marti.command.main import main
from marti.command.restart_policy import RestartPolicy
from marti.command.stack import LocalStack, ServiceProcess
from marti.command.stop_signals import StopSignals
from marti.command.supervise import supervise
from marti.errors import InvalidArgumentError
from marti.rpc.client.health import wait_until_serving
from marti.rpc.testing import ServerThread


@pytest.fixture(scope="module")
def broker():
    """A real broker process (``marti broker --port 0``) in a stack."""
    stack = LocalStack(services=("broker",))
    stack.start()
    yield stack
    pid = stack.running["broker"].process.pid
    os.kill(pid, signal.SIGCONT)
    stack.stop()


def _watch(probe: HealthProbe, stack: LocalStack, seconds: float) -> list[tuple[float, tuple[str, int, str]]]:
    """Call ``probe.hung`` every 20 ms for ``seconds``: (seconds since the start, what it found) per finding."""
    start, found = time.monotonic(), []
    while time.monotonic() - start < seconds:
        now = time.monotonic()  # the probe's clock: its next check is due interval_s after this
        found += [(now - start, hung) for hung in probe.hung(stack, now)]
        time.sleep(0.02)
    probe.close()
    return found


class _Stopped:
    """SIGSTOP the broker for the ``with`` block (SIGCONT after)."""

    def __init__(self, stack: LocalStack) -> None:
        self.pid = stack.running["broker"].process.pid

    def __enter__(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def __exit__(self, *exc: object) -> None:
        os.kill(self.pid, signal.SIGCONT)


def test_a_serving_service_is_never_hung(broker):
    assert _watch(HealthProbe(interval_s=0.1, timeout_s=1.0, failures=1), broker, 1.5) == []


def test_a_stopped_service_is_hung_after_failures_checks_each_timing_out(broker):
    """interval 0.3 s, timeout 0.2 s, 3 failures: the first check starts at 0.3 s and fails at 0.5 s, the third
    fails at about 3 x 0.5 = 1.5 s (no sooner; a finding names its count, 3), and the count starts again after a
    finding. Times are the probe's own ``now`` (the time after its call also counts the call itself, which a
    loaded machine stretches)."""
    probe = HealthProbe(interval_s=0.3, timeout_s=0.2, failures=3)
    with _Stopped(broker):
        found = _watch(probe, broker, 4.5)
    assert [hung for _, hung in found][:2] == [("broker", 3, "UNREACHABLE: DEADLINE_EXCEEDED")] * 2, found
    assert 1.5 <= found[0][0] < 3.0, found
    assert found[1][0] - found[0][0] >= 1.5, found


def test_one_failure_is_enough_with_failures_1(broker):
    probe = HealthProbe(interval_s=0.2, timeout_s=0.2, failures=1)
    with _Stopped(broker):
        found = _watch(probe, broker, 0.7)
    assert [hung for _, hung in found] == [("broker", 1, "UNREACHABLE: DEADLINE_EXCEEDED")], found
    assert found[0][0] >= 0.4, found  # interval 0.2 s, then the 0.2 s timeout


@pytest.mark.parametrize(("timeout_s", "hung"), [(3.0, False), (0.3, True)])
def test_an_answer_within_the_timeout_is_not_a_failure(broker, timeout_s, hung):
    """The broker stopped for 0.7 s answers the check in flight late: within a 3 s timeout no failure, past a
    0.3 s one a failure."""
    wait_until_serving(broker.running["broker"].address, timeout_s=30)  # a READY connection to start from
    probe = HealthProbe(interval_s=0.1, timeout_s=timeout_s, failures=1)
    with _Stopped(broker):
        found = _watch_keep(probe, broker, 0.7)  # one check, started at 0.1 s
    found += _watch_keep(probe, broker, 1.0)
    probe.close()
    assert bool(found) is hung, found


def test_a_serving_answer_between_failures_starts_the_count_again(broker):
    """One failed check (stopped until it has failed: the check at 0.5 s times out at 0.8 s, the next is due
    0.5 s after that), a SERVING one, then another failed one: never 2 in a row."""
    wait_until_serving(broker.running["broker"].address, timeout_s=30)
    probe = HealthProbe(interval_s=0.5, timeout_s=0.3, failures=2)
    found = []
    for _ in range(2):
        with _Stopped(broker):
            found += _watch_until(probe, broker, failed=1)
        found += _watch_until(probe, broker, failed=0)
    probe.close()
    assert found == []


def _watch_until(probe: HealthProbe, stack: LocalStack, failed: int, limit_s: float = 30.0) -> list:
    """Like :func:`_watch_keep` until the broker's count of failures in a row is ``failed`` (at most
    ``limit_s``): each phase ends on a check's answer, not on a clock a loaded machine can outrun."""
    start, found = time.monotonic(), []
    while probe._watches.get("broker") is None or probe._watches["broker"].failed != failed:
        assert time.monotonic() - start < limit_s, found
        found += probe.hung(stack, time.monotonic())
        time.sleep(0.02)
    return found


def _watch_keep(probe: HealthProbe, stack: LocalStack, seconds: float) -> list[tuple[str, int, str]]:
    """Like :func:`_watch`, keeping the probe's state (its checks in flight and counts) afterwards."""
    start, found = time.monotonic(), []
    while time.monotonic() - start < seconds:
        found += probe.hung(stack, time.monotonic())
        time.sleep(0.02)
    return found


def test_not_serving_is_a_failure():
    """A server that answers NOT_SERVING (draining, say) fails the check like one that does not answer."""
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    thread = ServerThread([])
    try:
        server = thread.start()
        stack = LocalStack(services=(), running={"svc": ServiceProcess("svc", alive, server.address)})
        serving = _watch(HealthProbe(interval_s=0.1, timeout_s=1.0, failures=2), stack, 0.6)
        thread.run(server.set_serving(False))
        found = _watch(HealthProbe(interval_s=0.1, timeout_s=1.0, failures=2), stack, 0.35)
    finally:
        thread.stop()
        alive.kill()
        alive.wait()
    assert serving == []
    assert found and {hung for _, hung in found} == {("svc", 2, "NOT_SERVING")}, found


@pytest.mark.parametrize(
    ("kwargs", "flag", "want"),
    [
        ({"interval_s": 0.0}, "--health-interval-s 0.0", "> 0 seconds"),
        ({"interval_s": -1.0}, "--health-interval-s -1.0", "> 0 seconds"),
        ({"interval_s": math.inf}, "--health-interval-s inf", "> 0 seconds"),
        ({"timeout_s": 0.0}, "--health-timeout-s 0.0", "> 0 seconds"),
        ({"timeout_s": math.nan}, "--health-timeout-s nan", "> 0 seconds"),
        ({"failures": 0}, "--health-failures 0", ">= 1"),
        ({"failures": -2}, "--health-failures -2", ">= 1"),
        ({"kill_grace_s": -0.1}, "--health-kill-grace-s -0.1", ">= 0 seconds"),
        ({"kill_grace_s": math.nan}, "--health-kill-grace-s nan", ">= 0 seconds"),
        ({"kill_grace_s": math.inf}, "--health-kill-grace-s inf", ">= 0 seconds"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_flag(kwargs, flag, want):
    with pytest.raises(InvalidArgumentError, match=rf"^{flag} is out of range \({want}\)$"):
        HealthProbe(**kwargs)


def test_the_smallest_values_are_accepted():
    HealthProbe(interval_s=0.001, timeout_s=0.001, failures=1, kill_grace_s=0.0)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--health-failures", "0"], "--health-failures 0 is out of range (>= 1)"),
        (["--health-interval-s", "0"], "--health-interval-s 0.0 is out of range (> 0 seconds)"),
        (["--health-timeout-s", "-5"], "--health-timeout-s -5.0 is out of range (> 0 seconds)"),
        (["--health-kill-grace-s", "-1"], "--health-kill-grace-s -1.0 is out of range (>= 0 seconds)"),
    ],
)
def test_marti_up_refuses_a_bad_health_flag_before_starting_anything(argv, line, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["up", *argv])
    assert exc.value.code == 2
    assert f"marti up: error: {line}" in capsys.readouterr().err


_TRAPS_SIGTERM = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); time.sleep(60)"
)


def _supervise_hung(
    script: str, policy: RestartPolicy, probe: HealthProbe, signals: StopSignals | None = None
) -> tuple[int, list[str], float]:
    """Run ``script`` as service ``svc`` beside a health server answering NOT_SERVING, and ``supervise`` it with
    ``probe`` until it gives up (exit 1 asserted) or, with ``signals``, until a stop signal (exit 0 asserted);
    returns the process's pid, the lines said and the seconds from the start of ``supervise`` to its return."""
    proc = subprocess.Popen([sys.executable, "-c", script])
    thread = ServerThread([])
    try:
        server = thread.start()
        thread.run(server.set_serving(False))
        stack = LocalStack(services=(), running={"svc": ServiceProcess("svc", proc, server.address)})
        lines: list[str] = []
        time.sleep(0.5)  # the script's signal handling is set by now
        start = time.monotonic()
        if signals is None:
            assert supervise(stack, policy, lambda: False, lines.append, probe=probe) == 1
        else:
            stopping, interruptible = signals.stopping, signals.interruptible
            assert (
                supervise(stack, policy, stopping, lines.append, probe=probe, interruptible=interruptible)
                == 0
            )
        took = time.monotonic() - start
    finally:
        thread.stop()
        proc.kill()
        proc.wait()
    return proc.pid, lines, took


@pytest.mark.parametrize(
    ("script", "policy", "end"),
    [
        (
            "import time; time.sleep(60)",
            RestartPolicy(mode="no"),
            "(code -15 (SIGTERM)); not restarted (--restart no)",
        ),
        # exit 0 on SIGTERM is no clean stop here: it hung, so it failed (the limit is what stops it)
        (_TRAPS_SIGTERM, RestartPolicy(max_restarts=0), "(code 0); restarted 0 times within 60 s already"),
    ],
)
def test_supervise_sends_a_hung_service_sigterm_first_and_counts_it_as_failed(script, policy, end):
    """A process that answers NOT_SERVING is hung; ``supervise`` SIGTERMs it (it ends within the 5 s grace,
    no SIGKILL needed) and treats it as failed whatever its exit code."""
    pid, lines, took = _supervise_hung(script, policy, HealthProbe(interval_s=0.1, timeout_s=1.0, failures=1))
    assert lines[0] == (
        f"marti up: svc (pid {pid}) failed 1 health checks in a row (every 0.1 s, 1 s timeout; last: "
        "NOT_SERVING); killing it (SIGTERM, SIGKILL after 5 s)"
    )
    assert lines[1].startswith(f"marti up: error: svc hung and was killed {end}"), lines
    assert took < 4, took


_IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"


@pytest.mark.parametrize("grace_s", [0.0, 0.3])
def test_a_hung_service_that_ignores_sigterm_gets_sigkill_after_the_kill_grace(grace_s):
    """``kill_grace_s`` is the wait between the SIGTERM and the SIGKILL: a process ignoring SIGTERM is killed
    (code -9) that long after, not after the 5 s default."""
    probe = HealthProbe(interval_s=0.1, timeout_s=1.0, failures=1, kill_grace_s=grace_s)
    _, lines, took = _supervise_hung(_IGNORES_SIGTERM, RestartPolicy(mode="no"), probe)
    assert lines[0].endswith(f"killing it (SIGTERM, SIGKILL after {grace_s:g} s)"), lines
    assert lines[1].startswith("marti up: error: svc hung and was killed (code -9 (SIGKILL))"), lines
    assert grace_s <= took < grace_s + 3, took


def test_a_stop_signal_during_a_long_kill_grace_acts_at_once():
    """SIGTERM to ``marti up`` while it waits out a hung service's ``--health-kill-grace-s`` (60 s here, for a
    process ignoring SIGTERM) ends the wait at once: ``supervise`` returns 0 within seconds (the caller then stops
    the stack), instead of after the grace."""
    signals = StopSignals()
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signals.install()
    timer = threading.Timer(
        2.0, os.kill, (os.getpid(), signal.SIGTERM)
    )  # during the grace: found hung at ~0.6 s
    timer.start()
    try:
        probe = HealthProbe(interval_s=0.1, timeout_s=1.0, failures=1, kill_grace_s=60.0)
        _, lines, took = _supervise_hung(_IGNORES_SIGTERM, RestartPolicy(mode="no"), probe, signals)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    assert signals.received == "SIGTERM"
    assert lines == [lines[0]] and lines[0].endswith("killing it (SIGTERM, SIGKILL after 60 s)"), lines
    assert took < 10, took
