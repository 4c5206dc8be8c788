"""The store's log lines carry a time stamp like every other service's: its ``__main__`` set up logging with
Python's default format before the server's shared one (:func:`marti.rpc.serving.logs.configure_logging`) could
apply, so it printed ``INFO:marti.rpc.serving.server:shutting down...`` where the broker and the env server print
``2026-12-06 22:54:43,439 INFO marti.rpc.serving.server: shutting down...``."""

from __future__ import annotations

import re
import signal

import pytest

from tests.faults.procs import start
from tests.waits import until

_STAMPED = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO marti\.rpc\.serving\.server: shutting down")


@pytest.mark.parametrize("service", ["store", "broker", "env-server"])
def test_a_services_first_log_line_has_the_shared_time_stamped_format(service, tmp_path):
    """Each service runs as a process on port 0 (the store and broker with a data dir); SIGTERM makes it log
    its shutdown; its first line after ``listening on`` (stderr joined to stdout) has the shared format."""
    extra = ["--data-dir", str(tmp_path / "data")] if service != "env-server" else []
    svc = start(service, *extra)
    try:
        svc.signal(signal.SIGTERM)
        assert svc.proc.wait(timeout=30) == 0, svc.output
    finally:
        svc.stop()
    until(lambda: "stopped\n" in svc.output, "its last line read")  # the reader thread drains the pipe
    assert _STAMPED.match(svc.output[0]), svc.output
