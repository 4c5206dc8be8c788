""":class:`marti.command.stack.LocalStack` waits ``startup_timeout_s`` at most for a service's address, also when the
service process is stopped (SIGSTOP) before it printed anything: that wait read its stdout with a blocking
``readline()``, which never returned (``marti up`` hung for good on a start or restart)."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from marti.command.stack import LocalStack
from marti.errors import UnavailableError


def _stop_new_child(found: list[psutil.Process], timeout_s: float = 30) -> None:
    """SIGSTOP this process's first ``marti.command.main broker`` child as soon as it runs (it is appended to ``found``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for child in psutil.Process(os.getpid()).children():
            try:
                if "broker" in child.cmdline():
                    child.send_signal(signal.SIGSTOP)
                    found.append(child)
                    return
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.005)


def test_a_service_stopped_before_it_listens_times_out_and_is_killed(tmp_path):
    found: list[psutil.Process] = []
    watcher = threading.Thread(target=_stop_new_child, args=(found,), daemon=True)
    watcher.start()
    stack = LocalStack(services=("broker",), log_dir=tmp_path, startup_timeout_s=3)
    start = time.monotonic()
    try:
        with pytest.raises(UnavailableError, match=r"^broker did not print its address within 3s$"):
            stack.start()
        took = time.monotonic() - start
        watcher.join(5)
        assert found, "the broker was not seen"
        assert not found[0].is_running()  # killed and reaped, not left stopped
    finally:
        for child in found:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
    assert took < 10, took


def test_a_service_that_listens_still_starts_and_logs(tmp_path):
    """The address line is read through the pipe's buffer; the service still serves and its log is written."""
    with LocalStack(services=("broker",), log_dir=tmp_path) as stack:
        assert stack.addresses["broker"].startswith("127.0.0.1:")
    assert (tmp_path / "broker.log").read_text().strip()
