"""A job's connections to the services: long-lived channels, the env pool, and the clients made on them.

:class:`Connections` opens one channel to the env server and one to the broker on first use and shares them with
every env session and comm client of every episode (rollout and evaluation threads alike) until :meth:`close`;
a service restart does not need a new one (every SDK channel redials within about 2.4 s,
:func:`marti.rpc.options.reconnect_options`). When ``services.env`` names several env servers, one
:class:`~marti.clients.env.EnvPool` places every env instead. A phase that outlives a restart is re-run by
:mod:`services.trainer.job.connections.reconnect`; the addresses and token come from :mod:`services.trainer.job.connections.addresses`.
"""

from __future__ import annotations

import threading
from typing import Any

from marti.team.workflow import is_import_path, make_custom_env
from services.trainer.job.connections.addresses import Addresses


class Connections:
    """The channels, env pool and clients of one job (thread-safe; :meth:`close` is idempotent and a later use
    opens new ones).

    Args:
        addresses: Broker, env server(s) and store addresses, the bearer token and the TLS CAs.
    """

    def __init__(self, addresses: Addresses) -> None:
        self.addr = addresses
        self._channels: dict[str, Any] = {}  # "env" / "broker" -> channel, while open
        self._env_pool: Any = None  # the EnvPool of several env servers, while open
        self._lock = threading.Lock()

    def env(self, env_name: str, seed: int, config: dict[str, Any]) -> Any:
        """A registered env on env_server (a session on the env channel, or placed by the env pool when
        ``services.env`` names several servers; in this process when the job has no env server address), or a
        custom env by import path built in this process.

        Args:
            env_name: A registered env name, or ``module:attr`` / ``file.py:attr`` of a custom env.
            seed: The episode's seed.
            config: The env's config (:func:`services.trainer.rollout.episodes.env_config.env_config`).
        """
        if is_import_path(env_name):
            return make_custom_env(env_name, config, seed)
        pool = self.pool()
        if pool is not None:
            return pool.make(env_name, seed=seed, config=config)
        # config as a mapping, not keywords: an env option named like one of marti.make's own arguments
        # (seed, address, token, timeout_s, ...) reaches the env, which refuses a key it does not have
        channel = self.channel("env")
        if channel is None:  # no env server: an env in this process
            from marti.env.registry import default_registry

            return default_registry().make(env_name, config, seed)
        from marti.clients.env import RemoteParallelEnv

        return RemoteParallelEnv.create(
            self.addr.env,
            env_name,
            config=config,
            seed=seed,
            token=self.addr.token,
            channel=channel,
        )

    def comm(self, agent: str, session: str) -> Any:
        """An agent's comm client for an episode, on the broker channel. Its messages are buffered until the
        runner's ``flush`` after each reply, so a reply to the whole team is one Send round trip."""
        from marti.clients.broker import MartiCommClient

        return MartiCommClient(
            agent,
            self.addr.broker,
            session=session,
            token=self.addr.token,
            channel=self.channel("broker"),
            batching_size=64,
            update_frequency_s=0.0,
        )

    def store_client(self) -> Any:
        """A new experience_store client (token and TLS from :class:`Addresses`); the caller closes it."""
        from marti.clients.experience import ExperienceSharingClient

        return ExperienceSharingClient(
            "trainer", self.addr.store, token=self.addr.token, tls_ca_file=self.addr.ca_for("store")
        )

    def channel(self, service: str) -> Any:
        """The channel to ``service`` (``"env"`` or ``"broker"``), opened on first use and shared until
        :meth:`close`. None when the service has no address (in-process envs)."""
        from marti.clients.env.addresses import single_env_address

        address = single_env_address(self.addr.env) if service == "env" else self.addr.broker
        if address is None:
            return None
        with self._lock:
            channel = self._channels.get(service)
            if channel is None:
                if service == "env":
                    from marti.clients.env import open_channel
                else:
                    from marti.clients.broker import open_channel
                channel = open_channel(
                    address,
                    token=self.addr.token,
                    tls_ca_file=self.addr.ca_for(service),
                )
                self._channels[service] = channel
            return channel

    def pool(self) -> Any:
        """The :class:`~marti.clients.env.EnvPool` when ``env`` names several servers (opened on first use with
        the job's token and CA, shared like :meth:`channel`'s channels until :meth:`close`); None for one
        address or in-process envs."""
        from marti.clients.env.addresses import is_env_pool

        if not is_env_pool(self.addr.env):
            return None
        with self._lock:
            if self._env_pool is None:
                from marti.clients.env import EnvPool

                self._env_pool = EnvPool(
                    self.addr.env,
                    token=self.addr.token,
                    tls_ca_file=self.addr.ca_for("env"),
                )
            return self._env_pool

    def close(self) -> None:
        """Close the channels and the env pool (idempotent; a later use opens new ones). Call it when the job
        ends, after the last episode's sessions are closed."""
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
            pool, self._env_pool = self._env_pool, None
        for channel in channels:
            channel.close()
        if pool is not None:
            pool.close()
