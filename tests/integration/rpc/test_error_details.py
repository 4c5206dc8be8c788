"""Typed errors travel as status code plus a ``google.rpc.ErrorInfo`` detail (the gRPC rich error model), for any
service: a core raises the class, the shared interceptor adds the detail, clients rebuild the class from the
detail (never from the message text), on unary calls, server streams, in-band statuses and the aio stack."""

from __future__ import annotations

import asyncio
import pickle

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from marti import errors
from marti.rpc.errors import error_for_code, from_rpc_error, from_status_proto, to_status_proto
from marti.rpc.serving.server import ServiceSpec
from marti.rpc.testing import serve_in_thread
from services.trainer.job.connections.reconnect import is_outage

SERVICE = "marti.test.Lost"


class QuotaGoneError(errors.ResourceExhaustedError):
    """A test-only typed error with its own reason: the mapping must need no table entry for it."""

    reason = "QUOTA_GONE"


def _spec() -> ServiceSpec:
    async def unary(request: bytes, context) -> bytes:
        if request == b"lost":
            raise errors.SessionLostError("session 'ep-1' is gone", session_id="ep-1")
        if request == b"quota":
            raise QuotaGoneError("no quota", metadata={"left": "0"})
        raise errors.NotFoundError("session 'ep-2' not found")  # says "session", but is not SessionLost

    async def stream(request: bytes, context):
        yield b"one"
        raise errors.SessionLostError("lost mid-stream", session_id="s9")

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
        },
    )
    return ServiceSpec(SERVICE, lambda server: server.add_generic_rpc_handlers((handler,)))


@pytest.fixture(scope="module")
def address():
    with serve_in_thread([_spec()]) as server:
        yield server.address


def _fail(channel: grpc.Channel, payload: bytes) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary(f"/{SERVICE}/Unary")(payload, timeout=5)
    return info.value


def test_session_lost_is_not_found_with_error_info(address):
    with grpc.insecure_channel(address) as channel:
        err = _fail(channel, b"lost")
    assert err.code() == grpc.StatusCode.NOT_FOUND
    status = rpc_status.from_call(err)
    info = error_details_pb2.ErrorInfo()
    assert status is not None and status.details[0].Unpack(info)
    assert (info.reason, info.domain, dict(info.metadata)) == (
        "SESSION_LOST",
        "marti.ai",
        {"session_id": "ep-1"},
    )
    mapped = from_rpc_error(err)
    assert type(mapped) is errors.SessionLostError and isinstance(mapped, errors.NotFoundError)
    assert mapped.session_id == "ep-1" and mapped.message == "session 'ep-1' is gone"
    assert is_outage(mapped)


def test_class_comes_from_the_detail_not_the_message(address):
    with grpc.insecure_channel(address) as channel:
        plain = from_rpc_error(_fail(channel, b"other"))
        custom = from_rpc_error(_fail(channel, b"quota"))
    assert type(plain) is errors.NotFoundError and "session" in str(plain)
    assert not is_outage(plain), "is_outage is type-based: a message that says 'session' is not enough"
    assert type(custom) is QuotaGoneError and custom.metadata == {"left": "0"}
    # the same message without a detail stays a plain NotFoundError
    assert type(error_for_code(grpc.StatusCode.NOT_FOUND, "session 'ep-1' is gone")) is errors.NotFoundError


def test_reason_only_counts_with_its_own_code():
    status = to_status_proto(errors.SessionLostError("x", session_id="a"))
    status.code = grpc.StatusCode.INTERNAL.value[0]
    assert type(from_status_proto(status)) is errors.InternalError


def test_server_stream_error_carries_the_detail(address):
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_stream(f"/{SERVICE}/Stream")(b"", timeout=5)
        got = []
        with pytest.raises(grpc.RpcError) as info:
            for item in call:
                got.append(item)
    assert got == [b"one"]
    mapped = from_rpc_error(info.value)
    assert type(mapped) is errors.SessionLostError and mapped.session_id == "s9"


def test_aio_client_maps_the_detail(address):
    async def run() -> errors.MartiError:
        async with grpc.aio.insecure_channel(address) as channel:
            try:
                await channel.unary_unary(f"/{SERVICE}/Unary")(b"lost", timeout=5)
            except grpc.RpcError as e:
                return from_rpc_error(e)
        raise AssertionError("the call must fail")

    mapped = asyncio.run(run())
    assert type(mapped) is errors.SessionLostError and mapped.session_id == "ep-1"


def test_in_band_status_round_trip_and_pickle():
    err = errors.SessionLostError("gone", session_id="abc")
    back = from_status_proto(to_status_proto(err))
    assert type(back) is errors.SessionLostError and back.session_id == "abc" and str(back) == "gone"
    again = pickle.loads(pickle.dumps(back))
    assert type(again) is errors.SessionLostError and again.session_id == "abc"
    assert len(to_status_proto(errors.NotFoundError("plain")).details) == 0
