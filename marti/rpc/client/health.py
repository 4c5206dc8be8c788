"""Health checks over the standard ``grpc.health.v1`` protocol (like grpc_health_probe)."""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from marti.rpc.client.channel import make_channel


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
    return start_check(address, service, timeout_s=timeout_s, token=token, tls_ca_file=tls_ca_file).status()


class HealthCheckCall:
    """One ``grpc.health.v1`` ``Check`` in flight, on a channel of its own (:func:`start_check`).

    Poll :meth:`done` without blocking, then read :meth:`status` (which closes the channel), or :meth:`cancel` it.
    """

    def __init__(self, channel: grpc.Channel, future: grpc.Future) -> None:
        self._channel = channel
        self._future = future

    def done(self) -> bool:
        """Whether the server answered or the call failed (its deadline included); never blocks."""
        return self._future.done()

    def status(self) -> str:
        """The answer, as :func:`check_health` returns it (blocks until :meth:`done`); closes the channel."""
        try:
            resp = self._future.result()
            return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                return "SERVICE_UNKNOWN"
            return f"UNREACHABLE: {err.code().name}"
        finally:
            self._channel.close()

    def cancel(self) -> None:
        """Give up on the call and close its channel."""
        self._future.cancel()
        self._channel.close()


def start_check(
    address: str, service: str = "", *, timeout_s: float = 5.0, wait_for_ready: bool = False, **channel_args
) -> HealthCheckCall:
    """Send a ``Check`` to ``address`` without waiting for the answer (``address``, ``service``, ``timeout_s``
    and, in ``channel_args``, ``token`` and ``tls_ca_file``, as for :func:`check_health`).

    ``wait_for_ready``: wait for a connection until ``timeout_s`` (then ``UNREACHABLE: DEADLINE_EXCEEDED``)
    rather than fail with ``UNREACHABLE: UNAVAILABLE`` as soon as a connection attempt fails (gRPC gives one
    ``grpc.min_reconnect_backoff_ms``, 200 ms on marti channels, to complete its handshake).

    Raises:
        InvalidArgumentError: ``address`` has no port or is malformed.
    """
    channel = make_channel(address, **channel_args)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        future = stub.Check.future(request, timeout=timeout_s, wait_for_ready=wait_for_ready)
    except BaseException:
        channel.close()
        raise
    return HealthCheckCall(channel, future)


def poll_health(
    address: str,
    service: str = "",
    *,
    timeout_s: float,
    until: tuple[str, ...] = ("SERVING",),
    interval_s: float = 0.1,
    check_timeout_s: float = 2.0,
    on_wait: Callable[[str], None] | None = None,
    **kwargs,
) -> str:
    """Poll :func:`check_health` until its status is one of ``until`` or ``timeout_s`` has passed.

    Args:
        address: ``host:port``.
        service: Service name, ``""`` for the whole server.
        timeout_s: Total time to wait, seconds (0: one check).
        until: The statuses that end the wait.
        interval_s: Pause between checks, seconds.
        check_timeout_s: Deadline of each check, seconds (at most ``timeout_s`` when that is positive).
        on_wait: Called once with the first status not in ``until`` when the poll goes on.
        **kwargs: Passed to :func:`check_health` (token, tls_ca_file).

    Returns:
        The last status (one of ``until``, or what the server last answered when the time ran out).
    """
    deadline = time.monotonic() + timeout_s
    each = min(check_timeout_s, timeout_s) if timeout_s > 0 else check_timeout_s
    waited = False
    while True:
        status = check_health(address, service, timeout_s=each, **kwargs)
        if status in until or time.monotonic() >= deadline:
            return status
        if on_wait is not None and not waited:
            on_wait(status)
        waited = True
        time.sleep(interval_s)


def wait_until_serving(address: str, service: str = "", *, timeout_s: float = 60.0, **kwargs) -> None:
    """Poll :func:`check_health` until SERVING (:func:`poll_health`).

    Args:
        address: ``host:port``.
        service: Service name, ``""`` for the whole server.
        timeout_s: Total time to wait, seconds.
        **kwargs: Passed to :func:`check_health` (token, tls_ca_file).

    Raises:
        marti.errors.DeadlineExceededError: not SERVING within ``timeout_s``; the message has the last status.
    """
    from marti.errors import DeadlineExceededError

    status = poll_health(address, service, timeout_s=timeout_s, **kwargs)
    if status != "SERVING":
        raise DeadlineExceededError(f"{address} not SERVING after {timeout_s:.0f}s (last status: {status})")
