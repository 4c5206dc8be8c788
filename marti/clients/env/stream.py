"""The env server's bidirectional ``Session`` stream as a client (:class:`SessionStream`)."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grpc

from marti.api.env.v1 import env_pb2 as pb
from marti.api.env.v1 import env_service_pb2_grpc as pb_grpc
from marti.errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    MartiError,
    ResourceExhaustedError,
    SessionLostError,
    UnavailableError,
)
from marti.plumbing.arguments import checked
from marti.rpc.client.message_limits import receive_limit_metadata
from marti.rpc.client.watchdog import WATCHDOG
from marti.rpc.errors import from_rpc_error, from_status_proto

from .delta import DeltaCache, _decode
from .protocol import (
    _batch_request,
    _batch_results,
    _create_request,
    _reset_request,
    _session_id,
    _session_info,
    _step_request,
)
from .types import SessionInfo, StepResult

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

    Size: gRPC refuses to send a message over its channel's ``grpc.max_send_message_length``, and on a stream
    that refusal ends the stream, closing every session on it. With ``max_request_bytes`` (what
    :meth:`EnvClient.stream` passes for a channel :func:`open_channel` made) a request over it is refused before it
    is sent, with :class:`~marti.errors.ResourceExhaustedError` naming its size, the limit and the session, as the
    unary call raises; the stream and its sessions go on. The other way, gRPC here refuses a response over the
    channel's ``grpc.max_receive_message_length``, which would end the stream too: with ``max_response_bytes``
    (what :meth:`EnvClient.stream` passes for a channel :func:`open_channel` made) the stream tells the server that
    limit (:data:`~marti.rpc.client.message_limits.RECEIVE_LIMIT_KEY` metadata), and the server fails a larger result
    in-band (:class:`~marti.errors.ResourceExhaustedError` for that request alone, naming the client's limit).

    Args:
        stub: An ``EnvServiceStub``.
        timeout_s: How long to wait for each response, seconds.
        deltas: The delta cache to use (see :class:`EnvClient`), or ``None`` for full results.
        max_request_bytes: The largest request the channel may send, bytes, or ``None`` (not checked).
        max_response_bytes: The largest response the channel may receive, bytes (``-1``: any), told to the
            server; ``None``: not told (the server then fails only results over its own limit).
    """

    def __init__(
        self,
        stub: pb_grpc.EnvServiceStub,
        timeout_s: float,
        deltas: DeltaCache | None = None,
        max_request_bytes: int | None = None,
        max_response_bytes: int | None = None,
    ) -> None:
        self._stub = stub
        self.deltas = deltas
        self.max_request_bytes = max_request_bytes
        self._limit = receive_limit_metadata(max_response_bytes)
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
        told = {"metadata": self._limit} if self._limit else {}
        self._responses: Any = self._stub.Session(self._iter(requests), **told)
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
            req = pb.SessionRequest(sequence=self._seq + 1, **op)
            self._check_size(req, op)
            if self.broken:
                self._discard()
                self._forget_made()
                self._open()
            self._seq += 1
            self._requests.put(req)
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

    def _check_size(self, req: pb.SessionRequest, op: dict[str, Any]) -> None:
        """Refuse a request gRPC would not send (it would end the stream and every session on it)."""
        limit = self.max_request_bytes
        if limit is None:
            return
        size = req.ByteSize()
        if size <= limit:
            return
        (kind, body), *_ = op.items()
        if kind == "batch_step":
            target = f"sessions {sorted({step.session_id for step in body.steps})}"
        elif kind == "create":
            target = f"a new {body.env_id!r} session"
        else:
            target = f"session {body.session_id!r}"
        raise ResourceExhaustedError(
            f"the {kind} request for {target} is {size} bytes, over the {limit} bytes this channel may send "
            "(grpc.max_send_message_length); it was not sent, and the session stream and its sessions are as "
            "they were (send less: shorter actions, smaller options or config, fewer steps per batch_step)"
        )

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

    @checked(own=("actions",))
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

    @checked(own=("steps",))
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
