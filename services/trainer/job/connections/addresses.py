"""Where a job's services are and how it authenticates: :class:`Addresses` and its one resolver.

Every entry point resolves the broker, env server and store addresses and the bearer token through
:func:`resolve_addresses`: ``marti train`` / ``marti eval`` (flags over the config's ``services`` section, then an
embedded stack for the services with neither, :func:`services.trainer.job.cli.train_cli.service_addresses`) and the
trainer service (its ``MARTI_TRAINER_*`` settings, :mod:`services.trainer.__main__`).
"""

from __future__ import annotations

from dataclasses import dataclass

from marti.clients.env.addresses import is_env_pool
from marti.config import ServicesConfig

SERVICES = ("broker", "env", "store")
"""The services a job talks to, in the order :class:`Addresses` names them."""


@dataclass
class Addresses:
    """Service addresses the loop talks to (``host:port``), the bearer token, and TLS.

    ``env`` may name several env servers (a list, a comma-separated string, ``dns:///name:port``): the loop then
    plays its sessions through one :class:`~marti.clients.env.EnvPool` (each new session on the server with
    the fewest live sessions of the job, pinned there); a single address is one channel, as ever.

    ``token`` is sent to every service; None lets each client read ``MARTI_<SERVICE>_TOKEN``, then
    ``MARTI_TOKEN`` (:func:`marti.rpc.client.channel.resolve_token`).

    ``tls_ca_file`` (PEM) is used for the services named in ``tls_services`` (those whose address the user
    gave: ``services.tls_ca_file`` with ``marti train``); the others, e.g. an embedded stack, are plaintext.
    """

    broker: str
    env: str | list[str]
    store: str
    token: str | None = None
    tls_ca_file: str | None = None
    tls_services: frozenset[str] = frozenset()

    def ca_for(self, service: str) -> str | None:
        """The CA file for ``service`` (``"broker"``, ``"env"`` or ``"store"``); None: plaintext."""
        return self.tls_ca_file if service in self.tls_services else None


def resolve_addresses(
    section: ServicesConfig | None = None,
    *,
    broker: str | None = None,
    env: str | list[str] | None = None,
    store: str | None = None,
    token: str | None = None,
) -> tuple[Addresses, tuple[str, ...]]:
    """The job's addresses and token: each given value (a flag, a service setting) over the config's
    ``services`` section.

    Args:
        section: The config's ``services`` section; None: an empty one.
        broker: ``host:port`` of the comm broker, or None.
        env: The env server(s) (one ``host:port``, several comma-separated or as a list, ``dns:///name:port``).
        store: ``host:port`` of the experience store, or None.
        token: Bearer token sent to every service, or None (then ``services.token``).

    Returns:
        ``(addresses, missing)``: ``missing`` names the services (of :data:`SERVICES`) with no address from
        either side, whose address is ``""`` in ``addresses`` (a caller starts them, or leaves them unused);
        ``services.tls_ca_file`` applies to the others.

    Raises:
        InvalidArgumentError: several env servers and an entry is not ``host:port`` (named).
    """
    section = section or ServicesConfig()
    given = {"broker": broker, "env": env, "store": store}
    found = {name: given[name] or getattr(section, name) or "" for name in SERVICES}
    is_env_pool(found["env"])
    missing = tuple(name for name in SERVICES if not found[name])
    addresses = Addresses(
        found["broker"],
        found["env"],
        found["store"],
        token or section.token,
        tls_ca_file=section.tls_ca_file,
        tls_services=frozenset(name for name in SERVICES if name not in missing),
    )
    return addresses, missing


def with_started(addresses: Addresses, started: dict[str, str]) -> Addresses:
    """``addresses`` with the services of ``started`` (name -> ``host:port`` of an embedded service, plaintext)
    filled in."""
    values = {name: started.get(name, getattr(addresses, name)) for name in SERVICES}
    return Addresses(
        **values,
        token=addresses.token,
        tls_ca_file=addresses.tls_ca_file,
        tls_services=addresses.tls_services - set(started),
    )
