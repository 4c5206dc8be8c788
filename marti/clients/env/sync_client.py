"""The synchronous env client (:class:`EnvClient`) and :func:`open_channel`, the channel clients and envs share."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from marti.api.env.v1 import env_pb2 as pb
from marti.api.env.v1 import env_service_pb2_grpc as pb_grpc
from marti.errors import (
    MartiError,
    SessionLostError,
)
from marti.plumbing.arguments import checked
from marti.rpc.client.calls import call
from marti.rpc.client.channel import check_timeout_s, make_channel
from marti.rpc.client.guard import ClientChannel
from marti.rpc.client.message_limits import receive_limit, receive_limit_metadata, send_limit

from .delta import DeltaCache, HeldResult, _decode, delta_cache
from .protocol import (
    IDEMPOTENT_METHODS,
    _batch_request,
    _batch_results,
    _create_request,
    _describe,
    _reset_request,
    _server_info,
    _session_id,
    _session_info,
    _step_request,
    check_client_args,
)
from .stream import SessionStream
from .types import EnvServerInfo, SessionInfo, StepResult


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
        options: Extra grpc channel arguments (e.g. ``("grpc.max_reconnect_backoff_ms", 1000)``). Its
            ``grpc.max_receive_message_length`` (64 MiB by default) is told to the server by the env clients
            on this channel, which then fails a larger result in-band (``ResourceExhaustedError`` for that
            step alone) instead of sending what gRPC here would refuse.

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
        self.channel = ClientChannel(self.channel, f"the env client of {address or 'its channel'}")
        self.stub = pb_grpc.EnvServiceStub(self.channel)
        #: The channel's delta cache, or ``None`` when deltas are off.
        self.deltas: DeltaCache | None = delta_cache(self.channel.inner) if deltas else None
        #: The metadata telling the server the channel's receive limit, on each call that returns a result.
        self._limit = receive_limit_metadata(receive_limit(self.channel))

    def list_envs(self) -> list[dict[str, Any]]:
        """List registered envs (id, description, config schema, agents, roles, space descriptions)."""
        return [_describe(d) for d in call(self.stub.ListEnvs, pb.ListEnvsRequest(), self.timeout_s).envs]

    def server_info(self) -> EnvServerInfo:
        """The registered envs (as :meth:`list_envs`) with the server's live sessions and session cap, from one
        ``ListEnvs`` call (what ``marti top`` shows)."""
        return _server_info(call(self.stub.ListEnvs, pb.ListEnvsRequest(), self.timeout_s))

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
                self.stub.Reset,
                _reset_request(session_id, seed, options, request_id),
                self.timeout_s,
                self._limit,
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

    @checked(own=("actions",))
    def step(self, session_id: str, actions: Mapping[str, Any], request_id: str | None = None) -> StepResult:
        """Step a session; a retry with the same ``request_id`` returns the first result.

        Raises:
            InvalidArgumentError: Unknown or done agent, missing or oversized action.
            FailedPreconditionError: Step before reset or after the episode ended.
            SessionLostError: Unknown (closed, reaped, or lost in a server restart) session; a
                ``NotFoundError`` mapped from the status's ``ErrorInfo`` detail (reason ``SESSION_LOST``).
            ResourceExhaustedError: The result is over the server's ``max_message_bytes`` or this channel's
                receive limit (both named, less 1 KiB); the step did run.
            InternalError: A delta result that does not fit the held result (a server bug).
        """
        held = self._held(session_id)
        try:
            resp = call(
                self.stub.Step,
                _step_request(session_id, actions, request_id, held),
                self.timeout_s,
                self._limit,
            )
        except SessionLostError:
            self._forget(session_id)
            raise
        return _decode(self.deltas, session_id, resp, held)

    @checked(own=("steps",))
    def batch_step(self, steps: Sequence[tuple[str, Mapping[str, Any]]]) -> list[StepResult | MartiError]:
        """Step many sessions in one call.

        Args:
            steps: ``(session_id, actions)`` pairs.

        Returns:
            One entry per step, in order: a :class:`StepResult`, or the :class:`MartiError` of that step alone
            (``ResourceExhaustedError`` for a result the batch's response had no room for, see :meth:`step`).
        """
        req, helds = _batch_request(self.deltas, steps)
        items = call(self.stub.BatchStep, req, self.timeout_s, self._limit).items
        return _batch_results(self.deltas, steps, helds, items)

    @checked
    def close_session(self, session_id: str) -> bool:
        """Close a session (idempotent); True when it existed."""
        self._forget(session_id)
        return call(
            self.stub.CloseSession, pb.CloseSessionRequest(session_id=_session_id(session_id)), self.timeout_s
        ).closed

    def stream(self) -> SessionStream:
        """Open a bidirectional :class:`SessionStream` on this client's channel (sharing its delta cache). When the
        channel was made by :func:`open_channel` (this client's own, or one passed as ``channel=``), the stream
        refuses a request over the channel's send limit before sending it, and tells the server the channel's
        receive limit (see :class:`SessionStream`)."""
        return SessionStream(
            self.stub,
            self.timeout_s,
            self.deltas,
            max_request_bytes=send_limit(self.channel),
            max_response_bytes=receive_limit(self.channel),
        )

    def close(self) -> None:
        """Close the channel (when this client dialed it).

        In a process forked from the one that dialed it, the channel is left to the parent (kept referenced,
        not closed): closing it there could block for good. Later calls raise the closed-client
        ``FailedPreconditionError``.
        """
        self.channel.mark_closed()
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
