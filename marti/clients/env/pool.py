"""Several env servers behind one client, each session pinned to the server that created it.

* :class:`EnvPool` (sync) and :class:`AsyncEnvPool` (``grpc.aio``, also ``marti.aio.EnvPool``): the calls of
  :class:`~marti.clients.env.EnvClient` (``list_envs``, ``create_session``, ``reset``, ``step``, ``batch_step``,
  ``close_session``) over one :class:`~marti.clients.env.EnvClient` per server; :meth:`EnvPool.stream` (an
  :class:`EnvPoolStream`, one :class:`~marti.clients.env.SessionStream` per server) and :meth:`EnvPool.make`
  (a :class:`~marti.clients.env.RemoteParallelEnv` on the chosen server's channel) place sessions the same way.
* Addresses: a list, a comma-separated string, or ``dns:///name:port`` entries that expand to one server per
  address the name resolves to (:mod:`marti.clients.env_addresses`). ``marti.make(address=...)`` and the
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

import asyncio
import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from marti.arguments import checked
from marti.clients.env import (
    AsyncEnvClient,
    EnvClient,
    RemoteParallelEnv,
    SessionInfo,
    SessionStream,
    StepResult,
)
from marti.clients.env_addresses import env_server_entries, resolve_env_servers
from marti.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    MartiError,
    NotFoundError,
    ResourceExhaustedError,
    SessionLostError,
    UnavailableError,
)

__all__ = [
    "DOWN_COOLDOWN_S",
    "MAX_DOWN_COOLDOWN_S",
    "AsyncEnvPool",
    "EnvPool",
    "EnvPoolStream",
    "name_server",
    "shared_env_pool",
]

T = TypeVar("T")

#: Seconds a server whose create failed (away, or at its session cap) is placed after every other server; each
#: further failure in a row doubles it (a server that stays down costs one slow create per cooldown).
DOWN_COOLDOWN_S = 5.0
#: The longest cooldown, seconds.
MAX_DOWN_COOLDOWN_S = 60.0
#: Errors of a create that made no session, so the next server may be tried.
_NEXT_SERVER = (UnavailableError, ResourceExhaustedError)


def name_server(err: MartiError, address: str) -> MartiError:
    """Name the env server an error came from: prefix the message with ``env server <address>:`` and set
    ``metadata["env_server"]`` (once; the error keeps its class). Returns ``err``."""
    if "env_server" not in err.metadata:
        err.metadata["env_server"] = address
        err.message = f"env server {address}: {err.message}"
        err.args = (err.message,)
    return err


class _Placement:
    """Live sessions per server of one pool, and which servers failed a create lately (thread-safe)."""

    def __init__(self, n: int) -> None:
        self._live = [0] * n
        self._avoid_until = [0.0] * n
        self._failures = [0] * n  # creates failed in a row per server
        self._lock = threading.Lock()

    def live(self) -> list[int]:
        with self._lock:
            return list(self._live)

    def take(self, tried: set[int]) -> int | None:
        """Reserve the best server not in ``tried`` (fewest live sessions, recently failed ones last, then the
        first listed): its count goes up at once, so concurrent creates spread too. None: all tried."""
        now = time.monotonic()
        with self._lock:
            left = [i for i in range(len(self._live)) if i not in tried]
            if not left:
                return None
            i = min(left, key=lambda k: (self._avoid_until[k] > now, self._live[k], k))
            self._live[i] += 1
            return i

    def release(self, i: int) -> None:
        with self._lock:
            self._live[i] = max(0, self._live[i] - 1)

    def avoid(self, i: int) -> float:
        """Place server ``i`` last for its cooldown (``DOWN_COOLDOWN_S`` doubled per earlier failure in a row, at
        most ``MAX_DOWN_COOLDOWN_S``). Returns the cooldown in seconds."""
        with self._lock:
            self._failures[i] += 1
            cooldown = min(DOWN_COOLDOWN_S * 2 ** min(self._failures[i] - 1, 30), MAX_DOWN_COOLDOWN_S)
            self._avoid_until[i] = time.monotonic() + cooldown
            return cooldown

    def created(self, i: int) -> None:
        """A create succeeded on server ``i``: its next failure starts the cooldown over."""
        with self._lock:
            self._failures[i] = 0


class _Tries:
    """The servers a new session may be created on, best first, each reserved while it is tried."""

    def __init__(self, placement: _Placement, addresses: Sequence[str]) -> None:
        self._placement = placement
        self._addresses = addresses
        self._tried: set[int] = set()
        self.last: MartiError | None = None

    def __iter__(self) -> Iterator[int]:
        while (i := self._placement.take(self._tried)) is not None:
            self._tried.add(i)
            yield i

    def succeeded(self, i: int) -> None:
        """The create on server ``i`` made a session (its place stays taken; its failures in a row end)."""
        self._placement.created(i)

    def failed(self, i: int, err: BaseException) -> bool:
        """Undo server ``i``'s reservation; True when the next server may be tried (``err`` is kept as the
        last error), False when ``err`` must be raised (it is named first when a :class:`MartiError`)."""
        self._placement.release(i)
        if not isinstance(err, MartiError):
            return False
        name_server(err, self._addresses[i])
        if isinstance(err, _NEXT_SERVER):
            self._placement.avoid(i)
            self.last = err
            return True
        return False


class _Routes:
    """Which server each session of one owner (a pool's unary calls, one stream) lives on (thread-safe)."""

    def __init__(self, placement: _Placement, addresses: Sequence[str]) -> None:
        self._placement = placement
        self._addresses = addresses
        self._where: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, session_id: str, i: int) -> None:
        with self._lock:
            self._where[session_id] = i

    def server(self, session_id: str) -> int:
        i = self._where.get(session_id)
        if i is None:
            raise NotFoundError(
                f"session {session_id!r} was not created by this env pool, or was closed or lost: the pool "
                "routes only the sessions it created, each to the env server that created it",
                metadata={"session_id": session_id},
            )
        return i

    def drop(self, session_id: str) -> int | None:
        """Forget a session (closed or lost) and free its place; its server, or None when unknown."""
        with self._lock:
            i = self._where.pop(session_id, None)
        if i is not None:
            self._placement.release(i)
        return i

    def drop_all(self) -> None:
        with self._lock:
            gone, self._where = list(self._where.values()), {}
        for i in gone:
            self._placement.release(i)

    def sessions(self) -> dict[str, str]:
        with self._lock:
            return {s: self._addresses[i] for s, i in self._where.items()}

    def failed(self, session_id: str, i: int, err: MartiError) -> MartiError:
        """Name the server of a failed call; a lost session is forgotten. Returns ``err``."""
        if isinstance(err, SessionLostError):
            self.drop(session_id)
        return name_server(err, self._addresses[i])

    def split(self, steps: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[int, list[int]]:
        """Server -> the indexes of its steps, in request order (every session checked before any is sent)."""
        groups: dict[int, list[int]] = {}
        for k, (session_id, _) in enumerate(steps):
            groups.setdefault(self.server(session_id), []).append(k)
        return groups

    def settle(
        self,
        i: int,
        idx: list[int],
        steps: Sequence[tuple[str, Mapping[str, Any]]],
        results: Sequence[StepResult | MartiError],
        out: list[Any],
    ) -> None:
        """Put server ``i``'s batch results in their request slots (errors named, lost sessions forgotten)."""
        for k, r in zip(idx, results, strict=True):
            out[k] = self.failed(steps[k][0], i, r) if isinstance(r, MartiError) else r


def _common_envs(listings: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The envs every server offers (by ``env_id``), as the first server describes them, in its order."""
    ids = set.intersection(*({e["env_id"] for e in listing} for listing in listings))
    return [e for e in listings[0] if e["env_id"] in ids]


def _place(placement: _Placement, addresses: Sequence[str], create: Callable[[int], T]) -> tuple[int, T]:
    """Create on the best server, falling over to the next one while creates fail with UNAVAILABLE or
    RESOURCE_EXHAUSTED; returns ``(server, what create returned)`` with the server's place still taken."""
    tries = _Tries(placement, addresses)
    for i in tries:
        try:
            made = create(i)
        except BaseException as e:
            if not tries.failed(i, e):
                raise
        else:
            tries.succeeded(i)
            return i, made
    assert tries.last is not None
    raise tries.last


class _PoolBase:
    """What the sync and async pools share: the servers, their placement, and the unary calls' routes."""

    addresses: tuple[str, ...]

    def _init_routes(self) -> None:
        self._placement = _Placement(len(self.addresses))
        self._routes = _Routes(self._placement, self.addresses)

    @checked
    def server_of(self, session_id: str) -> str:
        """The address of the server a session (made by this pool's ``create_session``) lives on.

        Raises:
            NotFoundError: The pool did not create the session, or has seen it closed or lost.
        """
        return self.addresses[self._routes.server(session_id)]

    def live_sessions(self) -> dict[str, int]:
        """Address -> live sessions of this pool on that server (unary, stream and env sessions together)."""
        return dict(zip(self.addresses, self._placement.live(), strict=True))


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

    @checked
    def step(self, session_id: str, actions: Mapping[str, Any], request_id: str | None = None) -> StepResult:
        """Step a session on its server (see :meth:`EnvClient.step`; errors as in :meth:`reset`)."""
        return self._routed(session_id, lambda c: c.step(session_id, actions, request_id))

    @checked
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


class EnvPoolStream:
    """Sessions on bidi streams of a pool's servers (one :class:`~marti.clients.env.SessionStream` per server,
    opened on first use), placed by the pool like its other sessions and pinned to their server's stream.

    Each call behaves as on a :class:`~marti.clients.env.SessionStream` (errors raised per request, named with
    the server); a session the stream did not create is a :class:`~marti.errors.NotFoundError`. Closing the
    stream closes every server's stream, and with them their sessions.

    Args:
        pool: The pool.
    """

    def __init__(self, pool: EnvPool) -> None:
        self.pool = pool
        self._streams: dict[int, SessionStream] = {}
        self._routes = _Routes(pool._placement, pool.addresses)
        self._lock = threading.Lock()
        self.closed = False

    def _closed_error(self) -> FailedPreconditionError:
        return FailedPreconditionError(
            "this env pool stream is closed: open a new one with EnvPool.stream()",
            metadata={"env_servers": ",".join(self.pool.addresses)},
        )

    def _stream(self, i: int) -> SessionStream:
        with self._lock:
            if self.closed:
                raise self._closed_error()
            s = self._streams.get(i)
            if s is None:
                s = self._streams[i] = self.pool.clients[i].stream()
            return s

    def _routed(self, session_id: str, fn: Callable[[SessionStream], T]) -> T:
        i = self._routes.server(session_id)
        try:
            return fn(self._stream(i))
        except MartiError as e:
            raise self._routes.failed(session_id, i, e) from None

    @checked
    def create_session(
        self, env_id: str, config: Mapping[str, Any] | None = None, seed: int | None = None
    ) -> SessionInfo:
        """Create a session on the placed server's stream (see :meth:`EnvPool.create_session`).

        Raises:
            FailedPreconditionError: The stream is closed (also when it was closed while this create was in
                flight: the session it made is closed at once).
        """
        if self.closed:
            raise self._closed_error()
        streams: dict[int, SessionStream] = {}

        def create(i: int) -> SessionInfo:
            streams[i] = self._stream(i)
            return streams[i].create_session(env_id, config, seed)

        i, info = _place(self.pool._placement, self.pool.addresses, create)
        with self._lock:  # atomic with close(): either close() drops this route, or this sees it closed
            if not self.closed:
                self._routes.add(info.session_id, i)
                return info
        self.pool._placement.release(i)
        with contextlib.suppress(MartiError):
            streams[i].close_session(info.session_id)
        raise self._closed_error()

    @checked
    def reset(
        self, session_id: str, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> StepResult:
        """Reset a session on its server's stream (errors as in :meth:`EnvPool.reset`)."""
        return self._routed(session_id, lambda s: s.reset(session_id, seed, options))

    @checked
    def step(self, session_id: str, actions: Mapping[str, Any], request_id: str | None = None) -> StepResult:
        """Step a session on its server's stream (errors as in :meth:`EnvPool.reset`)."""
        return self._routed(session_id, lambda s: s.step(session_id, actions, request_id))

    @checked
    def batch_step(self, steps: Sequence[tuple[str, Mapping[str, Any]]]) -> list[StepResult | MartiError]:
        """One batch request per server's stream; results in request order (as :meth:`EnvPool.batch_step`)."""
        groups = self._routes.split(steps)
        out: list[Any] = [None] * len(steps)
        for i, idx in groups.items():
            part = [steps[k] for k in idx]
            try:
                results: list[StepResult | MartiError] = self._stream(i).batch_step(part)
            except MartiError as e:
                results = [e] * len(idx)
            self._routes.settle(i, idx, steps, results, out)
        return out

    @checked
    def close_session(self, session_id: str) -> bool:
        """Close a session on its server's stream; ``False`` for a session this stream does not know."""
        i = self._routes.drop(session_id)
        if i is None:
            return False
        try:
            return self._stream(i).close_session(session_id)
        except MartiError as e:
            raise name_server(e, self.pool.addresses[i]) from None

    def close(self) -> None:
        """End every server's stream (the servers close the sessions made on them); idempotent. Later calls
        are a :class:`~marti.errors.FailedPreconditionError`."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            streams, self._streams = list(self._streams.values()), {}
        for s in streams:
            s.close()
        self._routes.drop_all()

    def __enter__(self) -> EnvPoolStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncEnvPool(_PoolBase):
    """``grpc.aio`` twin of :class:`EnvPool` (same placement, pinning and errors; awaitable calls; no streams
    or envs). ``batch_step`` calls the servers concurrently.

    Args:
        addresses: As for :class:`EnvPool`.
        token: Bearer token; ``None`` reads ``MARTI_ENV_TOKEN``, then ``MARTI_TOKEN``.
        tls_ca_file: CA file for TLS.
        timeout_s: Per-call deadline, seconds.
        deltas: Ask for delta results.

    Raises:
        InvalidArgumentError, UnavailableError: As for :class:`EnvPool`.
    """

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        token: str | None = None,
        tls_ca_file: str | None = None,
        timeout_s: float | None = None,
        deltas: bool = True,
    ) -> None:
        self.addresses = resolve_env_servers(addresses)
        self.clients = tuple(
            AsyncEnvClient(a, token=token, tls_ca_file=tls_ca_file, timeout_s=timeout_s, deltas=deltas)
            for a in self.addresses
        )
        self._init_routes()

    async def _routed(self, session_id: str, fn: Callable[[AsyncEnvClient], Any]) -> Any:
        i = self._routes.server(session_id)
        try:
            return await fn(self.clients[i])
        except MartiError as e:
            raise self._routes.failed(session_id, i, e) from None

    async def list_envs(self) -> list[dict[str, Any]]:
        """See :meth:`EnvPool.list_envs`."""

        async def one(a: str, c: AsyncEnvClient) -> list[dict[str, Any]]:
            try:
                return await c.list_envs()
            except MartiError as e:
                raise name_server(e, a) from None

        listings = await asyncio.gather(
            *(one(a, c) for a, c in zip(self.addresses, self.clients, strict=True))
        )
        return _common_envs(listings)

    @checked
    async def create_session(
        self, env_id: str, config: Mapping[str, Any] | None = None, seed: int | None = None
    ) -> SessionInfo:
        """See :meth:`EnvPool.create_session`."""
        tries = _Tries(self._placement, self.addresses)
        for i in tries:
            try:
                info = await self.clients[i].create_session(env_id, config, seed)
            except BaseException as e:
                if not tries.failed(i, e):
                    raise
                continue
            tries.succeeded(i)
            self._routes.add(info.session_id, i)
            return info
        assert tries.last is not None
        raise tries.last

    @checked
    async def reset(
        self,
        session_id: str,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        request_id: str | None = None,
    ) -> StepResult:
        """See :meth:`EnvPool.reset`."""
        return await self._routed(session_id, lambda c: c.reset(session_id, seed, options, request_id))

    @checked
    async def step(
        self, session_id: str, actions: Mapping[str, Any], request_id: str | None = None
    ) -> StepResult:
        """See :meth:`EnvPool.step`."""
        return await self._routed(session_id, lambda c: c.step(session_id, actions, request_id))

    @checked
    async def batch_step(
        self, steps: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[StepResult | MartiError]:
        """See :meth:`EnvPool.batch_step`; the servers' calls are in flight together."""
        groups = self._routes.split(steps)
        out: list[Any] = [None] * len(steps)

        async def one(i: int, idx: list[int]) -> None:
            part = [steps[k] for k in idx]
            try:
                results: list[StepResult | MartiError] = await self.clients[i].batch_step(part)
            except MartiError as e:
                results = [e] * len(idx)
            self._routes.settle(i, idx, steps, results, out)

        await asyncio.gather(*(one(i, idx) for i, idx in groups.items()))
        return out

    @checked
    async def close_session(self, session_id: str) -> bool:
        """See :meth:`EnvPool.close_session`."""
        i = self._routes.drop(session_id)
        if i is None:
            return False
        try:
            return await self.clients[i].close_session(session_id)
        except MartiError as e:
            raise name_server(e, self.addresses[i]) from None

    async def close(self) -> None:
        """Close every server's channel."""
        for c in self.clients:
            await c.close()

    async def __aenter__(self) -> AsyncEnvPool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


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
