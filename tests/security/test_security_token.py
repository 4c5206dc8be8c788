"""With a token configured, every rpc of every service (streams included) rejects a missing or wrong token.

The suite derives the method list from the generated descriptors, so a new rpc is covered without editing
this file. The standard health service stays open (liveness probes carry no secrets); reflection needs the
token like any other service.
"""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from marti.rpc.client.channel import make_channel
from marti.rpc.settings import ServerSettings

from .stack import METHOD_IDS, METHODS, call_raw, request_class

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def secured(stack_factory) -> str:
    """Address of all four services behind ``TOKEN``."""
    return stack_factory(ServerSettings(host="127.0.0.1", port=0, token=TOKEN))


BAD_METADATA = {
    "missing": (),
    "wrong": (("authorization", "Bearer not-the-token"),),
    "prefix": (("authorization", f"Bearer {TOKEN[:-1]}"),),
    "longer": (("authorization", f"Bearer {TOKEN}x"),),
    "no-scheme": (("authorization", TOKEN),),
    "basic-scheme": (("authorization", f"Basic {TOKEN}"),),
    "empty": (("authorization", ""),),
    "bearer-only": (("authorization", "Bearer "),),
    "non-ascii-bin": (("authorization-bin", "Bearer \u00e9".encode()),),
}


@pytest.mark.parametrize(("service", "method"), METHODS, ids=METHOD_IDS)
def test_every_rpc_rejects_missing_and_wrong_tokens(secured, service, method):
    channel = grpc.insecure_channel(secured)
    request = request_class(method)().SerializeToString()
    try:
        for label, metadata in BAD_METADATA.items():
            code, details = call_raw(channel, service, method, [request], metadata=metadata)
            assert code == grpc.StatusCode.UNAUTHENTICATED, (label, code, details)
            assert "token" in details or "authorization" in details, (label, details)
    finally:
        channel.close()


@pytest.mark.parametrize(("service", "method"), METHODS, ids=METHOD_IDS)
def test_every_rpc_accepts_the_right_token(secured, service, method):
    """With the right token the call reaches the servicer: whatever it answers, it is not UNAUTHENTICATED."""
    channel = grpc.insecure_channel(secured)
    request = request_class(method)().SerializeToString()
    try:
        code, details = call_raw(
            channel, service, method, [request], metadata=(("authorization", f"Bearer {TOKEN}"),), timeout_s=1
        )
        assert code != grpc.StatusCode.UNAUTHENTICATED, details
        # the lower-case scheme is accepted too (RFC 6750 schemes are case-insensitive)
        code, _ = call_raw(
            channel, service, method, [request], metadata=(("authorization", f"bearer {TOKEN}"),), timeout_s=1
        )
        assert code != grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()


def test_sdk_channels_send_the_token_sync_and_aio(secured):
    from marti.clients.broker import MartiCommClient

    with pytest.raises(Exception) as info:
        MartiCommClient("a1", secured, session="s", timeout_s=2)
    assert type(info.value).__name__ == "UnauthenticatedError"
    ok = MartiCommClient("a1", secured, session="s", token=TOKEN, timeout_s=2)
    ok.send_message("a1", {"x": 1})
    ok.flush()
    assert [m.content for m in ok.get_messages(timeout_s=2)] == [{"x": 1}]
    ok.close()


async def test_aio_channel_streams_need_the_token(secured):
    from marti.api.trainer.v1 import trainer_service_pb2, trainer_service_pb2_grpc

    for token, expected in ((None, grpc.StatusCode.UNAUTHENTICATED), (TOKEN, grpc.StatusCode.NOT_FOUND)):
        channel = make_channel(secured, token=token, aio=True)
        stub = trainer_service_pb2_grpc.TrainerServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.StreamMetrics(
                trainer_service_pb2.StreamMetricsRequest(job_id="nope"), timeout=2
            ):
                pass
        assert info.value.code() == expected
        await channel.close()


def test_health_is_open_but_reflection_is_not(secured):
    channel = grpc.insecure_channel(secured)
    health = health_pb2_grpc.HealthStub(channel)
    assert (
        health.Check(health_pb2.HealthCheckRequest(), timeout=10).status
        == health_pb2.HealthCheckResponse.SERVING
    )
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    req = reflection_pb2.ServerReflectionRequest(list_services="")
    with pytest.raises(grpc.RpcError) as info:
        list(stub.ServerReflectionInfo(iter([req]), timeout=10))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    channel.close()
