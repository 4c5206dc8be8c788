"""Health checks over the standard ``grpc.health.v1`` protocol (like grpc_health_probe)."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from marti.rpc.channel import make_channel


def check_health(
    address: str,
    service: str = "",
    *,
    timeout_s: float = 5.0,
    token: str | None = None,
    tls_ca_file: str | None = None,
) -> str:
    """Ask a server for its health status.

    Args:
        address: ``host:port``.
        service: Service name to check; ``""`` asks about the server as a whole.
        timeout_s: Deadline of the check, seconds.
        token: Bearer token (health is exempt from auth, but a proxy may want it).
        tls_ca_file: PEM CA for TLS servers.

    Returns:
        ``"SERVING"``, ``"NOT_SERVING"``, ``"SERVICE_UNKNOWN"``, ``"UNKNOWN"``, or ``"UNREACHABLE: <code>"``
        when the call itself failed.

    Raises:
        InvalidArgumentError: ``address`` has no port or is malformed (see :func:`marti.rpc.address.check_address`).
    """
    channel = make_channel(address, token=token, tls_ca_file=tls_ca_file)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            return "SERVICE_UNKNOWN"
        return f"UNREACHABLE: {err.code().name}"
    finally:
        channel.close()


def wait_until_serving(address: str, service: str = "", *, timeout_s: float = 60.0, **kwargs) -> None:
    """Poll :func:`check_health` until SERVING.

    Args:
        address: ``host:port``.
        service: Service name, ``""`` for the whole server.
        timeout_s: Total time to wait, seconds.
        **kwargs: Passed to :func:`check_health` (token, tls_ca_file).

    Raises:
        marti.errors.DeadlineExceededError: not SERVING within ``timeout_s``; the message has the last status.
    """
    from marti.errors import DeadlineExceededError

    deadline = time.monotonic() + timeout_s
    status = "UNKNOWN"
    while time.monotonic() < deadline:
        status = check_health(address, service, timeout_s=min(2.0, timeout_s), **kwargs)
        if status == "SERVING":
            return
        time.sleep(0.1)
    raise DeadlineExceededError(f"{address} not SERVING after {timeout_s:.0f}s (last status: {status})")
