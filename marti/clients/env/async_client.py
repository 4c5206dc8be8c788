"""The ``grpc.aio`` env client (:class:`AsyncEnvClient`), twin of :class:`~.sync_client.EnvClient`."""

from __future__ import annotations

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
from marti.rpc.client.calls import acall
from marti.rpc.client.channel import check_timeout_s, make_channel
from marti.rpc.client.guard import ClientChannel
from marti.rpc.client.message_limits import receive_limit, receive_limit_metadata

from .delta import DeltaCache, _decode, delta_cache
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
from .types import EnvServerInfo, SessionInfo, StepResult


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
        options: Extra grpc channel arguments of the channel the client dials (as
            :func:`~marti.clients.env.open_channel` takes them; unused with ``channel``). Its
            ``grpc.max_receive_message_length`` (64 MiB by default) is told to the server, which then fails a
            larger result in-band (``ResourceExhaustedError`` for that step alone).

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
        options: Sequence[tuple[str, Any]] = (),
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
            options=options,
            service="env",
        )
        self.channel = ClientChannel(self.channel, f"the env client of {address or 'its channel'}")
        self.stub = pb_grpc.EnvServiceStub(self.channel)
        #: The channel's delta cache, or ``None`` when deltas are off.
        self.deltas: DeltaCache | None = delta_cache(self.channel.inner) if deltas else None
        #: The metadata telling the server the channel's receive limit, on each call that returns a result.
        self._limit = receive_limit_metadata(receive_limit(self.channel))

    def _forget(self, session_id: str) -> None:
        if self.deltas is not None:
            self.deltas.drop(session_id)

    async def list_envs(self) -> list[dict[str, Any]]:
        """See :meth:`EnvClient.list_envs`."""
        return [
            _describe(d) for d in (await acall(self.stub.ListEnvs, pb.ListEnvsRequest(), self.timeout_s)).envs
        ]

    async def server_info(self) -> EnvServerInfo:
        """See :meth:`EnvClient.server_info`."""
        return _server_info(await acall(self.stub.ListEnvs, pb.ListEnvsRequest(), self.timeout_s))

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
                self.stub.Reset,
                _reset_request(session_id, seed, options, request_id),
                self.timeout_s,
                self._limit,
            )
        except SessionLostError:
            self._forget(session_id)
            raise
        return _decode(self.deltas, session_id, resp, None)

    @checked(own=("actions",))
    async def step(
        self, session_id: str, actions: Mapping[str, Any], request_id: str | None = None
    ) -> StepResult:
        """See :meth:`EnvClient.step`."""
        held = self.deltas.get(session_id) if self.deltas is not None else None
        try:
            resp = await acall(
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
    async def batch_step(
        self, steps: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[StepResult | MartiError]:
        """See :meth:`EnvClient.batch_step`. Several calls may be in flight at once (``asyncio.gather``) on
        distinct sessions, which keeps the server busy while the client decodes."""
        req, helds = _batch_request(self.deltas, steps)
        items = (await acall(self.stub.BatchStep, req, self.timeout_s, self._limit)).items
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
        """Close the channel (when this client dialed it); later calls, and a call waiting now, raise the
        closed-client ``FailedPreconditionError``."""
        self.channel.mark_closed()
        if self._own_channel:
            await self.channel.close()

    async def __aenter__(self) -> AsyncEnvClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
