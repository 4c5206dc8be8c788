"""One delivered message that does not decode fails alone (review s4 finding 6), over a real broker on
port 0.

A payload declared ``application/json`` that does not parse (here sent by a client in another language, as
the SDK refuses to send one) is neither handed out nor acked, and the error naming it is raised; the good
messages delivered with it are handed out and acked. Before, the whole delivery was withheld, delivered
again and dead-lettered. The SDK refuses to send bytes labeled JSON that do not parse.
"""

from __future__ import annotations

import time

import pytest

from marti.api.broker.v1 import broker_pb2
from marti.api.broker.v1 import broker_service_pb2 as pb
from marti.api.broker.v1 import broker_service_pb2_grpc as pb_grpc
from marti.api.common.v1 import common_pb2
from marti.clients.broker import AsyncMartiCommClient, MartiCommClient
from marti.errors import InvalidArgumentError
from marti.rpc.client.channel import make_channel
from marti.rpc.testing import serve_in_thread
from services.comm_broker.servicer import broker_service
from services.comm_broker.settings import BrokerSettings

ATTEMPTS = 2


@pytest.fixture(scope="module")
def address():
    settings = BrokerSettings(port=0, tick_interval_s=0.05, ack_timeout_s=0.3, max_delivery_attempts=ATTEMPTS)
    with serve_in_thread(lambda: [broker_service(settings)], settings) as server:
        yield server.address


def send_raw(address: str, session: str, payloads: list[bytes]) -> None:
    """Sends ``payloads`` (each declared ``application/json``, as they are) from ``x`` to ``b`` in one
    Send, as a client that does not check them would."""
    envelopes = [
        broker_pb2.Envelope(
            message_id=f"raw-{i}",
            sender="x",
            receivers=["b"],
            sequence=i + 1,
            content_type="application/json",
            payload=p,
        )
        for i, p in enumerate(payloads)
    ]
    raw = broker_pb2.EnvelopeBatch(envelopes=envelopes).SerializeToString()
    frame = common_pb2.CompressedFrame(codec=common_pb2.CODEC_NONE, uncompressed_bytes=len(raw), data=raw)
    channel = make_channel(address)
    try:
        pb_grpc.BrokerServiceStub(channel).Send(pb.SendRequest(session=session, sender="x", frame=frame))
    finally:
        channel.close()


def test_the_good_messages_of_a_delivery_are_handed_out_and_the_bad_one_fails_alone(address):
    with MartiCommClient("b", address, session="poison") as b:
        send_raw(address, "poison", [b'"good-1"', b"{bad", b'"good-2"'])
        assert [m.content for m in b.get_messages(timeout_s=2)] == ["good-1", "good-2"]
        with pytest.raises(InvalidArgumentError, match="'raw-1' from 'x'.*does not parse"):
            b.get_messages()  # the next call raises the bad one's error
        # the bad one comes back alone until it is dead-lettered; the good ones never come back
        errors, got, deadline = 0, [], time.monotonic() + 5
        while time.monotonic() < deadline and b.get_broker_stats().dead_lettered == 0:
            try:
                got += b.get_messages(timeout_s=0.2)
            except InvalidArgumentError:
                errors += 1
        stats = b.get_broker_stats()
    assert got == [] and errors >= 1
    assert (stats.acked, stats.dead_lettered) == (2, 1)


def test_subscribe_hands_out_the_good_messages_then_raises(address):
    with MartiCommClient("b", address, session="poison-sub") as b:
        send_raw(address, "poison-sub", [b'"good-1"', b"{bad", b'"good-2"'])
        got = []
        with pytest.raises(InvalidArgumentError, match="'raw-1' from 'x'"):
            for m in b.subscribe():
                got.append(m.content)
        assert got == ["good-1", "good-2"]
        b.flush()
        assert b.get_broker_stats().acked == 2


async def test_async_get_messages_hands_out_the_good_messages(address):
    async with AsyncMartiCommClient("b", address, session="poison-async") as b:
        send_raw(address, "poison-async", [b"{bad", b'"good"'])
        assert [m.content for m in await b.get_messages(timeout_s=2)] == ["good"]
        with pytest.raises(InvalidArgumentError, match="'raw-0' from 'x'"):
            await b.get_messages()


@pytest.mark.parametrize("payload", [b"{bad", b'{"a": 1', b"nan"])
def test_the_sdk_refuses_to_send_bytes_labeled_json_that_do_not_parse(address, payload):
    session = f"refuse-json-{len(payload)}"
    with (
        MartiCommClient("a", address, session=session) as a,
        MartiCommClient("b", address, session=session) as b,
    ):
        with pytest.raises(InvalidArgumentError, match="message is bytes labeled 'application/json'"):
            a.send_message("b", payload, content_type="application/json")
        with pytest.raises(InvalidArgumentError, match="state is bytes labeled"):
            a.broadcast_state(payload, content_type="application/json; charset=utf-8")
        a.send_message("b", b'{"ok": 1}', content_type="application/json")  # valid JSON bytes still go
        a.flush()
        assert [m.content for m in b.get_messages(timeout_s=2)] == [{"ok": 1}]
        assert b.get_agent_states() == {}
