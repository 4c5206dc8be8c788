"""Several env servers behind one client, each session pinned to the server that created it.

* :class:`EnvPool` (sync) and :class:`AsyncEnvPool` (``grpc.aio``, also ``marti.aio.EnvPool``): the calls of
  :class:`~marti.clients.env.EnvClient` (``list_envs``, ``create_session``, ``reset``, ``step``, ``batch_step``,
  ``close_session``) over one :class:`~marti.clients.env.EnvClient` per server; :meth:`EnvPool.stream` (an
  :class:`EnvPoolStream`, one :class:`~marti.clients.env.SessionStream` per server) and :meth:`EnvPool.make`
  (a :class:`~marti.clients.env.RemoteParallelEnv` on the chosen server's channel) place sessions the same way.
* Addresses: a list, a comma-separated string, or ``dns:///name:port`` entries that expand to one server per
  address the name resolves to (:mod:`marti.clients.env.addresses`). ``marti.make(address=...)`` and the
  trainer's ``services.env`` take the same forms.

Placement: a new session goes to the server with the fewest live sessions of this pool (the sessions it
created and has not seen closed or lost, counted across its unary calls, streams and envs); ties go to the
server listed first, so sessions made one after another alternate. A create that fails with
:class:`~marti.errors.UnavailableError` (server away) or :class:`~marti.errors.ResourceExhaustedError` (its
session cap) made no session there: it is tried on the next server in that order, and the failed server is
placed last for a cooldown: :data:`DOWN_COOLDOWN_S` seconds after its first failure, doubling with each failure in
a row up to :data:`MAX_DOWN_COOLDOWN_S`, back to the start once a create succeeds there. Only when every server
failed is the last error raised.

Pinning: every later call for a session (``reset``, ``step``, its part of a ``batch_step``, ``close_session``,
the stream's calls, an env's steps and resets, including the re-created session after a loss) goes to the
server that created it, never elsewhere. A session id the pool did not create (or has seen closed or lost) is a
:class:`~marti.errors.NotFoundError`; ``close_session`` of one returns ``False``.

Errors from a server are the SDK's usual typed errors (:mod:`marti.errors`). Those of the pool's own calls (its
unary calls, an :class:`EnvPoolStream`'s calls, and the create of :meth:`EnvPool.make`) have the message
prefixed with ``env server <address>:`` and the address in ``metadata["env_server"]``; an env that
:meth:`EnvPool.make` returned raises the env's usual errors, without the prefix. A server that is down fails the
calls for its sessions with :class:`~marti.errors.UnavailableError` while the other servers' sessions carry on.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from marti.errors import (
    InvalidArgumentError,
    MartiError,
)
from marti.plumbing.arguments import checked

from .addresses import env_server_entries, is_env_pool, resolve_env_servers, single_env_address
from .placement import T, _common_envs, _place, _PoolBase, name_server
from .pool_stream import EnvPoolStream
from .protocol import EnvSessions
from .remote import RemoteParallelEnv
from .sync_client import EnvClient
from .types import SessionInfo, StepResult


class EnvPool(_PoolBase):
    """Several env servers behind the calls of :class:`~marti.clients.env.EnvClient` (see the module docstring
    for placement, pinning and errors).

    Args:
        addresses: A list of ``host:port``, a comma-separated string, and/or ``dns:///name:port`` entries (one
            server per address ``name`` resolves to, resolved here, once); a single address is a pool of one.
        token: Bearer token; ``None`` reads ``MARTI_ENV_TOKEN``, then ``MARTI_TOKEN``.
        tls_ca_file: CA file for TLS (every server).
        timeout_s: Deadline of each call, seconds.
        deltas: Ask for delta results (see :class:`~marti.clients.env.EnvClient`).
        options: Extra grpc channel arguments for every server's channel.

    Attributes:
        addresses: The servers, in placement order of ties (``dns:///`` entries expanded).
        clients: One :class:`~marti.clients.env.EnvClient` per server, in the same order.

    Raises:
        InvalidArgumentError: An empty or malformed address value (the entry and value named), or a token that
            is not printable ASCII.
        UnavailableError: A ``dns:///`` name that does not resolve.
    """

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        token: str | None = None,
        tls_ca_file: str | None = None,
        timeout_s: float | None = None,
        deltas: bool = True,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.addresses = resolve_env_servers(addresses)
        self.timeout_s = timeout_s
        clients: list[EnvClient] = []
        try:
            for a in self.addresses:
                clients.append(
                    EnvClient(
                        a,
                        token=token,
                        tls_ca_file=tls_ca_file,
                        timeout_s=timeout_s,
                        deltas=deltas,
                        options=options,
                    )
                )
        except BaseException:
            for c in clients:
                c.close()
            raise
        self.clients = tuple(clients)
        self.closed = False
        self._init_routes()

    def _routed(self, session_id: str, fn: Callable[[EnvClient], T]) -> T:
        i = self._routes.server(session_id)
        try:
            return fn(self.clients[i])
        except MartiError as e:
            raise self._routes.failed(session_id, i, e) from None

    def list_envs(self) -> list[dict[str, Any]]:
        """The envs every server offers (by ``env_id``, as the first server describes them, in its order): a
        session of any of them can be created whichever server it is placed on.

        Raises:
            UnavailableError, ...: A server's listing failed (the server is named).
        """
        listings = []
        for a, c in zip(self.addresses, self.clients, strict=True):
            try:
                listings.append(c.list_envs())
            except MartiError as e:
                raise name_server(e, a) from None
        return _common_envs(listings)

    @checked
    def create_session(
        self, env_id: str, config: Mapping[str, Any] | None = None, seed: int | None = None
    ) -> SessionInfo:
        """Create a session on the placed server (see the module docstring) and pin it there.

        Raises:
            NotFoundError, InvalidArgumentError: From the chosen server (named); not tried elsewhere.
            UnavailableError, ResourceExhaustedError: Every server failed (the last one's error, named).
        """
        i, info = _place(
            self._placement, self.addresses, lambda i: self.clients[i].create_session(env_id, config, seed)
        )
        self._routes.add(info.session_id, i)
        return info

    @checked
    def reset(
        self,
        session_id: str,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        request_id: str | None = None,
    ) -> StepResult:
        """Reset a session on its server (see :meth:`EnvClient.reset`).

        Raises:
            NotFoundError: A session the pool did not create (or saw closed or lost).
            SessionLostError: Its server no longer has it (the pool forgets it).
            UnavailableError: Its server is away (named).
        """
        return self._routed(session_id, lambda c: c.reset(session_id, seed, options, request_id))

    @checked(own=("actions",))
    def step(self, session_id: str, actions: Mapping[str, Any], request_id: str | None = None) -> StepResult:
        """Step a session on its server (see :meth:`EnvClient.step`; errors as in :meth:`reset`)."""
        return self._routed(session_id, lambda c: c.step(session_id, actions, request_id))

    @checked(own=("steps",))
    def batch_step(self, steps: Sequence[tuple[str, Mapping[str, Any]]]) -> list[StepResult | MartiError]:
        """Step many sessions: one ``BatchStep`` call per server holding some of them (one after another).

        Returns:
            One entry per step, in request order: a :class:`StepResult`, or the step's own error (named). A
            server whose whole call failed (away, deadline) gives its error in each of its steps' slots; the
            other servers' results are still returned.

        Raises:
            NotFoundError: A session the pool did not create (nothing is sent).
        """
        groups = self._routes.split(steps)
        out: list[Any] = [None] * len(steps)
        for i, idx in groups.items():
            part = [steps[k] for k in idx]
            try:
                results: list[StepResult | MartiError] = self.clients[i].batch_step(part)
            except MartiError as e:
                results = [e] * len(idx)
            self._routes.settle(i, idx, steps, results, out)
        return out

    @checked
    def close_session(self, session_id: str) -> bool:
        """Close a session on its server; True when the server had it. ``False`` for a session the pool does not
        know (never created here, or already closed or lost): nothing is sent.

        Raises:
            UnavailableError: Its server is away (named; the pool forgets the session all the same).
        """
        i = self._routes.drop(session_id)
        if i is None:
            return False
        try:
            return self.clients[i].close_session(session_id)
        except MartiError as e:
            raise name_server(e, self.addresses[i]) from None

    def stream(self) -> EnvPoolStream:
        """Open an :class:`EnvPoolStream`: sessions on per-server bidi streams, placed by this pool."""
        return EnvPoolStream(self)

    @checked
    def make(
        self,
        env_id: str,
        *,
        config: Mapping[str, Any] | None = None,
        seed: int | None = None,
        timeout_s: float | None = None,
        transport: str = "stream",
    ) -> RemoteParallelEnv:
        """A remote PettingZoo env (what ``marti.make(address=<several>)`` returns) whose session is placed by
        this pool and pinned to the chosen server: its steps and resets, and the session it re-creates after a
        loss, go to that server while it answers. When a ``reset`` finds that server unreachable
        (``UNAVAILABLE``), or unreachable or full (``RESOURCE_EXHAUSTED``) for the re-created session of a lost
        one, the env moves: it creates a new session (same env id, config and creation seed) on the best other
        server, as :meth:`create_session` places one, takes its place there, and resets it; the old server goes last for its cooldown. A ``step`` never moves (a lost session
        raises :class:`~marti.errors.SessionLostError`, whose ``reset()`` then moves the env). The env's place
        is freed once, when the env is closed or, if it is dropped unclosed, collected.

        Args:
            env_id: Env id.
            config: Env config.
            seed: Seed of the first reset without a seed.
            timeout_s: Per-call deadline, seconds (default: the pool's).
            transport: ``"stream"`` or ``"unary"`` (see :meth:`RemoteParallelEnv.create`).

        Raises:
            InvalidArgumentError: A bad transport, config key or value (from the server: named).
            NotFoundError: Unknown env id (named server).
            UnavailableError, ResourceExhaustedError: Every server failed (the last one's error, named).
        """
        if transport not in ("stream", "unary"):
            raise InvalidArgumentError(f"transport must be 'stream' or 'unary', got {transport!r}")
        wait = self.timeout_s if timeout_s is None else timeout_s
        i, env = _place(
            self._placement,
            self.addresses,
            lambda i: RemoteParallelEnv.create(
                self.addresses[i],
                env_id,
                config=config,
                seed=seed,
                timeout_s=wait,
                transport=transport,
                channel=self.clients[i].channel,
            ),
        )
        # the place is freed once: by env.close(), or when an env dropped unclosed is collected
        env.on_close = weakref.finalize(env, self._placement.release, i)
        where, env_ref = [i], weakref.ref(env)  # a weak reference: the env stays collectable (see on_close)

        def relocate(err: MartiError) -> None:
            """Move the env to another server after ``err`` (its server unreachable or full): the best other
            server gets a new session and the env's place; if every server fails, the last error is raised."""
            env = env_ref()
            if env is None or env._closed:  # a closed env's place is already free: it must not move
                raise err
            old = where[0]
            name_server(err, self.addresses[old])
            self._placement.avoid(old)
            j, fresh = _place(
                self._placement,
                self.addresses,
                lambda k: RemoteParallelEnv.create(
                    self.addresses[k],
                    env.env_id,
                    config=env._config,
                    seed=env._seed,
                    timeout_s=wait,
                    transport=transport,
                    channel=self.clients[k].channel,
                ),
            )
            env.adopt(fresh)
            env.on_close.detach()
            self._placement.release(old)
            env.on_close = weakref.finalize(env, self._placement.release, j)
            where[0] = j

        env.relocate = relocate
        return env

    def close(self) -> None:
        """Close every server's channel (idempotent); envs and streams made from the pool stop working."""
        if self.closed:
            return
        self.closed = True
        for c in self.clients:
            c.close()

    def __enter__(self) -> EnvPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SHARED: dict[tuple[Any, ...], EnvPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_env_pool(
    addresses: str | Sequence[str], *, token: str | None = None, tls_ca_file: str | None = None
) -> EnvPool:
    """The process's :class:`EnvPool` for an address value, token and CA file (made, and ``dns:///`` names
    resolved, on first use; kept open for the life of the process): what ``marti.make(address=<several>)``
    places its envs with, so that envs made one by one spread over the servers. A forked child gets its own.

    Raises:
        InvalidArgumentError, UnavailableError: As for :class:`EnvPool`.
    """
    key = (os.getpid(), env_server_entries(addresses), token, tls_ca_file)
    with _SHARED_LOCK:
        pool = _SHARED.get(key)
        if pool is None or pool.closed:
            pool = _SHARED[key] = EnvPool(addresses, token=token, tls_ca_file=tls_ca_file)
        return pool


def open_env_sessions(addresses: str | Sequence[str], **kwargs: Any) -> EnvSessions:
    """The session calls of the env service at ``addresses``: an :class:`EnvClient` for one server, an
    :class:`EnvPool` when the value names several (a list, a comma-separated string or ``dns:///`` entries, see
    :mod:`.addresses`). The caller closes it (both are context managers).

    Args:
        addresses: One ``host:port`` or several servers.
        **kwargs: ``token``, ``tls_ca_file``, ``timeout_s``, ``deltas``, ``options`` (as both constructors take).

    Raises:
        InvalidArgumentError: An empty or malformed address value (named), or a bad argument.
        UnavailableError: A ``dns:///`` name that does not resolve.
    """
    if is_env_pool(addresses):
        return EnvPool(addresses, **kwargs)
    return EnvClient(single_env_address(addresses), **kwargs)
