"""The one check of the addresses SDK clients dial (no grpc here, so config code can use it too).

gRPC dials an address without a port on port 443 (``"localhost"`` means ``localhost:443``), which no marti
service uses: a client given one would wait for its deadline and then blame the network. Every SDK channel
(:func:`marti.rpc.client.channel.make_channel`) therefore checks its address first with :func:`check_address`.

Accepted forms: ``host:port``, ``[ipv6]:port``, ``dns:///host:port``, ``dns://authority/host:port``,
``ipv4:a.b.c.d:port[,...]``, ``ipv6:[addr]:port[,...]`` (port 1..65535), and the socket forms
``unix:path``, ``unix:///abs/path``, ``unix-abstract:name`` and ``vsock:cid:port``.
"""

from __future__ import annotations

import re

from marti.errors import InvalidArgumentError

__all__ = ["HOST_PORT", "check_address"]

#: ``host:port`` or ``[ipv6]:port`` (hex digits, colons and dots, an optional ``%zone``); ASCII digits only in the
#: port (``\d`` would take full-width and other Unicode digits, which gRPC does not).
HOST_PORT = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+(?:%[\w.-]+)?)\]|(?P<host>[^\s:/\[\],]+)):(?P<port>[0-9]{1,5})$"
)
#: Prefixes of addresses that name a socket rather than a TCP port.
_SOCKET_SCHEMES = ("unix:", "unix-abstract:", "vsock:")
#: A host with no port at all: a name or IPv4 address, a bracketed IPv6 address, or a bare IPv6 address.
_NO_PORT = re.compile(r"^(?:[^\s:/\[\],]+|\[[^\]]*\]|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*)$")


def _targets(address: str) -> list[str]:
    """The ``host:port`` parts of ``address`` once its ``dns:``/``ipv4:``/``ipv6:`` scheme is removed."""
    if address.startswith("dns:"):
        rest = address[len("dns:") :]
        if rest.startswith("//"):  # dns:///host:port or dns://authority/host:port
            rest = rest[2:].partition("/")[2]
        return [rest]
    for scheme in ("ipv4:", "ipv6:"):
        if address.startswith(scheme):
            return address[len(scheme) :].split(",")
    return [address]


def check_address(address: object, what: str = "address") -> str:
    """Check that ``address`` names a server a gRPC channel can dial, port included.

    Args:
        address: What the caller gave as the server's address.
        what: How to call it in the message (e.g. ``"broker address"``).

    Returns:
        ``address`` unchanged.

    Raises:
        InvalidArgumentError: Not a string, empty, without a port (gRPC would dial port 443), with a port outside
            1..65535, or malformed (blanks, a bare IPv6 address without brackets); the message names the value.
    """
    if not isinstance(address, str):
        raise InvalidArgumentError(
            f"{what} must be a 'host:port' string, got {type(address).__name__} {address!r}"
        )
    if address.startswith(_SOCKET_SCHEMES):
        if any(c.isspace() for c in address) or address.endswith(":"):
            raise InvalidArgumentError(f"{what} {address!r} names no socket")
        return address
    for target in _targets(address):
        match = HOST_PORT.match(target)
        if match is not None and 1 <= int(match.group("port")) <= 65535:
            continue
        if match is not None:
            problem = f"port {match.group('port')} is outside 1..65535"
        elif _NO_PORT.match(target):
            problem = "it has no port (gRPC would dial port 443, where no marti service listens)"
        else:
            problem = "it is not host:port, [ipv6]:port, dns:///host:port or unix:path"
        raise InvalidArgumentError(
            f"{what} {address!r} cannot be dialed: {problem}; write e.g. 'localhost:50051'"
        )
    return address
