"""That each service address a job was given serves the service it was given for, checked before the run folder
(so that a swapped ``--env`` / ``--store`` port fails at once, before ``--overwrite`` clears the old run).

One standard ``grpc.health.v1`` Check per address, for the service's full name: every marti server registers a
health status per service it hosts, and answers NOT_FOUND (``SERVICE_UNKNOWN``) for one it does not host.
"""

from __future__ import annotations

from marti.errors import InvalidArgumentError
from marti.rpc.health import check_health
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


def check_given_services(addresses: Addresses, given: tuple[str, ...], *, timeout_s: float = 5.0) -> None:
    """Refuse a given address whose server does not host the service it was given for.

    Args:
        addresses: The job's addresses (:func:`~services.trainer.job.connections.addresses.resolve_addresses`).
        given: The services whose address was given (not started by the job), of ``"broker"``, ``"env"``,
            ``"store"``.
        timeout_s: Deadline of each health check, seconds. A server that does not answer in time (down, still
            starting) is not refused here: the job's own connection retries decide.

    Raises:
        InvalidArgumentError: A server answers that it does not host the service (``SERVICE_UNKNOWN``); the
            message names the service, its flag, the address and what to check.
    """
    for service in given:
        name, flag = SERVICE_NAMES[service]
        for address in _entries(addresses, service):
            status = check_health(
                address,
                name,
                timeout_s=timeout_s,
                token=addresses.token,
                tls_ca_file=addresses.ca_for(service),
            )
            if status == "SERVICE_UNKNOWN":
                raise InvalidArgumentError(
                    f"{service} address {address} ({flag} or services.{service}): the server there does not serve "
                    f"{name}; probably another service listens on that port (are two addresses swapped?). "
                    "Nothing was changed in the run folder"
                )
