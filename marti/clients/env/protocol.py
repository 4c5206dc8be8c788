"""The env SDK's protocol, shared by the sync and async clients, streams and pools (no I/O): the service
name and its retry-safe methods, argument checks, the request builders and the decoding of responses, and
:class:`EnvSessions`, the typed ``Protocol`` that :class:`~.sync_client.EnvClient` and
:class:`~.pool.EnvPool` both satisfy."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from marti.api.env.v1 import env_pb2 as pb
from marti.codec.env import (
    map_to_proto,
    space_from_proto,
    value_from_proto,
    value_to_proto,
)
from marti.env.guard import (
    check_actions,
    check_env_id,
    check_options,
    check_seed,
    check_wire_map,
)
from marti.errors import (
    InternalError,
    InvalidArgumentError,
    MartiError,
    SessionLostError,
)
from marti.rpc.client.channel import check_channel
from marti.rpc.errors import from_status_proto

from .delta import DeltaCache, HeldResult, _decode
from .types import AgentInfo, EnvServerInfo, SessionInfo, StepResult

SERVICE = "marti.api.env.v1.EnvService"
#: Methods safe to retry on UNAVAILABLE (Step and Reset are made safe by request ids).
IDEMPOTENT_METHODS = tuple(
    (SERVICE, m) for m in ("ListEnvs", "CreateSession", "Reset", "Step", "BatchStep", "CloseSession")
)


def _session_info(resp: pb.CreateSessionResponse) -> SessionInfo:
    agents = tuple(
        AgentInfo(a.agent, a.role, space_from_proto(a.observation_space), space_from_proto(a.action_space))
        for a in resp.agents
    )
    return SessionInfo(resp.session_id, resp.env_id, agents, int(resp.idle_timeout_ms), tuple(resp.metrics))


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


def _server_info(resp: pb.ListEnvsResponse) -> EnvServerInfo:
    """Decode a ``ListEnvs`` answer with the server's load (``live_sessions`` unset: an older server)."""
    load = resp.HasField("live_sessions")
    return EnvServerInfo(
        [_describe(d) for d in resp.envs],
        int(resp.live_sessions) if load else None,
        int(resp.max_sessions) if load else None,
    )


def check_client_args(address: Any, token: Any, tls_ca_file: Any, channel: Any) -> None:
    """The argument checks of every env client's constructor (sync and aio), before any channel is opened.

    Raises:
        InvalidArgumentError: ``address`` is not a non-empty string (without ``channel``), ``token`` not a
            string or None, ``tls_ca_file`` not a path or None, or ``channel`` not a gRPC channel; each named.
    """
    if check_channel(channel) is None and (not isinstance(address, str) or not address):
        raise InvalidArgumentError(
            f"address must be a 'host:port' string, got {type(address).__name__} {address!r}"
        )
    if token is not None and not isinstance(token, str):
        raise InvalidArgumentError(f"token must be a str or None, got {type(token).__name__}")
    if tls_ca_file is not None and not isinstance(tls_ca_file, (str, os.PathLike)):
        raise InvalidArgumentError(f"tls_ca_file must be a path or None, got {type(tls_ca_file).__name__}")


def check_env_list(envs: Any, actions: Any, kind: type | None = None) -> None:
    """Check the ``envs`` and ``actions`` of a many-env step (``step_batch``, ``marti.env.make.step_many``).

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
    check_wire_map(config, "config")
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


def check_steps(steps: Any) -> None:
    """Check ``batch_step``'s ``steps``: a sequence of ``(session_id, actions)`` pairs (each pair's parts are
    checked when its request is built).

    Raises:
        InvalidArgumentError: Not a sequence, or an item that is not a pair (``steps[i]`` named).
    """
    if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
        raise InvalidArgumentError(
            f"steps must be a list of (session_id, actions) pairs, got {type(steps).__name__}"
        )
    for i, item in enumerate(steps):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise InvalidArgumentError(f"steps[{i}] must be a (session_id, actions) pair, got {item!r:.80}")


def _batch_request(
    cache: DeltaCache | None, steps: Sequence[tuple[str, Mapping[str, Any]]]
) -> tuple[pb.BatchStepRequest, list[HeldResult | None]]:
    """The ``BatchStepRequest`` of ``(session_id, actions)`` pairs, with each session's held result as base.

    Raises:
        InvalidArgumentError: ``steps`` is not a sequence of ``(session_id, actions)`` pairs (the bad item named).
    """
    check_steps(steps)
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


@runtime_checkable
class EnvSessions(Protocol):
    """The session calls of the env service, as one server's :class:`~.sync_client.EnvClient` and a pool of
    servers' :class:`~.pool.EnvPool` (each session pinned to the server that made it) both make them: code typed
    against this protocol (``marti.list_envs``, :func:`~.pool.open_env_sessions`' callers) takes either.

    Every method raises the :mod:`marti.errors` classes named on :class:`~.sync_client.EnvClient`'s methods.
    """

    def list_envs(self) -> list[dict[str, Any]]:
        """The registered envs (one dict per env id: id, description, config schema, agents, roles, spaces)."""
        ...

    def create_session(
        self, env_id: str, config: Mapping[str, Any] | None = None, seed: int | None = None
    ) -> SessionInfo:
        """Create a session of ``env_id`` with ``config``; ``seed`` seeds its first reset without a seed."""
        ...

    def reset(
        self,
        session_id: str,
        seed: int | None = None,
        options: Mapping[str, Any] | None = None,
        request_id: str | None = None,
    ) -> StepResult:
        """Reset a session (rewards 0)."""
        ...

    def step(self, session_id: str, actions: Mapping[str, Any], request_id: str | None = None) -> StepResult:
        """Step a session with agent -> action."""
        ...

    def batch_step(self, steps: Sequence[tuple[str, Mapping[str, Any]]]) -> list[StepResult | MartiError]:
        """Step many ``(session_id, actions)`` pairs; one result or that step's own error each, in order."""
        ...

    def close_session(self, session_id: str) -> bool:
        """Close a session (idempotent); True when it existed."""
        ...

    def close(self) -> None:
        """Close the connection(s) this object dialed."""
        ...

    def __enter__(self) -> EnvSessions: ...

    def __exit__(self, *exc: object) -> None: ...
