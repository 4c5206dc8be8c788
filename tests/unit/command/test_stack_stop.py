"""``LocalStack.stop``: SIGTERM to every service, one deadline of ``stop_grace_s`` for all of them, then SIGKILL
(``marti up --stop-grace-s``; the flag through ``marti up``: tests/integration/test_cli_services.py)."""

from __future__ import annotations

import math
import subprocess
import sys
import time

import pytest

from marti.command.stack import LocalStack, ServiceProcess
from marti.errors import InvalidArgumentError

_IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
)
_EXITS_ON_SIGTERM = "import time; print(1, flush=True); time.sleep(60)"


def _stack(script: str, count: int, grace_s: float) -> LocalStack:
    """A stack of ``count`` running copies of ``script`` (each has set its signal handlers when this returns)."""
    running = {}
    for i in range(count):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline()  # the handler is in place
        running[f"svc{i}"] = ServiceProcess(f"svc{i}", proc, "127.0.0.1:1")
    return LocalStack(services=tuple(running), running=running, stop_grace_s=grace_s)


def test_services_ignoring_sigterm_share_one_grace_then_get_sigkill():
    """Three services that ignore SIGTERM, a 2 s grace: all SIGKILLed after about 2 s in all (one after the other
    took 3 x 2 s)."""
    stack = _stack(_IGNORES_SIGTERM, 3, 2.0)
    start = time.monotonic()
    codes = stack.stop()
    took = time.monotonic() - start
    assert codes == {"svc2": -9, "svc1": -9, "svc0": -9}
    assert 2.0 <= took < 5.0, took
    assert stack.running == {}


def test_services_that_exit_on_sigterm_are_not_waited_for():
    stack = _stack(_EXITS_ON_SIGTERM, 2, 60.0)
    start = time.monotonic()
    assert stack.stop() == {"svc1": -15, "svc0": -15}
    assert time.monotonic() - start < 30  # not the 60 s grace


def test_a_grace_of_0_kills_at_once_and_an_explicit_timeout_wins():
    assert _stack(_IGNORES_SIGTERM, 1, 0.0).stop() == {"svc0": -9}
    stack = _stack(_IGNORES_SIGTERM, 1, 60.0)
    start = time.monotonic()
    assert stack.stop(timeout_s=0.2) == {"svc0": -9}
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("grace_s", [-0.1, math.nan, math.inf])
def test_a_bad_grace_is_refused_naming_the_flag(grace_s):
    with pytest.raises(
        InvalidArgumentError, match=rf"^--stop-grace-s {grace_s!r} is out of range \(>= 0 seconds"
    ):
        LocalStack(stop_grace_s=grace_s)


@pytest.mark.parametrize("grace_s", [0.0, 1.0])
def test_a_service_interrupted_while_it_starts_gets_the_stop_grace(grace_s, monkeypatch):
    """Ctrl-C while a service starts (here: while the stack reads its first line; a service that ignores SIGTERM):
    it is ended with the stack's ``stop_grace_s``, SIGTERM then SIGKILL that long after, not a fixed 15 s."""
    monkeypatch.setattr(
        LocalStack, "_command", lambda self, name, port: [sys.executable, "-c", _IGNORES_SIGTERM]
    )
    spawned: list[subprocess.Popen] = []

    def read_then_interrupt(self, name, port, proc, log_path):
        spawned.append(proc)
        proc.stdout.readline()  # its SIGTERM handler is in place
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalStack, "_read_address", read_then_interrupt)
    stack = LocalStack(services=("broker",), stop_grace_s=grace_s)
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        stack.start()
    took = time.monotonic() - start
    assert spawned[0].returncode == -9  # it ignored the SIGTERM: killed after the grace
    assert grace_s <= took < grace_s + 10, took
