"""The ``grpc.aio`` inference client (:class:`AsyncInferenceClient`), twin of
:class:`~.sync_client.InferenceClient`, and :func:`report_reward_async`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc

from marti.api.inference.v1 import inference_pb2 as pb
from marti.api.inference.v1 import inference_service_pb2_grpc as sgrpc
from marti.codec.inference import (
    generate_request,
    models_from_proto,
    receipt_from_proto,
    report_request,
    result_from_proto,
)
from marti.plumbing.arguments import checked
from marti.rpc.client.calls import acall
from marti.rpc.client.guard import ClientChannel
from marti.rpc.client.transport import LoopBoundChannel
from marti.types.inference import ChatMessages, InferenceResult, ModelInfo, RewardReceipt

from .protocol import DEFAULT_INFERENCE_TIMEOUT_S, open_channel
from .stream import AsyncCompletionStream


class AsyncInferenceClient:
    """``grpc.aio`` twin of :class:`InferenceClient` (same arguments; methods are coroutines).

    Args:
        address: ``host:port`` of the gateway's gRPC endpoint.
        token: Bearer token; ``None`` reads ``MARTI_GATEWAY_TOKEN``, then ``MARTI_TOKEN``; ``""`` sends none.
        tls_ca_file: PEM CA file; enables TLS.
        timeout_s: Default deadline of each call, seconds.
        channel: An open ``grpc.aio`` channel (``open_channel(..., aio=True)``); not closed by :meth:`close`.

    Raises:
        InvalidArgumentError: The token is not printable ASCII (at construction).
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls_ca_file: str | None = None,
        timeout_s: float = DEFAULT_INFERENCE_TIMEOUT_S,
        channel: grpc.aio.Channel | LoopBoundChannel | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._own_channel = channel is None
        self.channel = channel or open_channel(address, token=token, tls_ca_file=tls_ca_file, aio=True)
        self.channel = ClientChannel(self.channel, f"the inference client of {address or 'its channel'}")
        self.stub = sgrpc.InferenceServiceStub(self.channel)

    @checked
    async def generate(
        self,
        model: str,
        messages: ChatMessages | None = None,
        *,
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> InferenceResult:
        """See :meth:`InferenceClient.generate` (same keyword arguments)."""
        req = generate_request(model, messages, **kwargs)
        return result_from_proto(await acall(self.stub.Generate, req, timeout_s or self.timeout_s))

    async def generate_stream(
        self,
        model: str,
        messages: ChatMessages | None = None,
        *,
        timeout_s: float | None = None,
        **kwargs: Any,
    ) -> AsyncCompletionStream:
        """See :meth:`InferenceClient.generate_stream`; ``async for`` the returned stream."""
        req = generate_request(model, messages, **kwargs)
        call = self.stub.GenerateStream(
            pb.GenerateStreamRequest(request=req), timeout=timeout_s or self.timeout_s
        )
        return await AsyncCompletionStream.open(call)

    async def models(self) -> list[ModelInfo]:
        """See :meth:`InferenceClient.models`."""
        return models_from_proto(await acall(self.stub.ListModels, pb.ListModelsRequest(), self.timeout_s))

    @checked
    async def report_reward(
        self,
        episode_id: str,
        rewards: Mapping[str, float],
        *,
        call_rewards: Mapping[str, float] | None = None,
        group_id: str = "",
        group_size: int = 0,
        failed: bool = False,
        timeout_s: float | None = None,
    ) -> RewardReceipt:
        """See :meth:`InferenceClient.report_reward`."""
        req = report_request(episode_id, rewards, call_rewards, group_id, group_size, failed)
        return receipt_from_proto(await acall(self.stub.ReportReward, req, timeout_s or self.timeout_s))

    async def stats(self) -> dict[str, float]:
        """See :meth:`InferenceClient.stats`."""
        return dict((await acall(self.stub.GetStats, pb.GetStatsRequest(), self.timeout_s)).counters)

    async def close(self) -> None:
        """Close the channel (when this client dialed it); later calls, and a call waiting now, raise the
        closed-client ``FailedPreconditionError``."""
        self.channel.mark_closed()
        if self._own_channel:
            await self.channel.close()

    async def __aenter__(self) -> AsyncInferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@checked
async def report_reward_async(
    address: str,
    episode_id: str,
    rewards: Mapping[str, float],
    *,
    token: str | None = None,
    tls_ca_file: str | None = None,
    timeout_s: float = DEFAULT_INFERENCE_TIMEOUT_S,
    **kwargs: Any,
) -> RewardReceipt:
    """Async twin of :func:`report_reward` (``marti.aio.report_reward``)."""
    async with AsyncInferenceClient(
        address, token=token, tls_ca_file=tls_ca_file, timeout_s=timeout_s
    ) as client:
        return await client.report_reward(episode_id, rewards, **kwargs)
