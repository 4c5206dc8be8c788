"""The multi-agent environment interface of marti and :func:`make`.

Every marti environment is a PettingZoo ``ParallelEnv``: ``agents``, ``possible_agents``,
``observation_space(agent)``, ``action_space(agent)``, ``reset(seed=None, options=None) -> (observations, infos)``,
``step(actions) -> (observations, rewards, terminations, truncations, infos)`` and ``close()``. Text environments
use ``gymnasium.spaces.Text`` spaces; their infos say whose turn it is (``is_acting``, ``acting_agent``), and agents
that are not acting may send ``""`` or nothing.

``make(env_id, address=None, ...)`` returns the environment in-process; with ``address="host:port"`` it returns a
remote session on an env server that behaves the same way (same observations, rewards and errors for the same
seed and actions). Several servers (a list, ``"h1:p,h2:p"`` or ``"dns:///name:p"``) spread the envs made in a
process over them, each session pinned to its server (:mod:`marti.clients.env`). A caller that makes many remote envs passes one long-lived channel (``channel=``, from
:func:`marti.clients.env.open_channel`) instead of dialing the server for each, and steps envs in lockstep with
:func:`step_many` (one ``BatchStep`` round trip for the remote sessions that share a channel). See
``docs/environments.md``.

An env declares the episode metrics it reports as ``metadata["metrics"]``: names of info keys whose value after
the last step measures the episode (``("task_completion", "team_score")``); :func:`declared_metrics` reads them
for local and remote envs alike, and the trainer aggregates exactly those.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pettingzoo import ParallelEnv

from marti.env.guard import declared_metrics
from marti.plumbing.arguments import checked

if TYPE_CHECKING:
    import grpc

__all__ = ["ParallelEnv", "declared_metrics", "list_envs", "make", "step_many"]


@checked(own=("timeout_s",))
def make(
    env_id: str,
    *,
    address: str | Sequence[str] | None = None,
    seed: int | None = None,
    token: str | None = None,
    tls_ca_file: str | None = None,
    timeout_s: float | None = None,
    transport: str = "stream",
    channel: grpc.Channel | None = None,
    **config: Any,
) -> ParallelEnv:
    """Create an environment.

    Args:
        env_id: Registered id, ``name-vN`` or bare ``name`` (highest version), e.g.
            ``"collaborative_task_solving"``.
        address: ``None`` for an in-process env; ``"host:port"`` of an env server for a remote session; several
            servers (a list, a comma-separated string, or ``"dns:///name:port"`` for one server per address the
            name resolves to) for a session placed on the server where this process's shared pool
            (:func:`marti.clients.env.shared_env_pool`) has the fewest live sessions, and pinned there.
        seed: Seed of the first ``reset()`` called without a seed (same id, config, seed and actions give the
            same trajectory); an int in the int64 range.
        token: Bearer token for the server (remote only); ``None`` reads ``MARTI_ENV_TOKEN``, then
            ``MARTI_TOKEN``; ``""`` sends none.
        tls_ca_file: CA certificate file for TLS (remote only).
        timeout_s: Per-call deadline in seconds (remote only; default ``marti.rpc.client.channel.DEFAULT_TIMEOUT_S``).
        transport: Remote only: ``"stream"`` (a bidi stream; the session closes when the env or process goes
            away) or ``"unary"`` (one rpc per call). On both the server reaps a session unused for its idle
            timeout (the next ``step`` raises ``SessionLostError``; ``reset`` starts a new session).
        channel: Remote only: an open ``grpc.Channel`` to the env server (e.g. from
            :func:`marti.clients.env.open_channel`) to create the session on instead of dialing ``address``;
            ``token`` and ``tls_ca_file`` are then the channel's business and ignored. The env does not close
            it: one channel serves any number of envs, and its owner closes it after them. With a channel,
            ``address`` may be None (it is then only a label); it may not name several servers.
        **config: Env config, e.g. ``scenario="resource_allocation", max_turns=12, reward_type="dense",
            observation_format="natural_language", difficulty="easy", num_agents=3``.

    Returns:
        A PettingZoo ``ParallelEnv``. Call ``reset`` before ``step``.

    Raises:
        marti.errors.NotFoundError: Unknown env id.
        marti.errors.InvalidArgumentError: Unknown config key (named) or bad value; an ``env_id`` that is not
            a string, a ``seed`` that is not an int64, an argument of the wrong type (named); a token that is
            not printable ASCII (before any rpc); an empty or malformed multi-server address (named); several
            servers with ``channel``.
        marti.errors.UnavailableError: The server cannot be reached (remote only); with several servers, none
            of them could create the session (the last one named), or a ``dns:///`` name does not resolve.
    """
    from marti.rpc.client.channel import check_timeout_s

    check_timeout_s(timeout_s)  # the remote clients' own rule, for a local env too
    if address is None and channel is None:
        from marti.env.registry import default_registry

        return default_registry().make(env_id, config, seed)
    from marti.clients.env import RemoteParallelEnv
    from marti.clients.env.addresses import is_env_pool, single_env_address

    if is_env_pool(address):
        from marti.clients.env import shared_env_pool
        from marti.errors import InvalidArgumentError

        if channel is not None:
            raise InvalidArgumentError(
                f"channel= names one env server, but address={address!r} names several: leave channel out"
            )
        pool = shared_env_pool(address, token=token, tls_ca_file=tls_ca_file)
        return pool.make(env_id, config=config, seed=seed, timeout_s=timeout_s, transport=transport)
    return RemoteParallelEnv.create(
        single_env_address(address),
        env_id,
        config=config,
        seed=seed,
        token=token,
        tls_ca_file=tls_ca_file,
        timeout_s=timeout_s,
        transport=transport,
        channel=channel,
    )


#: What :func:`step_many` returns per env: its step tuple, or (with ``errors="return"``) the error of its step.
StepOutcome = tuple[dict, dict, dict, dict, dict]


def step_many(
    envs: Sequence[ParallelEnv], actions: Sequence[Mapping[str, Any]], *, errors: str = "raise"
) -> list[Any]:
    """Step several envs once each, with the fewest round trips.

    Remote envs (``marti.make(address=...)``) whose sessions share one channel are stepped together in one
    ``BatchStep`` call per channel (see :meth:`marti.clients.env.RemoteParallelEnv.step_batch`); any other env
    (local, custom, or alone on its channel) is stepped with its own ``step``. Every env is stepped once, even
    when another env's step fails; each ends in the same state, and gives the same tuple, as after
    ``env.step(action)`` (an env whose step failed is left as it was, as after a failed ``env.step``; after a
    ``DeadlineExceededError`` the server may or may not have stepped it, as for ``env.step``).

    Args:
        envs: The envs, each at most once.
        actions: One action dict per env (same length as ``envs``).
        errors: ``"raise"`` (default): raise the first failed step's error; ``"return"``: put each failed
            step's :class:`~marti.errors.MartiError` in its env's place in the returned list.

    Returns:
        Per env, in order, its PettingZoo ``(observations, rewards, terminations, truncations, infos)``, or with
        ``errors="return"`` the error of its failed step.

    Raises:
        InvalidArgumentError: ``envs`` is not a list of envs (the bad one named), ``actions`` not a list
            of the same length, or ``errors`` not one of the two.
        MartiError: ``errors="raise"``: the first failed step's error, in env order, raised after every env
            was stepped. It says which envs moved: ``error.step_results`` is the list ``errors="return"``
            gives (the step tuples of the envs that moved, the errors of those that did not) and
            ``error.failed_index`` the index of the env whose error it is; a note on the error lists them.
    """
    from marti.clients.env import check_env_list
    from marti.errors import InvalidArgumentError, MartiError

    if errors not in ("raise", "return"):
        raise InvalidArgumentError(f"errors must be 'raise' or 'return', got {errors!r}")
    check_env_list(envs, actions)
    out = _step_all(envs, actions)
    failed = [i for i, r in enumerate(out) if isinstance(r, MartiError)]
    if failed and errors == "raise":
        err = out[failed[0]]
        err.step_results, err.failed_index = out, failed[0]
        moved = [i for i, r in enumerate(out) if not isinstance(r, MartiError)]
        err.add_note(
            f"step_many: envs {moved} stepped, envs {failed} failed (error.step_results holds every outcome)"
        )
        raise err
    return out


def _step_all(envs: Sequence[ParallelEnv], actions: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Step every env once (batched per shared channel); a failed step's ``MartiError`` takes its place."""
    from marti.clients.env import RemoteParallelEnv
    from marti.errors import MartiError

    groups: dict[int, list[int]] = {}
    for i, env in enumerate(envs):
        if isinstance(env, RemoteParallelEnv):
            groups.setdefault(id(env.client.channel.inner), []).append(i)
    out: list[Any] = [None] * len(envs)
    for idx in groups.values():
        if len(idx) > 1:
            try:
                done = RemoteParallelEnv.step_batch([envs[i] for i in idx], [actions[i] for i in idx])
            except MartiError as e:  # the whole call failed (server away, deadline): each env's own outcome
                done = [e] * len(idx)
            for i, r in zip(idx, done, strict=True):
                out[i] = r
    for i, env in enumerate(envs):
        if out[i] is None:
            try:
                out[i] = env.step(actions[i])
            except MartiError as e:
                out[i] = e
    return out


def list_envs(address: str | Sequence[str] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """List registered envs (id, description, config schema, agents and roles of the default config).

    Args:
        address: ``None`` for the in-process registry, else an env server's ``"host:port"``, or several servers
            (as for :func:`make`): then the envs every one of them offers
            (:meth:`marti.clients.env.EnvPool.list_envs`).
        **kwargs: Passed to :class:`marti.clients.env.EnvClient` (token, tls_ca_file, timeout_s).

    Returns:
        One dict per env id (see :func:`marti.env.registry.describe_spec` for the keys).

    Raises:
        marti.errors.InvalidArgumentError: An empty or malformed multi-server address (named).
        marti.errors.UnavailableError: A server cannot be reached (named when there are several).
    """
    if address is None:
        from marti.env.registry import describe_all

        return describe_all()
    from marti.clients.env import open_env_sessions

    with open_env_sessions(address, **kwargs) as sessions:  # one server's client, or a pool of several
        return sessions.list_envs()
