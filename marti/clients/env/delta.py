"""Delta results of the env SDK: the latest result per session a client holds (:class:`DeltaCache`,
one per channel) and the decoding of full and delta results into :class:`~.types.StepResult`."""

from __future__ import annotations

import json
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marti.api.env.v1 import env_pb2 as pb
from marti.codec.env import (
    DELTA_SCALARS,
    apply_text_edit,
    map_from_proto,
    value_from_proto,
)
from marti.errors import (
    InternalError,
    InvalidArgumentError,
)

from .types import StepResult


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
