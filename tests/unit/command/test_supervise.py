"""``marti up``'s restart policy (:class:`marti.command.restart_policy.RestartPolicy`): which exits restart, the count within
the window, the doubling backoff and its cap, and the flags' ranges. The restarts themselves, with real
processes: ``tests/integration/test_cli_services.py``."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from marti.command.main import main
from marti.command.restart_policy import MAX_BACKOFF_S, RestartPolicy, describe_exit
from marti.command.stack import LocalStack, ServiceProcess
from marti.command.supervise import supervise
from marti.errors import InvalidArgumentError


def _stack_with_exited(name: str, code: int, address: str = "127.0.0.1:1") -> LocalStack:
    """A stack whose only running service is a real process that exited with ``code``."""
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    proc.wait()
    return LocalStack(services=(), running={name: ServiceProcess(name, proc, address)})


def test_on_failure_restarts_up_to_max_within_the_window_with_a_doubling_backoff():
    policy = RestartPolicy(max_restarts=3, window_s=10.0, backoff_s=1.0)
    assert [policy.next_restart("store", True, t) for t in (0.0, 1.0, 2.0)] == [1.0, 2.0, 4.0]
    assert policy.next_restart("store", True, 3.0) is None  # a 4th within 10 s: the stack stops
    assert policy.next_restart("broker", True, 3.0) == 1.0  # counted per service
    assert policy.restarts("store", 10.5) == 2  # the restart at 0.0 left the window
    assert policy.next_restart("store", True, 10.5) == 4.0


def test_backoff_is_capped():
    policy = RestartPolicy(max_restarts=10, backoff_s=10.0)
    assert [policy.next_restart("s", True, float(t)) for t in range(4)] == [10.0, 20.0, 30.0, MAX_BACKOFF_S]


def test_backoff_stays_capped_after_a_thousand_restarts_in_the_window():
    """``backoff_s * 2**done`` overflowed a float after 1024 restarts (a long window, a high --max-restarts):
    the supervisor crashed with OverflowError instead of waiting the cap."""
    policy = RestartPolicy(max_restarts=2000, window_s=1e9, backoff_s=0.0)
    assert {policy.next_restart("s", True, float(t)) for t in range(1100)} == {0.0}
    policy = RestartPolicy(max_restarts=2000, window_s=1e9, backoff_s=1.0)
    assert [policy.next_restart("s", True, float(t)) for t in range(1100)][-1] == MAX_BACKOFF_S


def test_no_restart_for_mode_no_or_a_clean_exit():
    assert RestartPolicy(mode="no").next_restart("store", True, 0.0) is None
    assert RestartPolicy().next_restart("store", False, 0.0) is None  # stopped from outside (SIGTERM to it)
    assert RestartPolicy(max_restarts=0).next_restart("store", True, 0.0) is None


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"mode": "always"}, "--restart 'always'"),
        ({"max_restarts": -1}, "--max-restarts -1"),
        ({"window_s": 0.0}, "--restart-window-s 0.0"),
        ({"backoff_s": -1.0}, "--restart-backoff-s -1.0"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_flag(kwargs, flag):
    with pytest.raises(InvalidArgumentError, match=f"^{flag} is out of range"):
        RestartPolicy(**kwargs)


def test_marti_up_refuses_a_bad_restart_flag_before_starting_anything(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["up", "--max-restarts", "-1"])
    assert exc.value.code == 2
    assert "marti up: error: --max-restarts -1 is out of range (>= 0)" in capsys.readouterr().err


def test_describe_exit_names_the_signal():
    assert describe_exit(-9) == "code -9 (SIGKILL)"
    assert describe_exit(1) == "code 1"


def test_a_signal_during_the_backoff_stops_at_once_with_exit_0():
    """SIGTERM to ``marti up`` while a service waits 30 s for its restart: the stack stops now, exit 0."""
    stack, lines = _stack_with_exited("store", 1), []
    start = time.monotonic()
    code = supervise(
        stack, RestartPolicy(backoff_s=30.0), lambda: time.monotonic() - start > 0.5, lines.append
    )
    assert code == 0 and time.monotonic() - start < 15, lines  # waiting out the backoff takes 30 s
    assert lines == [
        "marti up: store exited with code 1; restarting it in 30 s (restart 1 of at most 5 within 60 s)"
    ]


@pytest.mark.parametrize(
    ("policy", "exit_code", "why"),
    [
        (RestartPolicy(mode="no"), 1, "not restarted (--restart no)"),
        (RestartPolicy(), 0, "a clean exit is a stop from outside, not a failure"),
    ],
)
def test_no_restart_stops_the_stack_saying_why(policy, exit_code, why):
    lines = []
    assert supervise(_stack_with_exited("broker", exit_code), policy, lambda: False, lines.append) == 1
    assert len(lines) == 1 and lines[0].startswith(
        f"marti up: error: broker exited with code {exit_code}; {why}"
    )


def test_a_restart_that_cannot_listen_counts_as_the_next_failure(capfd):
    """The broker's port was taken while it was down: its restart fails ("address in use", named), which counts
    against --max-restarts like another exit, and the stack stops with both reasons in one line."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        stack, lines = _stack_with_exited("broker", 3, f"127.0.0.1:{port}"), []
        policy = RestartPolicy(max_restarts=1, backoff_s=0.0)
        assert supervise(stack, policy, lambda: False, lines.append) == 1
    assert lines[0].startswith("marti up: broker exited with code 3; restarting it in 0 s")
    assert lines[1].startswith(
        f"marti up: error: broker did not come back (broker (port {port}) exited with code 1"
    )
    assert f"address in use (port {port}" in capfd.readouterr().err  # the broker's own line, just above
    assert "before listening" in lines[1] and lines[1].endswith(
        "(--max-restarts 1, --restart-window-s 60); stopping the stack"
    )
