"""The multi-agent environment interface of marti and :func:`make`.

Every marti environment is a PettingZoo ``ParallelEnv``: ``agents``, ``possible_agents``,
``observation_space(agent)``, ``action_space(agent)``, ``reset(seed=None, options=None) -> (observations, infos)``,
``step(actions) -> (observations, rewards, terminations, truncations, infos)`` and ``close()``. Text environments
use ``gymnasium.spaces.Text`` spaces; their infos say whose turn it is (``is_acting``, ``acting_agent``), and agents
that are not acting may send ``""`` or nothing.

``make(env_id, address=None, ...)`` returns the environment in-process; with ``address="host:port"`` it returns a
remote session on an env server that behaves the same way (same observations, rewards and errors for the same
seed and actions). See ``docs/environments.md``.
"""

from __future__ import annotations

from typing import Any

from pettingzoo import ParallelEnv

__all__ = ["ParallelEnv", "list_envs", "make"]


def make(
    env_id: str,
    *,
    address: str | None = None,
    seed: int | None = None,
    token: str | None = None,
    tls_ca_file: str | None = None,
    timeout_s: float | None = None,
    transport: str = "stream",
    **config: Any,
) -> ParallelEnv:
    """Create an environment.

    Args:
        env_id: Registered id, ``name-vN`` or bare ``name`` (highest version), e.g.
            ``"collaborative_task_solving"``.
        address: ``None`` for an in-process env; ``"host:port"`` of an env server for a remote session.
        seed: Seed of the first ``reset()`` called without a seed (same id, config, seed and actions give the
            same trajectory).
        token: Bearer token for the server (remote only).
        tls_ca_file: CA certificate file for TLS (remote only).
        timeout_s: Per-call deadline in seconds (remote only; default ``marti.rpc.channel.DEFAULT_TIMEOUT_S``).
        transport: Remote only: ``"stream"`` (a bidi stream; the session closes when the env or process goes
            away) or ``"unary"`` (one rpc per call; the server reaps the session after its idle timeout).
        **config: Env config, e.g. ``scenario="resource_allocation", max_turns=12, reward_type="dense",
            observation_format="natural_language", difficulty="easy", num_agents=3``.

    Returns:
        A PettingZoo ``ParallelEnv``. Call ``reset`` before ``step``.

    Raises:
        marti.errors.NotFoundError: Unknown env id.
        marti.errors.InvalidArgumentError: Unknown config key (named) or bad value.
        marti.errors.UnavailableError: The server cannot be reached (remote only).
    """
    if address is None:
        from services.env_server.core.registry import default_registry

        return default_registry().make(env_id, config, seed)
    from marti.clients.env import RemoteParallelEnv

    return RemoteParallelEnv.create(
        address,
        env_id,
        config=config,
        seed=seed,
        token=token,
        tls_ca_file=tls_ca_file,
        timeout_s=timeout_s,
        transport=transport,
    )


def list_envs(address: str | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """List registered envs (id, description, config schema, agents and roles of the default config).

    Args:
        address: ``None`` for the in-process registry, else an env server's ``"host:port"``.
        **kwargs: Passed to :class:`marti.clients.env.EnvClient` (token, tls_ca_file, timeout_s).

    Returns:
        One dict per env id (see ``services.env_server.core.describe.describe_spec`` for the keys).
    """
    if address is None:
        from services.env_server.core.describe import describe_all

        return describe_all()
    from marti.clients.env import EnvClient

    with EnvClient(address, **kwargs) as client:
        return client.list_envs()
