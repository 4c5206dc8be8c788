"""That each service address a job was given serves the service it was given for, checked before the run folder
(so that a swapped ``--env`` / ``--store`` port fails at once, and a service that does not answer within
``services.reconnect_timeout_s`` fails then, both before ``--overwrite`` clears the old run).

One standard ``grpc.health.v1`` Check per address, for the service's full name: every marti server registers a
health status per service it hosts, and answers NOT_FOUND (``SERVICE_UNKNOWN``) for one it does not host.
"""

from __future__ import annotations

import sys

from marti.errors import InvalidArgumentError, UnavailableError
from marti.rpc.client.health import poll_health
from services.trainer.job.connections.addresses import Addresses

__all__ = ["SERVICE_NAMES", "check_given_services"]

#: The gRPC service each of a job's addresses must serve, and the flag that sets it.
SERVICE_NAMES: dict[str, tuple[str, str]] = {
    "broker": ("marti.api.broker.v1.BrokerService", "--broker"),
    "env": ("marti.api.env.v1.EnvService", "--env"),
    "store": ("marti.api.experience.v1.ExperienceService", "--store"),
}


def _entries(addresses: Addresses, service: str) -> list[str]:
    """The ``host:port`` entries of ``service``'s address (an env pool has several; ``dns:///`` ones are skipped:
    the pool resolves them when it opens)."""
    from marti.clients.env.addresses import env_server_entries, is_env_pool

    value = getattr(addresses, service)
    if service == "env" and is_env_pool(value):
        return [e for e in env_server_entries(value) if not e.startswith("dns:")]
    return [value] if isinstance(value, str) and value and not value.startswith("dns:") else []


def check_given_services(
    addresses: Addresses, given: tuple[str, ...], *, wait_s: float = 0.0, timeout_s: float = 5.0
) -> None:
    """Refuse a given address whose server does not host the service it was given for, or that does not answer.

    Args:
        addresses: The job's addresses (:func:`~services.trainer.job.connections.addresses.resolve_addresses`).
        given: The services whose address was given (not started by the job), of ``"broker"``, ``"env"``,
            ``"store"``.
        wait_s: How long a server that does not answer (down, still starting, draining) is waited for, seconds
            (``marti train`` passes ``services.reconnect_timeout_s``, the time the job itself would retry).
        timeout_s: Deadline of each health check, seconds.

    Raises:
        InvalidArgumentError: A server answers that it does not host the service (``SERVICE_UNKNOWN``).
        UnavailableError: A server did not answer SERVING within ``wait_s``.
        Each message names the service, its flag and the address.
    """
    for service in given:
        name, flag = SERVICE_NAMES[service]
        for address in _entries(addresses, service):
            where = f"{service} address {address} ({flag} or services.{service})"
            status = _serving(addresses, service, address, name, wait_s, timeout_s)
            if status == "SERVICE_UNKNOWN":
                raise InvalidArgumentError(
                    f"{where}: the server there does not serve {name}; probably another service listens on that "
                    "port (are two addresses swapped?). Nothing was changed in the run folder"
                )
            if status != "SERVING":
                raise UnavailableError(
                    f"{where}: no answer within {wait_s:g} s (services.reconnect_timeout_s; last status {status}); "
                    "start the service or correct the address. Nothing was changed in the run folder"
                )


def _serving(
    addresses: Addresses, service: str, address: str, name: str, wait_s: float, timeout_s: float
) -> str:
    """The health status of ``name`` at ``address``: polled every 0.5 s while the server does not answer, for
    at most ``wait_s`` seconds (one line on stderr says so; :func:`marti.rpc.client.health.poll_health`)."""

    def say(status: str) -> None:
        print(f"waiting up to {wait_s:g} s for the {service} at {address} ({status})", file=sys.stderr)

    return poll_health(
        address, name, timeout_s=wait_s, until=("SERVING", "SERVICE_UNKNOWN"), interval_s=0.5,
        check_timeout_s=timeout_s, on_wait=say, token=addresses.token, tls_ca_file=addresses.ca_for(service),
    )  # fmt: skip
