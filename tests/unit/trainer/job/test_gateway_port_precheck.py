"""A gateway port another process holds is refused by ``marti train`` before the run folder: found by a new user
as ``the gateway's HTTP endpoint cannot listen on ...`` after the services and Ray had started and ``--overwrite``
had deleted the previous run."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from tests.refused_runs import train_over_an_old_run

ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.parametrize("key", ["http_port", "grpc_port"])
def test_a_gateway_port_in_use_is_refused_before_an_overwrite(tmp_path, key):
    job = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        job["gateway"] = {"enabled": True, key: port}
        proc = train_over_an_old_run(tmp_path, job)
    endpoint = "HTTP" if key == "http_port" else "gRPC"
    assert (
        f"marti train: the gateway's {endpoint} endpoint (gateway.{key}) cannot listen on 127.0.0.1:{port}: "
        f"address in use (port {port} is taken by another process"
    ) in proc.stderr, proc.stderr
    assert "starting embedded broker" not in proc.stderr + proc.stdout  # nothing started
