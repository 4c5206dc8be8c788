"""Sessions on bidi streams of a pool's env servers (:class:`EnvPoolStream`, made by :meth:`.pool.EnvPool.stream`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from marti.errors import (
    FailedPreconditionError,
    MartiError,
)
from marti.plumbing.arguments import checked

from .placement import T, _place, _Routes, name_server
from .stream import SessionStream
from .types import SessionInfo, StepResult

if TYPE_CHECKING:
    from .pool import EnvPool


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

    @checked(own=("actions",))
    def step(self, session_id: str, actions: Mapping[str, Any], request_id: str | None = None) -> StepResult:
        """Step a session on its server's stream (errors as in :meth:`EnvPool.reset`)."""
        return self._routed(session_id, lambda s: s.step(session_id, actions, request_id))

    @checked(own=("steps",))
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
