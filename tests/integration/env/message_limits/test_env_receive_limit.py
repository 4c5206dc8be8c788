"""A result the env server may send but the client may not receive (over the client channel's
``grpc.max_receive_message_length``, under the server's ``max_message_bytes``) is an in-band
``ResourceExhaustedError`` naming the session and both limits: the SDK's clients tell the server their receive
limit (``marti-max-receive-bytes`` metadata). Before, the server sent it, the client's gRPC refused it, and on the
``Session`` stream that ended the stream and every session on it."""

from __future__ import annotations

import re

import grpc
import pytest

from marti.api.env.v1 import env_pb2 as pb
from marti.api.env.v1 import env_service_pb2_grpc as pb_grpc
from marti.clients.env import AsyncEnvClient, EnvClient, open_channel
from marti.clients.env.protocol import _step_request
from marti.errors import InvalidArgumentError, ResourceExhaustedError
from marti.rpc.client.calls import call
from marti.rpc.client.message_limits import RECEIVE_LIMIT_KEY
from tests.integration.env.message_limits.oversized import (
    BIG_STEP,
    OK,
    SMALL_STEP,
    check_batches,
    check_stream_step,
    check_unary_step,
)
from tests.integration.env.two_text_agents import serve_echo

SERVER_LIMIT = 8 * 1024 * 1024  # the server's max_message_bytes
CLIENT_LIMIT = 1024 * 1024  # the client channel's grpc.max_receive_message_length
BIG = 1024 * 1024  # characters each agent observes after a "big" action: a result of about 2 MiB
SMALL_RECEIVER = [("grpc.max_receive_message_length", CLIENT_LIMIT)]
#: What the error says of the two limits (the client's named as such).
BOTH = f"client's receive limit, {CLIENT_LIMIT} bytes .*max_message_bytes={SERVER_LIMIT}"


@pytest.fixture(scope="module")
def address():
    with serve_echo("echo_big", BIG, max_message_bytes=SERVER_LIMIT) as address:
        yield address


def test_a_stream_step_over_the_clients_limit_keeps_the_stream_and_its_sessions(address):
    with EnvClient(address, timeout_s=20, options=SMALL_RECEIVER) as client:
        error = check_stream_step(client, "echo_big", BOTH)
    assert RECEIVE_LIMIT_KEY in str(error)


def test_a_unary_step_over_the_clients_limit_names_both_limits(address):
    with EnvClient(address, timeout_s=20, options=SMALL_RECEIVER) as client:
        check_unary_step(client, "echo_big", BOTH)


def test_a_reset_over_the_clients_limit_fails_alone_on_both_transports(address):
    with EnvClient(address, timeout_s=20, options=SMALL_RECEIVER) as client:
        stream = client.stream()
        try:
            for calls in (stream, client):
                sid = calls.create_session("echo_big").session_id
                with pytest.raises(ResourceExhaustedError, match=BOTH) as err:
                    calls.reset(sid, options={"big": True})
                assert sid in str(err.value) and "reset result" in str(err.value)
                assert calls.reset(sid).observations == {"a": "x", "b": "x"}
            assert stream.generation == 1 and not stream.broken
        finally:
            stream.close()


def test_a_batch_over_the_clients_limit_fails_only_its_large_item(address):
    """On the stream and over the unary BatchStep: the big item fails in-band, the others come back."""
    with EnvClient(address, timeout_s=20, options=SMALL_RECEIVER) as client:
        for error in check_batches(client, "echo_big"):
            assert re.search(BOTH, str(error))


def test_a_shared_channel_tells_its_limit_for_every_client_on_it(address):
    channel = open_channel(address, options=SMALL_RECEIVER)
    try:
        client = EnvClient("", channel=channel, timeout_s=20)
        sid = client.create_session("echo_big").session_id
        client.reset(sid)
        with pytest.raises(ResourceExhaustedError, match=BOTH):
            client.step(sid, BIG_STEP)
    finally:
        channel.close()


async def test_the_async_client_tells_its_limit(address):
    async with AsyncEnvClient(address, timeout_s=20, options=SMALL_RECEIVER) as client:
        ids = [(await client.create_session("echo_big")).session_id for _ in range(2)]
        for sid in ids:
            await client.reset(sid)
        with pytest.raises(ResourceExhaustedError, match=BOTH):
            await client.step(ids[0], BIG_STEP)
        got = await client.batch_step([(ids[0], SMALL_STEP), (ids[1], BIG_STEP)])
        assert got[0].observations == OK and isinstance(got[1], ResourceExhaustedError)
        assert f"client's receive limit, {CLIENT_LIMIT} bytes" in str(got[1])


def test_a_client_limit_above_the_servers_leaves_the_servers_in_force():
    """A 2 MiB result, over a server's 1 MiB max_message_bytes and under the 64 MiB the SDK client tells (its
    default): refused, naming the server's limit alone (the binding one), on both transports."""
    with (
        serve_echo("echo_over_server", BIG, max_message_bytes=CLIENT_LIMIT) as small,
        EnvClient(small, timeout_s=20) as client,
    ):
        for error in (
            check_stream_step(client, "echo_over_server", f"max_message_bytes={CLIENT_LIMIT}"),
            check_unary_step(client, "echo_over_server", f"max_message_bytes={CLIENT_LIMIT}"),
        ):
            assert "over the env server's max_message_bytes" in str(error)
            assert "client's receive limit" not in str(error) and str(64 << 20) not in str(error)


def test_a_client_limit_above_the_servers_result_comes_back_whole(address):
    """A 2 MiB result to a client that takes 64 MiB (the default), under the server's 8 MiB: sent."""
    with EnvClient(address, timeout_s=20) as client:
        stream = client.stream()
        try:
            sid = stream.create_session("echo_big").session_id
            stream.reset(sid)
            assert stream.step(sid, BIG_STEP).observations["a"] == "x" * BIG
        finally:
            stream.close()


def _raw_step(address: str, metadata: tuple[tuple[str, str], ...]) -> pb.StepResponse:
    """A ``Step`` over a raw gRPC channel (64 MiB receive limit) sending ``metadata``, of a fresh reset session
    whose result is about 2 MiB."""
    with grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
        stub = pb_grpc.EnvServiceStub(channel)
        sid = call(stub.CreateSession, pb.CreateSessionRequest(env_id="echo_big"), 20).session_id
        call(stub.Reset, pb.ResetRequest(session_id=sid), 20)
        return call(stub.Step, _step_request(sid, BIG_STEP, None), 20, metadata)


@pytest.mark.parametrize("told", [(), ((RECEIVE_LIMIT_KEY, "-1"),)], ids=["nothing", "no-limit"])
def test_a_client_that_tells_nothing_or_no_limit_gets_what_the_server_may_send(address, told):
    assert _raw_step(address, told).ByteSize() > 2 * BIG


@pytest.mark.parametrize("value", ["abc", "-2", "1.5", "", " 10"])
def test_a_bad_told_limit_is_invalid_argument_naming_it(address, value):
    with pytest.raises(InvalidArgumentError, match=re.escape(f"{RECEIVE_LIMIT_KEY}={value!r}")):
        _raw_step(address, ((RECEIVE_LIMIT_KEY, value),))


def test_a_bad_told_limit_ends_a_session_stream_with_invalid_argument(address):
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.EnvServiceStub(channel)
        req = pb.SessionRequest(sequence=1, create=pb.CreateSessionRequest(env_id="echo_big"))
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Session(iter([req]), timeout=20, metadata=((RECEIVE_LIMIT_KEY, "lots"),)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{RECEIVE_LIMIT_KEY}='lots'" in err.value.details()


def test_a_raw_channel_that_tells_nothing_gets_the_hint_naming_its_option(address):
    """A raw gRPC channel passed as ``channel=`` tells no limit: the server sends the 2 MiB result, the client's
    gRPC refuses it, and the error says which channel argument to raise (``marti.rpc.errors``)."""
    with grpc.insecure_channel(address, options=SMALL_RECEIVER) as channel:
        client = EnvClient("", channel=channel, timeout_s=20)
        sid = client.create_session("echo_big").session_id
        client.reset(sid)
        with pytest.raises(ResourceExhaustedError, match="this client's receive limit") as err:
            client.step(sid, BIG_STEP)
    assert 'options=[("grpc.max_receive_message_length", N)] of an env' in str(err.value)
