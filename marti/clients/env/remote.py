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
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import gymnasium
from pettingzoo import ParallelEnv

from marti.api.env.v1 import env_pb2 as pb
from marti.api.env.v1 import env_service_pb2_grpc as pb_grpc
from marti.arguments import checked
from marti.codec.env import (
    DELTA_SCALARS,
    apply_text_edit,
    map_from_proto,
    map_to_proto,
    space_from_proto,
    value_from_proto,
    value_to_proto,
)
from marti.env_guard import (
    check_actions,
    check_agent,
    check_env_id,
    check_options,
    check_seed,
    closed_error,
)
from marti.errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    MartiError,
    ResourceExhaustedError,
    SessionLostError,
    UnavailableError,
)
from marti.rpc.calls import acall, call
from marti.rpc.channel import check_timeout_s, make_channel
from marti.rpc.errors import from_rpc_error, from_status_proto
from marti.rpc.watchdog import WATCHDOG

SERVICE = "marti.api.env.v1.EnvService"
#: Methods safe to retry on UNAVAILABLE (Step and Reset are made safe by request ids).
IDEMPOTENT_METHODS = tuple(
    (SERVICE, m) for m in ("ListEnvs", "CreateSession", "Reset", "Step", "BatchStep", "CloseSession")
)


def open_channel(
    address: str,
    *,
    token: str | None = None,
    tls_ca_file: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """Open a sync channel to an env server, with the SDK's retry policy (idempotent rpcs retried on
    ``UNAVAILABLE``), to share between clients and envs through their ``channel=`` argument.

    Args:
        address: ``host:port`` of the env server.
        token: Bearer token sent on every call; ``None`` reads ``MARTI_ENV_TOKEN``, then ``MARTI_TOKEN``.
        tls_ca_file: CA file for TLS.
        options: Extra grpc channel arguments (e.g. ``("grpc.max_reconnect_backoff_ms", 1000)``).

    Returns:
        The channel; the caller closes it (``channel.close()``) after the clients and envs using it.
    """
    return make_channel(
        address,
        token=token,
        tls_ca_file=tls_ca_file,
        idempotent_methods=IDEMPOTENT_METHODS,
        options=options,
        service="env",
    )


#: Channels a forked child was asked to close although its parent dialed them: kept open (and referenced, so
#: garbage collection does not close them either) because closing a parent's channel in a child can block
#: for good when gRPC skipped its fork handlers (a stream's thread was inside gRPC at fork time).
_INHERITED_CHANNELS: list[grpc.Channel] = []


@dataclass(frozen=True)
class AgentInfo:
    """An agent of a session.

    Args:
        agent: Agent id.
        role: Role name, or ``""``.
        observation_space: Its gymnasium observation space.
        action_space: Its gymnasium action space.
    """

    agent: str
    role: str
    observation_space: gymnasium.Space
    action_space: gymnasium.Space


@dataclass(frozen=True)
class SessionInfo:
    """A created session.

    Args:
        session_id: Opaque id.
        env_id: Resolved ``name-vN``.
        agents: Every possible agent, in order.
        idle_timeout_ms: The server closes the session after this long unused, milliseconds.
        metrics: Names of the episode metrics the env reports in its infos (its ``metadata["metrics"]``).
    """

    session_id: str
    env_id: str
    agents: tuple[AgentInfo, ...]
    idle_timeout_ms: int
    metrics: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepResult:
    """Decoded reset or step result (PettingZoo dicts keyed by agent).

    Args:
        observations: Agent -> observation.
        rewards: Agent -> reward (0.0 after a reset).
        terminations: Agent -> terminated.
        truncations: Agent -> truncated.
        infos: Agent -> info dict.
        agents: Live agents afterwards.
        acting_agents: Agents whose action the next step reads.
    """

    observations: dict[str, Any]
    rewards: dict[str, float]
    terminations: dict[str, bool]
    truncations: dict[str, bool]
    infos: dict[str, dict[str, Any]]
    agents: list[str]
    acting_agents: list[str]

    def as_tuple(self) -> tuple[dict, dict, dict, dict, dict]:
        """PettingZoo step tuple ``(observations, rewards, terminations, truncations, infos)``."""
        return self.observations, self.rewards, self.terminations, self.truncations, self.infos


def _session_info(resp: pb.CreateSessionResponse) -> SessionInfo:
    agents = tuple(
        AgentInfo(a.agent, a.role, space_from_proto(a.observation_space), space_from_proto(a.action_space))
        for a in resp.agents
    )
    return SessionInfo(resp.session_id, resp.env_id, agents, int(resp.idle_timeout_ms), tuple(resp.metrics))


def _result(resp: pb.StepResponse | pb.ResetResponse) -> StepResult:
    """Decode a full (non-delta) result."""
    obs, rew, term, trunc = {}, {}, {}, {}
    shared = json.loads(resp.infos_json) if resp.infos_json else None
    infos = {}
    for r in resp.results:
        agent = r.agent
        obs[agent] = value_from_proto(r.observation)
        rew[agent] = r.reward
        term[agent] = r.terminated
        trunc[agent] = r.truncated
        infos[agent] = shared[agent] if shared is not None else map_from_proto(r.info)
    return StepResult(obs, rew, term, trunc, infos, list(resp.agents), list(resp.acting_agents))


#: Sessions whose latest result a :class:`DeltaCache` keeps (least recently used dropped first); a session
#: dropped from the cache gets its next step in full.
DELTA_CACHE_SESSIONS = 4096


@dataclass(frozen=True)
class HeldResult:
    """The latest result of a session a client holds: the base of the session's next delta result.

    Args:
        result_id: The server's id of the result (``StepResponse.result_id``).
        observations: Agent -> observation (the cache's own dict).
        infos: Agent -> info (the cache's own copies).
    """

    result_id: int
    observations: dict[str, Any]
    infos: dict[str, dict[str, Any]]

    @classmethod
    def of(
        cls, result_id: int, observations: Mapping[str, Any], infos: Mapping[str, Mapping[str, Any]]
    ) -> HeldResult:
        """What a delta can need of a decoded result, without pinning the rest: the text observations (only
        text is ever sent as an edit) and the infos with every value that is not a delta scalar replaced by
        ``None`` (such values are always sent again, :func:`marti.codec.env.info_delta`; the keys keep their
        order). An image or tensor observation the caller dropped is therefore not kept alive by the cache."""
        return cls(
            result_id,
            {a: o for a, o in observations.items() if type(o) is str},
            {a: {k: v if type(v) in DELTA_SCALARS else None for k, v in i.items()} for a, i in infos.items()},
        )


class DeltaCache:
    """Per session, the latest result a client decoded, so that its next step may come back as a delta
    (``StepRequest.delta_base``): text observations as edits of the held ones, infos as their changed keys.

    Every client and stream on one channel shares one cache (:func:`delta_cache`); session ids are the
    server's, unique across its clients. Thread-safe. Decoding is exact: a delta result decodes to the same
    observations and infos (key order included) the full result would.

    Args:
        max_sessions: Sessions kept (least recently used dropped first), at least 1.

    Raises:
        InvalidArgumentError: ``max_sessions < 1``.
    """

    def __init__(self, max_sessions: int = DELTA_CACHE_SESSIONS) -> None:
        if max_sessions < 1:
            raise InvalidArgumentError(f"max_sessions must be >= 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self._held: OrderedDict[str, HeldResult] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._held)

    def get(self, session_id: str) -> HeldResult | None:
        """The session's held result (marked recently used), or ``None``."""
        with self._lock:
            held = self._held.get(session_id)
            if held is not None:
                self._held.move_to_end(session_id)
            return held

    def drop(self, session_id: str) -> None:
        """Forget a session (closed or lost)."""
        with self._lock:
            self._held.pop(session_id, None)

    def _keep(self, session_id: str, held: HeldResult) -> None:
        with self._lock:
            now = self._held.get(session_id)
            if now is not None and now.result_id >= held.result_id:
                return  # a newer result arrived first (two threads stepping one session)
            self._held[session_id] = held
            self._held.move_to_end(session_id)
            while len(self._held) > self.max_sessions:
                self._held.popitem(last=False)

    def decode(
        self, session_id: str, resp: pb.StepResponse | pb.ResetResponse, held: HeldResult | None
    ) -> StepResult:
        """Decode a reset or step result of ``session_id`` and keep it as the session's next base.

        Args:
            session_id: The session.
            resp: The response.
            held: What :meth:`get` returned when the request was made (the base its ``delta_base`` named).

        Returns:
            The decoded result (its dicts are the caller's own).

        Raises:
            InternalError: A delta against a result other than ``held``, or an edit that does not fit its
                base (the server broke the protocol; ids and lengths named).
        """
        base_id = resp.delta_base if isinstance(resp, pb.StepResponse) else 0
        if base_id and (held is None or held.result_id != base_id):
            raise InternalError(
                f"env server sent a delta against result {base_id} of session {session_id!r}, but the client "
                f"holds {held.result_id if held is not None else 'none'}"
            )
        obs, rew, term, trunc = {}, {}, {}, {}
        shared = json.loads(resp.infos_json) if resp.infos_json else None
        infos: dict[str, dict[str, Any]] = {}
        for r in resp.results:
            agent = r.agent
            if base_id and r.HasField("observation_edit"):
                base_obs = held.observations.get(agent)
                if type(base_obs) is not str:
                    raise InternalError(
                        f"env server sent a text edit for agent {agent!r} without a base text"
                    )
                try:
                    obs[agent] = apply_text_edit(base_obs, r.observation_edit)
                except InvalidArgumentError as e:
                    raise InternalError(
                        f"env server sent a bad edit for agent {agent!r}: {e.message}"
                    ) from None
            else:
                obs[agent] = value_from_proto(r.observation)
            rew[agent] = r.reward
            term[agent] = r.terminated
            trunc[agent] = r.truncated
            if shared is None:
                infos[agent] = map_from_proto(r.info)
            elif base_id and r.info_delta:
                base_info = held.infos.get(agent)
                if base_info is None:
                    raise InternalError(f"env server sent an info delta for agent {agent!r} without a base")
                info = dict(base_info)
                info.update(shared[agent])
                infos[agent] = info
            else:
                infos[agent] = shared[agent]
        if resp.result_id:
            self._keep(session_id, HeldResult.of(resp.result_id, obs, infos))
        return StepResult(obs, rew, term, trunc, infos, list(resp.agents), list(resp.acting_agents))


_CACHES: weakref.WeakKeyDictionary[Any, DeltaCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def _fresh_locks_after_fork() -> None:
    """In a forked child, give the caches new locks: a parent thread may have held one at fork time."""
    global _CACHES_LOCK
    _CACHES_LOCK = threading.Lock()
    for cache in list(_CACHES.values()):
        cache._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks_after_fork)


def delta_cache(channel: Any) -> DeltaCache:
    """The :class:`DeltaCache` of a channel (made on first use, gone with the channel)."""
    with _CACHES_LOCK:
        cache = _CACHES.get(channel)
        if cache is None:
            cache = _CACHES[channel] = DeltaCache()
        return cache


def _decode(
    cache: DeltaCache | None,
    session_id: str,
    resp: pb.StepResponse | pb.ResetResponse,
    held: HeldResult | None,
) -> StepResult:
    return _result(resp) if cache is None else cache.decode(session_id, resp, held)


class _RequestIds:
    """Unique request ids, cheaper than ``uuid4`` per step: a random per-process prefix and a counter (a forked
    child draws a new prefix, so parent and child never share an id)."""

    def __init__(self) -> None:
        self._owner = (
            -1,
            "",
        )  # (pid, prefix), replaced as one object: a thread never pairs a pid with another's prefix
        self._count = itertools.count()

    def next(self) -> str:
        pid, prefix = self._owner
        if pid != os.getpid():
            pid, prefix = self._owner = (os.getpid(), os.urandom(12).hex())
        return f"{prefix}-{next(self._count)}"


_REQUEST_IDS = _RequestIds()


def _describe(d: pb.EnvDescription) -> dict[str, Any]:
    return {
        "env_id": d.env_id,
        "name": d.name,
        "version": d.version,
        "description": d.description,
        "config_schema": [
            {
                "name": f.name,
                "type": f.type,
                "default": value_from_proto(f.default_value),
                "description": f.description,
                "choices": [value_from_proto(c) for c in f.choices],
                "minimum": f.minimum if f.HasField("minimum") else None,
                "maximum": f.maximum if f.HasField("maximum") else None,
            }
            for f in d.config_schema
        ],
        "agents": [a.agent for a in d.agents],
        "roles": {a.agent: a.role for a in d.agents},
        "observation_spaces": {a.agent: a.observation_space.description for a in d.agents},
        "action_spaces": {a.agent: a.action_space.description for a in d.agents},
        "metrics": list(d.metrics),
    }


def check_client_args(address: Any, token: Any, tls_ca_file: Any, channel: Any) -> None:
    """The argument checks of every env client's constructor (sync and aio), before any channel is opened.

    Raises:
        InvalidArgumentError: ``address`` is not a non-empty string (without ``channel``), ``token`` not a
            string or None, ``tls_ca_file`` not a path or None, or ``channel`` not a gRPC channel; each named.
    """
    if channel is not None:
        if not callable(getattr(channel, "unary_unary", None)):  # grpc.Channel, aio or a wrapper of one
            raise InvalidArgumentError(
                f"channel must be an open grpc channel or None, got {type(channel).__name__}"
            )
    elif not isinstance(address, str) or not address:
        raise InvalidArgumentError(
            f"address must be a 'host:port' string, got {type(address).__name__} {address!r}"
        )
    if token is not None and not isinstance(token, str):
        raise InvalidArgumentError(f"token must be a str or None, got {type(token).__name__}")
    if tls_ca_file is not None and not isinstance(tls_ca_file, (str, os.PathLike)):
        raise InvalidArgumentError(f"tls_ca_file must be a path or None, got {type(tls_ca_file).__name__}")


def check_env_list(envs: Any, actions: Any, kind: type | None = None) -> None:
    """Check the ``envs`` and ``actions`` of a many-env step (``step_batch``, ``marti.envs.step_many``).

    Args:
        envs: Must be a list of envs: instances of ``kind`` when given, else objects with a ``step`` method.
        actions: Must be a list of the same length.

    Raises:
        InvalidArgumentError: ``envs`` is not such a list (the bad item named), or ``actions`` is not a list of
            the same length.
    """
    for name, seq in (("envs", envs), ("actions", actions)):
        if isinstance(seq, (str, bytes, Mapping)) or not isinstance(seq, Sequence):
            raise InvalidArgumentError(f"{name} must be a list, got {type(seq).__name__}")
    for i, env in enumerate(envs):
        if not (isinstance(env, kind) if kind is not None else callable(getattr(env, "step", None))):
            want = f"a {kind.__name__}" if kind is not None else "an env with a step method"
            raise InvalidArgumentError(f"envs[{i}] must be {want}, got {type(env).__name__}")
    if len(envs) != len(actions):
        raise InvalidArgumentError(f"{len(actions)} action dicts for {len(envs)} envs")


def _session_id(session_id: Any) -> str:
    """Check a session id argument.

    Raises:
        InvalidArgumentError: It is not a non-empty string (named).
    """
    if not isinstance(session_id, str) or not session_id:
        raise InvalidArgumentError(
            f"session_id must be a non-empty str, got {type(session_id).__name__} {session_id!r}"
        )
    return session_id


def _create_request(env_id: str, config: Mapping[str, Any] | None, seed: int | None, request_id: str | None):
    """The ``CreateSessionRequest``; ``env_id`` and ``seed`` are checked as ``marti.make`` checks them in-process.

    Raises:
        InvalidArgumentError: A bad env id, seed or config value (named), before any rpc.
    """
    check_env_id(env_id)
    seed = check_seed(seed)
    if config is not None and not isinstance(config, Mapping):
        raise InvalidArgumentError(f"config must be a dict or None, got {type(config).__name__}")
    req = pb.CreateSessionRequest(
        env_id=env_id, config=map_to_proto(config), request_id=request_id or _REQUEST_IDS.next()
    )
    if seed is not None:
        req.seed = seed
    return req


def _reset_request(
    session_id: str, seed: int | None, options: Mapping[str, Any] | None, request_id: str | None
):
    """The ``ResetRequest``; ``seed`` and ``options`` are checked as an in-process env checks them.

    Raises:
        InvalidArgumentError: A bad seed or options (named), before any rpc.
    """
    seed = check_seed(seed)
    check_options(options)
    req = pb.ResetRequest(
        session_id=_session_id(session_id),
        options=map_to_proto(options),
        request_id=request_id or _REQUEST_IDS.next(),
    )
    if seed is not None:
        req.seed = seed
    return req


def _action(agent: str, action: Any) -> pb.AgentAction:
    try:
        return pb.AgentAction(agent=agent, action=value_to_proto(action))
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"action of {agent!r}: {e.message}") from None


def _step_request(
    session_id: str, actions: Mapping[str, Any], request_id: str | None, held: HeldResult | None = None
) -> pb.StepRequest:
    """The ``StepRequest``; ``actions`` is checked as an in-process env checks it.

    Raises:
        InvalidArgumentError: ``actions`` is not a dict of agent name -> sendable action (named), before any rpc.
    """
    acts = [_action(k, v) for k, v in check_actions(actions).items()]
    return pb.StepRequest(
        session_id=_session_id(session_id),
        actions=acts,
        request_id=request_id or _REQUEST_IDS.next(),
        delta_base=held.result_id if held is not None else 0,
    )


def _batch_request(
    cache: DeltaCache | None, steps: Sequence[tuple[str, Mapping[str, Any]]]
) -> tuple[pb.BatchStepRequest, list[HeldResult | None]]:
    """The ``BatchStepRequest`` of ``(session_id, actions)`` pairs, with each session's held result as base.

    Raises:
        InvalidArgumentError: ``steps`` is not a sequence of ``(session_id, actions)`` pairs (the bad item named).
    """
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
        raise InvalidArgumentError(
            f"steps must be a list of (session_id, actions) pairs, got {type(steps).__name__}"
        )
    for i, item in enumerate(steps):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise InvalidArgumentError(f"steps[{i}] must be a (session_id, actions) pair, got {item!r:.80}")
    helds = [cache.get(s) if cache is not None else None for s, _ in steps]
    req = pb.BatchStepRequest(
        steps=[_step_request(s, a, None, h) for (s, a), h in zip(steps, helds, strict=True)]
    )
    return req, helds


def _batch_results(
    cache: DeltaCache | None,
    steps: Sequence[tuple[str, Mapping[str, Any]]],
    helds: list[HeldResult | None],
    items: Any,
) -> list[StepResult | MartiError]:
    """Decode ``BatchStepResponse.items``: a result or the step's own error each (a lost session is forgotten
    by the cache; a delta that does not fit its base is that step's ``InternalError``)."""
    out: list[StepResult | MartiError] = []
    for (sid, _), held, item in zip(steps, helds, items, strict=True):
        err = from_status_proto(item.status)
        if err is None:
            try:
                out.append(_decode(cache, sid, item.step, held))
            except InternalError as e:
                out.append(e)
            continue
        if isinstance(err, SessionLostError) and cache is not None:
            cache.drop(sid)
        out.append(err)
    return out


class EnvClient:
    """Synchronous client of ``EnvService``.

    Args:
        address: ``host:port`` of the env server.
        token: Bearer token; ``None`` reads ``MARTI_ENV_TOKEN``, then ``MARTI_TOKEN`` (as the server does);
            ``""`` sends none.
        tls_ca_file: CA file for TLS.
        timeout_s: Deadline of each unary call, seconds.
        channel: An existing channel to use instead of dialing (e.g. from :func:`open_channel`; ``token`` and
            ``tls_ca_file`` are then ignored); not closed by :meth:`close`.
        deltas: Ask for delta results (``StepRequest.delta_base``): the server then sends a step's text
            observations as edits of the previous ones and its infos as their changed keys, and the client
            rebuilds them exactly from the session's previous result (kept in the channel's
            :class:`DeltaCache`, shared by every client on the channel). Servers without deltas send full
            results. ``False`` always asks for full results.
        options: Extra grpc channel arguments of the channel the client dials (see :func:`open_channel`;
            unused with ``channel``).

    Raises:
        InvalidArgumentError: The token (given or from the environment) is not printable ASCII; raised at
            construction, before any rpc, naming the position of the bad character but not the token.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls_ca_file: str | None = None,
        timeout_s: float | None = None,
        channel: grpc.Channel | None = None,
        deltas: bool = True,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        check_client_args(address, token, tls_ca_file, channel)
        self.address = address
        self.timeout_s = check_timeout_s(timeout_s)
        self._own_channel = channel is None
        self._pid = os.getpid()
        self.channel = channel or open_channel(address, token=token, tls_ca_file=tls_ca_file, options=options)
        self.stub = pb_grpc.EnvServiceStub(self.channel)
        #: The channel's delta cache, or ``None`` when deltas are off.
        self.deltas: DeltaCache | None = delta_cache(self.channel) if deltas else None

    def list_envs(self) -> list[dict[str, Any]]:
        """List registered envs (id, description, config schema, agents, roles, space descriptions)."""
        return [_describe(d) for d in call(self.stub.ListEnvs, pb.ListEnvsRequest(), self.timeout_s).envs]

    @checked
    def create_session(
        self,
        env_id: str,
        config: Mapping[str, Any] | None = None,
        seed: int | None = None,
        request_id: str | None = None,
    ) -> SessionInfo:
        """Create a session (see ``CreateSession``); a retry with the same ``request_id`` returns the same one.

        Raises:
            NotFoundError: Unknown env id.
            InvalidArgumentError: Unknown config key (named) or bad value.
            ResourceExhaustedError: The server's session cap (named).
        """
        return _session_info(
            call(self.stub.CreateSession, _create_request(env_id, config, seed, request_id), self.timeout_s)
        )

    @checked
    def reset(
        self,
        session_id: str,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        request_id: str | None = None,
    ) -> StepResult:
        """Reset a session; returns observations and infos (rewards 0).

        Raises:
            SessionLostError: Unknown (closed, reaped, or lost in a server restart) session.
        """
        try:
            resp = call(
                self.stub.Reset, _reset_request(session_id, seed, options, request_id), self.timeout_s
            )
        except SessionLostError:
            self._forget(session_id)
            raise
        return _decode(self.deltas, session_id, resp, None)

    def _forget(self, session_id: str) -> None:
        if self.deltas is not None:
            self.deltas.drop(session_id)

    def _held(self, session_id: str) -> HeldResult | None:
        return self.deltas.get(session_id) if self.deltas is not None else None

    @checked
    def step(self, session_id: str, actions: Mapping[str, Any], request_id: str | None = None) -> StepResult:
        """Step a session; a retry with the same ``request_id`` returns the first result.

        Raises:
            InvalidArgumentError: Unknown or done agent, missing or oversized action.
            FailedPreconditionError: Step before reset or after the episode ended.
            SessionLostError: Unknown (closed, reaped, or lost in a server restart) session; a
                ``NotFoundError`` mapped from the status's ``ErrorInfo`` detail (reason ``SESSION_LOST``).
            InternalError: A delta result that does not fit the held result (a server bug).
        """
        held = self._held(session_id)
        try:
            resp = call(self.stub.Step, _step_request(session_id, actions, request_id, held), self.timeout_s)
        except SessionLostError:
            self._forget(session_id)
            raise
        return _decode(self.deltas, session_id, resp, held)

    @checked
    def batch_step(self, steps: Sequence[tuple[str, Mapping[str, Any]]]) -> list[StepResult | MartiError]:
        """Step many sessions in one call.

        Args:
            steps: ``(session_id, actions)`` pairs.

        Returns:
            One entry per step, in order: a :class:`StepResult`, or the :class:`MartiError` of that step alone.
        """
        req, helds = _batch_request(self.deltas, steps)
        return _batch_results(self.deltas, steps, helds, call(self.stub.BatchStep, req, self.timeout_s).items)

    @checked
    def close_session(self, session_id: str) -> bool:
        """Close a session (idempotent); True when it existed."""
        self._forget(session_id)
        return call(
            self.stub.CloseSession, pb.CloseSessionRequest(session_id=_session_id(session_id)), self.timeout_s
        ).closed

    def stream(self) -> SessionStream:
        """Open a bidirectional :class:`SessionStream` on this client's channel (sharing its delta cache)."""
        return SessionStream(self.stub, self.timeout_s, self.deltas)

    def close(self) -> None:
        """Close the channel (when this client dialed it).

        In a process forked from the one that dialed it, the channel is left to the parent (kept referenced,
        not closed): closing it there could block for good.
        """
        if not self._own_channel:
            return
        if self._pid != os.getpid():
            _INHERITED_CHANNELS.append(self.channel)
            return
        self.channel.close()

    def __enter__(self) -> EnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_END = object()


class SessionStream:
    """The ``Session`` bidi stream: one request at a time, in order; errors are raised per request.

    When the stream breaks (the server restarted, or the connection dropped), the request in flight raises
    the transport error (:class:`UnavailableError`, ...), the sessions made on the stream are gone (the server
    closes them with the stream), and the next request opens a new stream on the same channel by itself;
    :attr:`generation` counts the streams opened so far. Only :meth:`close` ends it for good.

    Fork: the stream belongs to the process that opened it (its pid is :attr:`owner_pid`). gRPC reads and
    writes it from threads of that process, which a forked child does not have, so in a child every request
    raises :class:`~marti.errors.FailedPreconditionError` at once (it would otherwise wait forever), without
    touching the parent's stream; :meth:`close` in a child only marks this copy closed. Open a new stream in
    the child (or use the unary calls of :class:`EnvClient`).

    Args:
        stub: An ``EnvServiceStub``.
        timeout_s: How long to wait for each response, seconds.
        deltas: The delta cache to use (see :class:`EnvClient`), or ``None`` for full results.
    """

    def __init__(
        self, stub: pb_grpc.EnvServiceStub, timeout_s: float, deltas: DeltaCache | None = None
    ) -> None:
        self._stub = stub
        self.deltas = deltas
        self._made: set[str] = set()  # sessions created on the current stream (forgotten when it ends)
        self._seq = 0
        self._lock = threading.Lock()
        self.timeout_s = timeout_s
        self.closed = False
        #: How many streams were opened (1 at first; +1 each time a broken stream is replaced).
        self.generation = 0
        self._open()

    def _open(self) -> None:
        #: The process that opened the stream (the only one that can use it).
        self.owner_pid = os.getpid()
        requests: queue.SimpleQueue = queue.SimpleQueue()
        self._requests = requests
        self._responses: Any = self._stub.Session(self._iter(requests))
        self._broken = False
        self.generation += 1

    @staticmethod
    def _iter(requests: queue.SimpleQueue) -> Iterator[pb.SessionRequest]:
        while True:
            item = requests.get()
            if item is _END:
                return
            yield item

    def _discard(self) -> None:
        """End the current stream's request iterator and cancel the call (it is broken or being replaced)."""
        self._requests.put(_END)
        try:
            self._responses.cancel()
        except Exception:  # noqa: BLE001 - cancelling a finished call is harmless
            pass

    @property
    def forked(self) -> bool:
        """True in a process forked from the one that opened the stream (which alone can use it)."""
        return self.owner_pid != os.getpid()

    def _forked_error(self) -> FailedPreconditionError:
        return FailedPreconditionError(
            f"this session stream was opened by process {self.owner_pid}, and this process "
            f"({os.getpid()}) is a fork of it: a forked child cannot use its parent's stream (nor the env "
            "sessions on it). Make a new env or stream in the child (marti.make(..., address=...) there), or "
            "create the env with transport='unary' before forking"
        )

    @property
    def broken(self) -> bool:
        """True when the current stream has ended (server restart, dropped connection) and was not closed
        by :meth:`close`; the next request opens a new one. Always False in a forked child (see
        :attr:`forked`): the parent's stream is not looked at there."""
        if self.forked:
            return False
        if self._broken:
            return True
        done = getattr(self._responses, "done", None)
        return bool(done()) if callable(done) else False

    def _roundtrip(self, **op: Any) -> pb.SessionResponse:
        if self.forked:  # before the lock: a thread of the parent may have held it at fork time
            raise self._forked_error()
        with self._lock:
            if self.closed:
                raise FailedPreconditionError("the session stream is closed")
            if self.broken:
                self._discard()
                self._forget_made()
                self._open()
            self._seq += 1
            self._requests.put(pb.SessionRequest(sequence=self._seq, **op))
            responses = self._responses
            WATCHDOG.arm(self, self.timeout_s, responses.cancel)
            try:
                try:
                    resp = next(responses)
                finally:
                    fired = not WATCHDOG.disarm(self)  # its cancel ran, or is about to
            except StopIteration:
                self._broken = True
                raise UnavailableError("the env server ended the session stream") from None
            except grpc.RpcError as e:
                self._broken = True
                if fired and e.code() == grpc.StatusCode.CANCELLED:
                    raise self._late_error() from None
                raise from_rpc_error(e) from None
            if fired:  # the answer came as the deadline passed: the stream is being cancelled, so it is late
                self._broken = True
                raise self._late_error()
        err = from_status_proto(resp.status)
        if err is not None:
            raise err
        return resp

    def _late_error(self) -> DeadlineExceededError:
        return DeadlineExceededError(
            f"the env server did not answer within timeout_s={self.timeout_s} s; the session stream was closed, "
            "and its sessions with it (a reset() re-creates an env's session)"
        )

    def _forget_made(self) -> None:
        """Drop the held results of the sessions made on the stream (the server closed them with it)."""
        if self.deltas is not None:
            for sid in self._made:
                self.deltas.drop(sid)
        self._made.clear()

    def _forget(self, session_id: str) -> None:
        if self.deltas is not None:
            self.deltas.drop(session_id)

    @checked
    def create_session(
        self, env_id: str, config: Mapping[str, Any] | None = None, seed: int | None = None
    ) -> SessionInfo:
        """Create a session owned by this stream (closed when the stream ends)."""
        info = _session_info(self._roundtrip(create=_create_request(env_id, config, seed, None)).create)
        self._made.add(info.session_id)
        return info

    @checked
    def reset(
        self, session_id: str, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> StepResult:
        """Reset a session.

        Raises:
            SessionLostError: The server does not know the session (restarted, or its stream broke).
        """
        try:
            resp = self._roundtrip(reset=_reset_request(session_id, seed, options, None)).reset
        except SessionLostError:
            self._forget(session_id)
            raise
        return _decode(self.deltas, session_id, resp, None)

    @checked
    def step(self, session_id: str, actions: Mapping[str, Any], request_id: str | None = None) -> StepResult:
        """Step a session.

        Raises:
            SessionLostError: The server does not know the session (restarted, or its stream broke).
            InternalError: A delta result that does not fit the held result (a server bug).
        """
        held = self.deltas.get(session_id) if self.deltas is not None else None
        try:
            resp = self._roundtrip(step=_step_request(session_id, actions, request_id, held)).step
        except SessionLostError:
            self._forget(session_id)
            raise
        return _decode(self.deltas, session_id, resp, held)

    @checked
    def batch_step(self, steps: Sequence[tuple[str, Mapping[str, Any]]]) -> list[StepResult | MartiError]:
        """Step many sessions in one request; per-step errors are returned, not raised."""
        req, helds = _batch_request(self.deltas, steps)
        items = self._roundtrip(batch_step=req).batch_step.items
        return _batch_results(self.deltas, steps, helds, items)

    @checked
    def close_session(self, session_id: str) -> bool:
        """Close a session."""
        self._forget(session_id)
        self._made.discard(session_id)
        return self._roundtrip(close=pb.CloseSessionRequest(session_id=_session_id(session_id))).close.closed

    def close(self) -> None:
        """End the stream (the server closes the sessions made on it).

        In a forked child (see :attr:`forked`) it only marks this copy closed: the stream, and its sessions,
        stay the parent's.
        """
        if self.closed:
            return
        self.closed = True
        if self.forked:
            return
        self._forget_made()
        self._requests.put(_END)
        try:
            for _ in self._responses:
                pass
        except grpc.RpcError:
            pass


class RemoteParallelEnv(ParallelEnv):
    """A PettingZoo ``ParallelEnv`` backed by one env-server session (see module docstring).

    Build it with :meth:`create` (what ``marti.make(address=...)`` calls).

    Losing the session: sessions live in the server's memory, so a server restart (or, with the stream
    transport, a dropped stream, or with either transport, the idle reaper) loses them. The channel
    reconnects by itself and the stream transport opens a new stream; the env then carries on like this:

    * ``step`` on a lost session raises :class:`~marti.errors.SessionLostError` (a ``NotFoundError``), whose
      message says to call ``reset()``; every later ``step`` does the same until then;
    * ``reset`` on a lost session (known lost, or found lost by that very reset) creates a new session with
      the same env id (resolved ``name-vN``), config and creation seed, as ``marti.make`` did, then resets
      it with the given ``seed`` and ``options``. :attr:`session_id` changes; spaces and agents are the same.
      While the server is still away, ``reset`` raises ``UnavailableError`` and may be called again.

    Fork: with the stream transport (the default) the session lives on a stream of the process that made the
    env, which a forked child cannot use; there ``step``, ``reset`` and ``step_batch`` raise
    :class:`~marti.errors.FailedPreconditionError` at once (naming the parent's pid) and ``close`` only marks
    the child's copy closed (the session stays the parent's). Make a new env in the child, or make the env
    with ``transport="unary"``; two processes stepping one session interleave its steps.

    Args:
        client: The client (closed with the env when ``own_client``).
        info: The session.
        stream: The bidi stream the session lives on, or ``None`` to use unary calls.
        own_client: Close the client in :meth:`close`.
        config: The env config the session was created with (used to re-create a lost session).
        seed: The creation seed (used to re-create a lost session).
    """

    def __init__(
        self,
        client: EnvClient,
        info: SessionInfo,
        stream: SessionStream | None = None,
        own_client: bool = True,
        *,
        config: Mapping[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        self.client = client
        self.session = info
        self.session_id = info.session_id
        self.env_id = info.env_id
        self._config = dict(config or {})
        self._seed = seed
        self._generation = stream.generation if stream is not None else 0
        self._lost: str | None = None
        self.possible_agents = [a.agent for a in info.agents]
        self.roles = {a.agent: a.role for a in info.agents}
        self._obs_spaces = {a.agent: a.observation_space for a in info.agents}
        self._act_spaces = {a.agent: a.action_space for a in info.agents}
        self.agents: list[str] = []
        self.acting_agents: list[str] = []
        self.metadata: dict[str, Any] = {"name": info.env_id, "render_modes": [], "metrics": info.metrics}
        self._own_client = own_client
        self._stream = stream
        self._closed = False
        #: Called once when the env is closed (an :class:`~marti.clients.env_pool.EnvPool` frees its place).
        self.on_close: Callable[[], None] | None = None
        #: Set by an :class:`~marti.clients.env_pool.EnvPool`: called with the error when a lost session cannot
        #: be re-created because its server is unreachable or full; it moves the env to another server of the
        #: pool (:meth:`adopt`) or raises.
        self.relocate: Callable[[MartiError], None] | None = None

    @classmethod
    def create(
        cls,
        address: str | None,
        env_id: str,
        *,
        config: Mapping[str, Any] | None = None,
        seed: int | None = None,
        token: str | None = None,
        tls_ca_file: str | None = None,
        timeout_s: float | None = None,
        transport: str = "stream",
        channel: grpc.Channel | None = None,
    ) -> RemoteParallelEnv:
        """Dial ``address`` (or use ``channel``) and create a session of ``env_id``.

        Args:
            address: ``host:port`` (only a label when ``channel`` is given; then it may be None).
            env_id: Env id.
            config: Env config.
            seed: Seed of the first reset without a seed.
            token: Bearer token; ``None`` reads ``MARTI_ENV_TOKEN``, then ``MARTI_TOKEN``.
            tls_ca_file: CA file for TLS.
            timeout_s: Per-call deadline, seconds.
            transport: ``"stream"`` (default: the session lives on a bidi stream and closes with it, so a
                client that disappears leaks nothing) or ``"unary"``; on both the server reaps a session unused for
                its idle timeout.
            channel: An open channel to the server (see :func:`open_channel`), shared with other envs and
                clients; the env never closes it. ``None`` dials a channel of its own, closed with the env.

        Raises:
            InvalidArgumentError: Bad transport, no address nor channel, unknown config key (named) or bad
                value.
            NotFoundError, ResourceExhaustedError, UnavailableError: From the server.
        """
        if transport not in ("stream", "unary"):
            raise InvalidArgumentError(f"transport must be 'stream' or 'unary', got {transport!r}")
        if address is None and channel is None:
            raise InvalidArgumentError("a remote env needs an address or a channel")
        client = EnvClient(
            address or "<channel>", token=token, tls_ca_file=tls_ca_file, timeout_s=timeout_s, channel=channel
        )
        stream = None
        try:
            if transport == "stream":
                stream = client.stream()
                info = stream.create_session(env_id, config, seed)
            else:
                info = client.create_session(env_id, config, seed)
        except BaseException:
            if stream is not None:
                stream.close()
            client.close()
            raise
        return cls(client, info, stream, config=config, seed=seed)

    def observation_space(self, agent: str) -> gymnasium.Space:
        """The agent's observation space (decoded once; the same object on every call).

        Raises:
            InvalidArgumentError: ``agent`` is not one of ``possible_agents`` (named), as in-process.
        """
        return self._obs_spaces[check_agent(agent, self.possible_agents)]

    def action_space(self, agent: str) -> gymnasium.Space:
        """The agent's action space (decoded once; the same object on every call).

        Raises:
            InvalidArgumentError: ``agent`` is not one of ``possible_agents`` (named), as in-process.
        """
        return self._act_spaces[check_agent(agent, self.possible_agents)]

    @property
    def session_lost(self) -> bool:
        """True once the env knows its session is gone (see the class docstring); ``reset()`` clears it."""
        return self._lost is not None

    def _lost_error(self, why: str) -> SessionLostError:
        return SessionLostError(
            f"the {self.env_id} session {self.session_id!r} is lost ({why}); call reset() to start a new "
            "session with the same env id, config and seed",
            session_id=self.session_id,
        )

    def _check_stream(self) -> None:
        """Mark the session lost when the stream it lived on broke (the server closed it with the stream)."""
        stream = self._stream
        if (
            stream is not None
            and self._lost is None
            and (stream.broken or stream.generation != self._generation)
        ):
            self._lost = "its session stream broke: the env server restarted or the connection dropped"

    def _guarded(self, stream_fn: Any, unary_fn: Any) -> StepResult:
        """Run one session call, turning every way of losing the session into :class:`SessionLostError`.

        Raises:
            FailedPreconditionError: The env is closed.
        """
        if self._closed:
            raise closed_error(self.env_id)
        if self._stream is not None and self._stream.forked:
            raise self._stream._forked_error()
        self._check_stream()
        if self._lost is not None:
            raise self._lost_error(self._lost)
        try:
            return stream_fn() if self._stream is not None else unary_fn()
        except SessionLostError as e:
            self._lost = f"the env server does not know it: {e.message}"
            raise self._lost_error(self._lost) from e
        except MartiError as e:
            self._check_stream()
            if self._lost is not None:
                raise self._lost_error(f"{self._lost}; {type(e).__name__}: {e.message}") from e
            raise

    def _recreate(self) -> None:
        """Create a new session like the lost one (same resolved env id, config and creation seed)."""
        if self._stream is not None:
            info = self._stream.create_session(self.env_id, self._config, self._seed)
            self._generation = self._stream.generation
        else:
            info = self.client.create_session(self.env_id, self._config, self._seed)
        self.session = info
        self.session_id = info.session_id
        self.agents, self.acting_agents = [], []
        self._lost = None

    def adopt(self, other: RemoteParallelEnv) -> None:
        """Take over ``other``'s client, stream and session (a fresh one of the same env id, config and seed, on
        another server): this env carries on there and ``other`` must not be used again. The old stream is
        closed, and the old client too when this env owned it."""
        old_stream, old_client, old_owned = self._stream, self.client, self._own_client
        self.client, self._stream, self._own_client = other.client, other._stream, other._own_client
        self._generation = other._generation
        self.session = other.session
        self.session_id = other.session_id
        self.agents, self.acting_agents = [], []
        self._lost = None
        other._closed = True  # its client and stream are this env's now
        try:
            if old_stream is not None:
                old_stream.close()
        except MartiError:
            pass
        if old_owned:
            old_client.close()

    @checked
    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Reset the remote env; returns ``(observations, infos)``.

        A lost session (server restart, broken stream, idle reaping) is re-created first, with the same env
        id, config and creation seed, then reset with ``seed`` and ``options`` (see the class docstring). An
        env made by an :class:`~marti.clients.env_pool.EnvPool` whose server cannot be reached (or is full)
        re-creates it on another server of the pool instead.

        Raises:
            UnavailableError: The server cannot be reached (the env stays usable: call ``reset`` again).
            FailedPreconditionError: The env is closed.
        """

        def once() -> StepResult:
            return self._guarded(
                lambda: self._stream.reset(self.session_id, seed, options),
                lambda: self.client.reset(self.session_id, seed, options),
            )

        try:
            r = once()
        except UnavailableError as e:
            if self.relocate is None:
                raise
            self.relocate(e)  # the server is away: a new episode may as well start on another one
            r = once()
        except SessionLostError:
            try:
                self._recreate()
            except (UnavailableError, ResourceExhaustedError) as e:
                if self.relocate is None:
                    raise
                self.relocate(e)
            r = once()
        self.agents, self.acting_agents = r.agents, r.acting_agents
        return r.observations, r.infos

    @checked
    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Step the remote env; returns PettingZoo ``(observations, rewards, terminations, truncations, infos)``.

        Raises:
            InvalidArgumentError, FailedPreconditionError: Bad input (the session survives), or the env is
                closed (FailedPreconditionError).
            SessionLostError: The server no longer has the session (restart, broken stream, idle reaping);
                call ``reset()`` to carry on in a new session.
        """
        r = self._guarded(
            lambda: self._stream.step(self.session_id, actions),
            lambda: self.client.step(self.session_id, actions),
        )
        self.agents, self.acting_agents = r.agents, r.acting_agents
        return r.as_tuple()

    @staticmethod
    def step_batch(
        envs: Sequence[RemoteParallelEnv], actions: Sequence[Mapping[str, Any]], max_batch: int = 256
    ) -> list[tuple[dict, dict, dict, dict, dict] | MartiError]:
        """Step several remote envs of one server in ``BatchStep`` calls (one round trip per ``max_batch``).

        The call goes through the first env's client, so the envs must live on the same server (typically
        they share one channel: ``marti.make(..., channel=ch)``). Each env ends as after its own ``step``
        (``agents`` and ``acting_agents`` updated); a step that fails leaves its env (and session) as it was.

        Args:
            envs: Remote envs of one server, each at most once.
            actions: One action dict per env.
            max_batch: Most steps per ``BatchStep`` call (the server's ``max_batch_steps`` is 4096 by default).

        Returns:
            Per env, in order: its PettingZoo step tuple, or the :class:`MartiError` of its step alone.

        Raises:
            InvalidArgumentError: ``envs`` is not a list of remote envs, ``actions`` not a list of the same length,
                or ``max_batch`` not an int >= 1 (each named).
            FailedPreconditionError: In a forked child, an env whose session lives on its parent's stream
                (nothing is sent).
            UnavailableError, DeadlineExceededError, ...: The whole call failed (server away, deadline).
        """
        check_env_list(envs, actions, RemoteParallelEnv)
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise InvalidArgumentError(f"max_batch must be an int >= 1, got {max_batch!r}")
        for env in envs:
            if env._stream is not None and env._stream.forked:
                raise env._stream._forked_error()
        out: list[tuple[dict, dict, dict, dict, dict] | MartiError] = []
        if not envs:
            return out
        client = envs[0].client
        for lo in range(0, len(envs), max_batch):
            chunk = envs[lo : lo + max_batch]
            steps = [(e.session_id, a) for e, a in zip(chunk, actions[lo : lo + max_batch], strict=True)]
            for env, r in zip(chunk, client.batch_step(steps), strict=True):
                if isinstance(r, SessionLostError):
                    env._lost = f"the env server does not know it: {r.message}"
                    lost = env._lost_error(env._lost)
                    lost.__cause__ = r
                    out.append(lost)
                    continue
                if isinstance(r, MartiError):
                    out.append(r)
                    continue
                env.agents, env.acting_agents = r.agents, r.acting_agents
                out.append(r.as_tuple())
        return out

    def render(self) -> None:
        """Remote envs do not render."""
        return None

    def close(self) -> None:
        """Close the session and, when owned, the channel (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._stream is not None:
                self._stream.close()
            else:
                self.client.close_session(self.session_id)
        except MartiError:
            pass
        if self._own_client:
            self.client.close()
        if self.on_close is not None:
            self.on_close()


class AsyncEnvClient:
    """``grpc.aio`` twin of :class:`EnvClient` (same methods, awaitable).

    Args:
        address: ``host:port``.
        token: Bearer token; ``None`` reads ``MARTI_ENV_TOKEN``, then ``MARTI_TOKEN``.
        tls_ca_file: CA file for TLS.
        timeout_s: Per-call deadline, seconds.
        channel: An existing ``grpc.aio.Channel`` to use instead of dialing (``token`` and ``tls_ca_file`` are
            then ignored); not closed by :meth:`close`.
        deltas: Ask for delta results (see :class:`EnvClient`).

    Raises:
        InvalidArgumentError: The token (given or from the environment) is not printable ASCII; raised at
            construction, before any rpc, naming the position of the bad character but not the token.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls_ca_file: str | None = None,
        timeout_s: float | None = None,
        channel: grpc.aio.Channel | None = None,
        deltas: bool = True,
    ) -> None:
        check_client_args(address, token, tls_ca_file, channel)
        self.timeout_s = check_timeout_s(timeout_s)
        self._own_channel = channel is None
        self.channel = channel or make_channel(
            address,
            token=token,
            tls_ca_file=tls_ca_file,
            aio=True,
            idempotent_methods=IDEMPOTENT_METHODS,
            service="env",
        )
        self.stub = pb_grpc.EnvServiceStub(self.channel)
        #: The channel's delta cache, or ``None`` when deltas are off.
        self.deltas: DeltaCache | None = delta_cache(self.channel) if deltas else None

    def _forget(self, session_id: str) -> None:
        if self.deltas is not None:
            self.deltas.drop(session_id)

    async def list_envs(self) -> list[dict[str, Any]]:
        """See :meth:`EnvClient.list_envs`."""
        return [
            _describe(d) for d in (await acall(self.stub.ListEnvs, pb.ListEnvsRequest(), self.timeout_s)).envs
        ]

    @checked
    async def create_session(
        self,
        env_id: str,
        config: Mapping[str, Any] | None = None,
        seed: int | None = None,
        request_id: str | None = None,
    ) -> SessionInfo:
        """See :meth:`EnvClient.create_session`."""
        return _session_info(
            await acall(
                self.stub.CreateSession, _create_request(env_id, config, seed, request_id), self.timeout_s
            )
        )

    @checked
    async def reset(
        self,
        session_id: str,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        request_id: str | None = None,
    ) -> StepResult:
        """See :meth:`EnvClient.reset`."""
        try:
            resp = await acall(
                self.stub.Reset, _reset_request(session_id, seed, options, request_id), self.timeout_s
            )
        except SessionLostError:
            self._forget(session_id)
            raise
        return _decode(self.deltas, session_id, resp, None)

    @checked
    async def step(
        self, session_id: str, actions: Mapping[str, Any], request_id: str | None = None
    ) -> StepResult:
        """See :meth:`EnvClient.step`."""
        held = self.deltas.get(session_id) if self.deltas is not None else None
        try:
            resp = await acall(
                self.stub.Step, _step_request(session_id, actions, request_id, held), self.timeout_s
            )
        except SessionLostError:
            self._forget(session_id)
            raise
        return _decode(self.deltas, session_id, resp, held)

    @checked
    async def batch_step(
        self, steps: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[StepResult | MartiError]:
        """See :meth:`EnvClient.batch_step`. Several calls may be in flight at once (``asyncio.gather``) on
        distinct sessions, which keeps the server busy while the client decodes."""
        req, helds = _batch_request(self.deltas, steps)
        items = (await acall(self.stub.BatchStep, req, self.timeout_s)).items
        return _batch_results(self.deltas, steps, helds, items)

    @checked
    async def close_session(self, session_id: str) -> bool:
        """See :meth:`EnvClient.close_session`."""
        self._forget(session_id)
        return (
            await acall(
                self.stub.CloseSession,
                pb.CloseSessionRequest(session_id=_session_id(session_id)),
                self.timeout_s,
            )
        ).closed

    async def close(self) -> None:
        """Close the channel (when this client dialed it)."""
        if self._own_channel:
            await self.channel.close()

    async def __aenter__(self) -> AsyncEnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
