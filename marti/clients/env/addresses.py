"""Env server addresses that name several servers: parsing and DNS expansion (what the config schema checks
``services.env`` with; this module itself calls no server).

Accepted forms (see ``docs/environments.md``, "Several env servers"):

* one address ``"host:port"``: one server, passed to gRPC exactly as before (not checked here);
* several: a list ``["h1:50052", "h2:50052"]`` or a comma-separated string ``"h1:50052,h2:50052"``;
* ``"dns:///name:port"`` (alone or as an entry of a list): one server per address ``name`` resolves to
  (``socket.getaddrinfo``, IPv4 and IPv6, in the resolver's order, resolved once when the pool is made).

Each entry of a multi-server value must be ``host:port``, ``[ipv6]:port``, ``dns:///host:port`` or ``unix:path``
(port 1..65535); anything else is an :class:`~marti.errors.InvalidArgumentError` naming the entry and the value.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from marti.errors import InvalidArgumentError, UnavailableError
from marti.rpc.address import HOST_PORT as _HOST_PORT

__all__ = ["DNS_PREFIX", "env_server_entries", "is_env_pool", "resolve_env_servers", "single_env_address"]

#: The prefix of an entry that expands to one server per address its name resolves to.
DNS_PREFIX = "dns:///"


def _host_port(entry: str, text: str, value: object) -> tuple[str, int]:
    m = _HOST_PORT.match(text)
    port = int(m.group("port")) if m else 0
    if m is None or not 1 <= port <= 65535:
        raise InvalidArgumentError(
            f"env server address {entry!r} (in {value!r}) is not host:port, [ipv6]:port, dns:///host:port or "
            "unix:path with a port 1..65535"
        )
    return (m.group("v6") or m.group("host")), port


def env_server_entries(value: str | Sequence[str]) -> tuple[str, ...]:
    """The entries of a multi-server address value, syntax-checked (nothing is resolved or dialed).

    Args:
        value: A list of addresses, or a string of comma-separated addresses (a single address is one entry).

    Returns:
        The entries, stripped of surrounding blanks, in order, each once (a repeated entry is dropped).

    Raises:
        InvalidArgumentError: An empty list or string, an empty entry (``"a:1,,b:2"``), an entry that is not a
            string, or a malformed entry (see the module docstring); the message names the entry and the value.
    """
    if isinstance(value, str):
        parts: list[object] = list(value.split(","))
    elif isinstance(value, Sequence):
        parts = list(value)
    else:
        raise InvalidArgumentError(
            f"env server addresses must be a string or a list of strings, got {type(value).__name__} {value!r}"
        )
    if not parts or (isinstance(value, str) and not value.strip()):
        raise InvalidArgumentError(f"no env server address given ({value!r})")
    out: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise InvalidArgumentError(f"env server address {part!r} (in {value!r}) is not a string")
        entry = part.strip()
        if not entry:
            raise InvalidArgumentError(f"empty env server address in {value!r}")
        if entry.startswith("unix:"):
            if len(entry) == len("unix:") or any(c.isspace() for c in entry):
                raise InvalidArgumentError(
                    f"env server address {entry!r} (in {value!r}) names no socket path"
                )
        elif entry.startswith(DNS_PREFIX):
            _host_port(entry, entry[len(DNS_PREFIX) :], value)
        else:
            _host_port(entry, entry, value)
        if entry not in out:
            out.append(entry)
    return tuple(out)


def is_env_pool(value: str | Sequence[str] | None) -> bool:
    """Whether an env address value names a pool of servers rather than one server.

    A pool is a list or comma-separated string of two or more distinct entries, or any value with a
    ``dns:///`` entry. A single plain address (a string without a comma, or a list of one) is not a pool: it is
    dialed exactly as before pools existed, and is not checked here.

    Raises:
        InvalidArgumentError: The value is a list or comma-separated string with a bad entry (see
            :func:`env_server_entries`).
    """
    if value is None or (
        isinstance(value, str) and "," not in value and not value.strip().startswith(DNS_PREFIX)
    ):
        return False
    entries = env_server_entries(value)
    return len(entries) > 1 or entries[0].startswith(DNS_PREFIX)


def single_env_address(value: str | Sequence[str] | None) -> str | None:
    """The one address of a value that is not a pool: a plain string as given, else the one distinct entry of a
    list or comma-separated string (``"h:1,h:1"`` and ``["h:1"]`` give ``"h:1"``); ``None`` for ``None``. Call it
    only where :func:`is_env_pool` is False.

    Raises:
        InvalidArgumentError: An empty or blank string (``""``, ``"  "``), naming it.
    """
    if isinstance(value, str) and not value.strip():
        raise InvalidArgumentError(f"no env server address given ({value!r})")
    if value is None or (isinstance(value, str) and "," not in value):
        return value
    return env_server_entries(value)[0]


def _expand(entry: str, value: object) -> list[str]:
    host, port = _host_port(entry, entry[len(DNS_PREFIX) :], value)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise UnavailableError(f"env server name {entry!r} does not resolve: {e}") from None
    out: list[str] = []
    for family, _, _, _, sockaddr in infos:
        ip = str(sockaddr[0])
        address = f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
        if address not in out:
            out.append(address)
    if not out:
        raise UnavailableError(f"env server name {entry!r} resolves to no address")
    return out


def resolve_env_servers(value: str | Sequence[str]) -> tuple[str, ...]:
    """The servers an address value names: its entries, each ``dns:///name:port`` replaced by one ``ip:port``
    (``[ip]:port`` for IPv6) per address ``name`` resolves to. A server named twice is kept once.

    Raises:
        InvalidArgumentError: A bad value or entry (see :func:`env_server_entries`).
        UnavailableError: A ``dns:///`` name that does not resolve (the entry is named).
    """
    out: list[str] = []
    for entry in env_server_entries(value):
        for address in _expand(entry, value) if entry.startswith(DNS_PREFIX) else [entry]:
            if address not in out:
                out.append(address)
    return tuple(out)
