"""Typed clients of the env server and the remote PettingZoo env returned by ``marti.make(address=...)``.

* :class:`EnvClient` (sync) and :class:`AsyncEnvClient` (``grpc.aio``): ``list_envs``, ``create_session``,
  ``reset``, ``step``, ``batch_step``, ``close_session``; they return plain Python values and raise
  :mod:`marti.errors` classes (``NotFoundError`` for an unknown env id, ``SessionLostError`` for a session the
  server no longer has, ``InvalidArgumentError`` for a bad config key or action, ``ResourceExhaustedError`` at
  the session cap, ``UnavailableError`` when the server is away).
* :class:`SessionStream`: the bidirectional ``Session`` stream (lowest latency; errors arrive in-band and are
  raised for that request only; sessions made on the stream close when it closes; a broken stream is replaced
  by a new one on the next request). It belongs to the process that opened it: in a forked child, every
  request raises ``FailedPreconditionError`` at once (see :class:`SessionStream`).
* :class:`RemoteParallelEnv`: a PettingZoo ``ParallelEnv`` backed by one server session. Every ``step`` and
  ``reset`` carries a fresh request id, so the channel's automatic retry on ``UNAVAILABLE`` cannot step twice.
  :meth:`RemoteParallelEnv.step_batch` steps many such envs in one ``BatchStep`` round trip. After a server
  restart, ``step`` raises ``SessionLostError`` and ``reset`` re-creates the session by itself.

Every client and ``RemoteParallelEnv.create`` accept ``channel=``: an open channel (from :func:`open_channel`)
shared by any number of clients and envs instead of one connection each; whoever opened it closes it.

Several servers behind the same calls: :class:`EnvPool` and :class:`AsyncEnvPool` (:mod:`.pool`); both
:class:`EnvClient` and :class:`EnvPool` satisfy :class:`EnvSessions`, and :func:`open_env_sessions` returns
the one an address value calls for.

Modules (the broker package's layout): :mod:`.types` (domain types), :mod:`.protocol` (argument checks, request
builders, response decoding and the :class:`EnvSessions` protocol), :mod:`.delta` (delta results),
:mod:`.sync_client`, :mod:`.stream`, :mod:`.async_client`, :mod:`.remote` (the PettingZoo env),
:mod:`.addresses`, :mod:`.placement`, :mod:`.pool`, :mod:`.pool_stream` and :mod:`.async_pool`.
"""

from __future__ import annotations

from .async_client import AsyncEnvClient
from .async_pool import AsyncEnvPool
from .delta import DELTA_CACHE_SESSIONS, DeltaCache, HeldResult, delta_cache
from .placement import DOWN_COOLDOWN_S, MAX_DOWN_COOLDOWN_S, name_server
from .pool import EnvPool, open_env_sessions, shared_env_pool
from .pool_stream import EnvPoolStream
from .protocol import IDEMPOTENT_METHODS, SERVICE, EnvSessions, check_client_args, check_env_list
from .remote import RemoteParallelEnv
from .stream import SessionStream
from .sync_client import EnvClient, open_channel
from .types import AgentInfo, EnvServerInfo, SessionInfo, StepResult

__all__ = [
    "DELTA_CACHE_SESSIONS",
    "DOWN_COOLDOWN_S",
    "IDEMPOTENT_METHODS",
    "MAX_DOWN_COOLDOWN_S",
    "SERVICE",
    "AgentInfo",
    "AsyncEnvClient",
    "AsyncEnvPool",
    "DeltaCache",
    "EnvClient",
    "EnvPool",
    "EnvPoolStream",
    "EnvServerInfo",
    "EnvSessions",
    "HeldResult",
    "RemoteParallelEnv",
    "SessionInfo",
    "SessionStream",
    "StepResult",
    "check_client_args",
    "check_env_list",
    "delta_cache",
    "name_server",
    "open_channel",
    "open_env_sessions",
    "shared_env_pool",
]
