"""Binding a server's port exclusively, and the one error every marti server gives when the port is taken.

Every listener of a marti server (the gRPC port of each service and of the gateway, the gateway's HTTP port,
the Prometheus port) binds without ``SO_REUSEPORT``, so a second server on a taken port fails instead of
sharing the port and splitting the clients between the two (``marti.rpc.options.server_options``). Each
refuses with :func:`address_in_use_error`: "address in use", naming the port.
"""

from __future__ import annotations

import errno
import socket

from marti.errors import UnavailableError

__all__ = ["address_in_use_error", "host_port", "port_in_use"]


def host_port(host: str, port: int) -> str:
    """``host:port`` as gRPC parses it: a bare IPv6 literal (``::1``) is bracketed (``[::1]:50051``).

    Args:
        host: A name, an IPv4 address, or an IPv6 address with or without brackets.
        port: TCP port.
    """
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def _addresses(host: str, port: int) -> list[tuple[int, tuple]]:
    """``(family, sockaddr)`` of every address ``host:port`` binds (``""``/``0.0.0.0``/``[::]`` included)."""
    try:
        infos = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, UnicodeError):
        return []
    return [(family, sockaddr) for family, _, _, _, sockaddr in infos]


def port_in_use(host: str, port: int) -> bool:
    """Whether a listening socket already holds ``host:port``.

    Probes with a socket bound the way servers bind (``SO_REUSEADDR``, no ``SO_REUSEPORT``), so a port left in
    ``TIME_WAIT`` by a server that just stopped counts as free, and a port another process listens on counts
    as taken. Port 0 is never in use.

    Args:
        host: Interface (``127.0.0.1``, ``0.0.0.0``, ``[::]``, a name).
        port: TCP port.

    Returns:
        True when binding one of the host's addresses fails with ``EADDRINUSE``.
    """
    if port == 0:
        return False
    for family, sockaddr in _addresses(host, port):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


def address_in_use_error(what: str, host: str, port: int) -> UnavailableError:
    """The error of a server whose port is taken.

    Args:
        what: The listener, e.g. ``"marti.api.broker.v1.BrokerService"`` or ``"the gateway's HTTP endpoint"``.
        host: The interface it tried to bind.
        port: The port it tried to bind.

    Returns:
        An :class:`~marti.errors.UnavailableError` saying "address in use" and naming the port.
    """
    return UnavailableError(
        f"{what} cannot listen on {host_port(host, port)}: address in use (port {port} is taken by another process; "
        "stop it, or choose another port: 0 picks a free one)"
    )
