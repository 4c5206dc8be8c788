"""The benches' one server start (:class:`benchmarks.server.Server`, through :class:`marti.command.stack.LocalStack`):
a real service process on port 0, its CPU from /proc, its flags passed as they are, its log kept on stop."""

from __future__ import annotations

import pytest

from benchmarks.server import Server, cpu_s
from marti.errors import UnavailableError
from marti.rpc.client.health import check_health


def test_a_service_serves_in_its_own_process_and_stops():
    with Server("env-server", ["--max-sessions", "8", "--log-level", "WARNING"]) as server:
        assert check_health(server.address, timeout_s=5) == "SERVING"
        assert server.alive() and server.cpu_s() > 0 and cpu_s(server.proc.pid) > 0  # its start took CPU
    assert not server.alive() and server.proc.returncode is not None and isinstance(server.tail, list)


def test_a_bad_flag_is_the_services_own_error():
    with pytest.raises(UnavailableError, match=r"store \(port any\) exited with code 2 before listening"):
        Server("store", ["--log-level", "LOUD"])  # not a logging level: the store exits with code 2
