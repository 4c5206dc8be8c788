"""The broker over real gRPC (port 0) through the sync and async SDK and raw stubs."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import grpc
import pytest

from marti.api.broker.v1 import broker_pb2
from marti.api.broker.v1 import broker_service_pb2 as pb
from marti.api.broker.v1 import broker_service_pb2_grpc as pb_grpc
from marti.api.common.v1 import common_pb2
from marti.clients.broker import AsyncMartiCommClient, MartiCommClient
from marti.codec import broker as broker_codec
from marti.errors import AbortedError, InvalidArgumentError, NotFoundError, ResourceExhaustedError
from marti.rpc.client.channel import make_channel
from marti.rpc.testing import serve_in_thread
from services.comm_broker.servicer import broker_service
from services.comm_broker.settings import BrokerSettings


def serve(**kw):
    settings = BrokerSettings(port=0, tick_interval_s=0.05, **kw)
    return serve_in_thread(lambda: [broker_service(settings)], settings)


@pytest.fixture(scope="module")
def address():
    with serve(max_payload_bytes=64 * 1024, max_mailbox_messages=50) as server:
        yield server.address


def realistic(i: int, sender: str) -> dict:
    return {
        "sender": sender,
        "step": i,
        "reward": 0.25 * (i % 4),
        "text": (
            "I looked at the remaining budget and I think we should move two units from the logistics task to "
            "the research task, because the research task has the higher expected reward this round. "
            f"Turn {i}: please confirm the plan or propose a counter-offer with your reasoning."
        ),
    }


def test_send_get_unicode_empty_and_stats(address):
    with (
        MartiCommClient("agent_1", address, session="ep-unicode") as a,
        MartiCommClient("агент_2 🤖", address, session="ep-unicode") as b,
    ):
        a.send_message("агент_2 🤖", {"plan": "déjà vu ✓"})
        a.send_message("агент_2 🤖", b"", content_type="application/x-empty")
        a.send_message("агент_2 🤖", None)
        a.flush()  # the three go out now in one batch (else after the 1 ms linger; test_broker_defaults.py)
        got = b.get_messages(timeout_s=2)
        assert [m.content for m in got] == [{"plan": "déjà vu ✓"}, b"", None]
        assert got[1].content_type == "application/x-empty"
        assert [m.sequence for m in got] == sorted(m.sequence for m in got)
        assert b.get_messages() == []  # acked automatically by this call, nothing left
        sa, sb = a.get_communication_stats(), b.get_communication_stats()
        assert (sa.total_sent, sa.total_received, sb.total_sent, sb.total_received) == (3, 0, 0, 3)
        assert sa.avg_send_latency > 0 and sb.avg_receive_latency > 0
        server = b.get_broker_stats()
        assert (server.sent, server.delivered, server.acked, server.pending, server.in_flight) == (
            3,
            3,
            3,
            0,
            0,
        )
        assert server.bytes_in_raw == sa.bytes_sent_raw and server.bytes_out_wire == sb.bytes_received_wire


def test_batching_compresses_and_flushes_by_count_and_interval(address):
    # send_when_idle=False: batches close by count or after the linger only (with it, the first message would
    # go out at once, alone; tests/integration/broker/test_broker_send_when_idle.py covers that rule)
    with (
        MartiCommClient(
            "s", address, session="ep-batch", batching_size=50, update_frequency_s=1.0, send_when_idle=False
        ) as a,
        MartiCommClient("r", address, session="ep-batch") as b,
    ):
        b.get_messages()  # join
        for i in range(50):  # the 50th closes the batch
            a.send_message("r", realistic(i, "s"))
        deadline = time.monotonic() + 10  # total_sent counts acknowledgements, which arrive in the background
        while a.get_communication_stats().total_sent < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert a.get_communication_stats().total_sent == 50
        a.send_message("r", realistic(50, "s"))
        assert a.get_communication_stats().total_sent == 50  # alone in a batch: waits for the 1 s linger
        got = []
        while len(got) < 50:
            got += b.get_messages(max_messages=100, timeout_s=1)
        assert b.get_messages(timeout_s=5)[0].content["step"] == 50  # flushed by the interval timer
        assert [m.content["step"] for m in got] == list(range(50))
        stats = a.get_communication_stats()
        assert stats.compression_ratio >= 2.5, stats
        assert b.get_communication_stats().compression_ratio >= 2.5


def test_broadcast_topics_and_late_joiner_states(address):
    with (
        MartiCommClient("a", address, session="ep-bc") as a,
        MartiCommClient("b", address, session="ep-bc", topics=["plans"]) as b,
    ):
        b.get_messages()
        a.broadcast({"hello": "all"})
        a.publish("plans", {"p": 1})
        assert [m.content for m in b.get_messages(timeout_s=1)] == [{"hello": "all"}, {"p": 1}]
        assert a.broadcast_state({"turn": 3}) == 1
        assert b.broadcast_state({"turn": 4}) == 1
        assert a.broadcast_state({"turn": 5}, expected_version=1) == 2
        with pytest.raises(AbortedError, match="expected 1"):
            a.broadcast_state({"turn": 6}, expected_version=1)
        with MartiCommClient("late", address, session="ep-bc") as late:
            assert late.get_agent_states() == {"a": {"turn": 5}, "b": {"turn": 4}}
            entries = late.get_agent_state_entries(exclude_self=False)
            assert [(e.agent_id, e.version) for e in entries] == [("a", 2), ("b", 1)]
        assert a.get_agent_states(exclude_self=True) == {"b": {"turn": 4}}


def test_limits_and_bad_input_are_typed(address):
    with MartiCommClient("a", address, session="ep-bad") as a:
        a.send_message(
            "b", b"x" * (64 * 1024 + 1)
        )  # buffered (default batching): the broker refuses it on flush
        with pytest.raises(ResourceExhaustedError, match="max_payload_bytes=65536"):
            a.flush()
        a.send_message("b", b"x" * (64 * 1024 - 200))  # under the limit (the envelope adds a few bytes)
        a.flush()
        with pytest.raises(InvalidArgumentError, match="JSON"):
            a.send_message("b", {1, 2})  # refused by the client, before anything is buffered
    with MartiCommClient("a1", address, session="ep-bad", batching_size=1) as a:  # unbatched: the send raises
        with pytest.raises(ResourceExhaustedError, match="max_payload_bytes=65536"):
            a.send_message("b", b"x" * (64 * 1024 + 1))
    with pytest.raises(InvalidArgumentError):
        MartiCommClient("", address)


def _raw_send(stub, session, frame):
    return stub.Send(pb.SendRequest(session=session, sender="evil", frame=frame), timeout=5)


def test_corrupt_truncated_and_bomb_frames_fail_alone(address):
    channel = make_channel(address)
    stub = pb_grpc.BrokerServiceStub(channel)
    batch = broker_pb2.EnvelopeBatch(
        envelopes=[broker_pb2.Envelope(message_id="m", sender="evil", receivers=["x"], payload=b"p" * 300)]
    ).SerializeToString()
    good = broker_codec.encode(batch)
    bad_frames = [
        (
            common_pb2.CompressedFrame(
                codec=common_pb2.CODEC_ZSTD, uncompressed_bytes=len(batch), data=good[:-3]
            ),
            "INVALID",
        ),
        (
            common_pb2.CompressedFrame(
                codec=common_pb2.CODEC_ZSTD, uncompressed_bytes=50, data=b"garbage!" * 8
            ),
            "INVALID",
        ),
        (
            common_pb2.CompressedFrame(
                codec=common_pb2.CODEC_NONE, uncompressed_bytes=4, data=b"\xff\xff\xff\xff"
            ),
            "INVALID",
        ),
        (
            common_pb2.CompressedFrame(codec=common_pb2.CODEC_UNSPECIFIED, uncompressed_bytes=0, data=b""),
            "INVALID",
        ),
        (
            common_pb2.CompressedFrame(codec=common_pb2.CODEC_ZSTD, uncompressed_bytes=1 << 40, data=good),
            "RESOURCE",
        ),
    ]
    for frame, code in bad_frames:
        with pytest.raises(grpc.RpcError) as info:
            _raw_send(stub, "ep-corrupt", frame)
        assert info.value.code().name.startswith(code), (info.value.code(), info.value.details())
    with (
        MartiCommClient("ok", address, session="ep-corrupt2") as c,
        MartiCommClient("x", address, session="ep-corrupt2") as x,
    ):
        c.send_message("x", "still serving")
        assert [m.content for m in x.get_messages(timeout_s=1)] == ["still serving"]
    channel.close()


def _raw_frame(*envelopes: broker_pb2.Envelope) -> common_pb2.CompressedFrame:
    raw = broker_pb2.EnvelopeBatch(envelopes=list(envelopes)).SerializeToString()
    return common_pb2.CompressedFrame(codec=common_pb2.CODEC_NONE, uncompressed_bytes=len(raw), data=raw)


def test_a_send_addressed_two_ways_is_refused_naming_them(address):
    """An envelope with receivers and a topic (or the broadcast flag) was accepted and went to the topic's
    subscribers (or every member) only: its receivers never got it. A Send now refuses it (the protocol says
    one addressing mode), naming both; the Broadcast rpc still ignores addressing fields."""
    channel = make_channel(address)
    stub = pb_grpc.BrokerServiceStub(channel)
    with MartiCommClient("r", address, session="ep-modes") as r:
        for extra, words in [
            ({"topic": "t"}, "receivers ['r'], topic 't'"),
            ({"broadcast": True}, "broadcast flag"),
        ]:
            envelope = broker_pb2.Envelope(
                message_id=f"m-{words}", sender="w", receivers=["r"], payload=b"1", **extra
            )
            with pytest.raises(grpc.RpcError) as info:
                stub.Send(
                    pb.SendRequest(session="ep-modes", sender="w", frame=_raw_frame(envelope)), timeout=5
                )
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "is addressed 2 ways" in info.value.details() and words in info.value.details()
        envelope = broker_pb2.Envelope(message_id="b1", sender="w", receivers=["r"], topic="t", payload=b"2")
        resp = stub.Broadcast(pb.BroadcastRequest(session="ep-modes", sender="w", frame=_raw_frame(envelope)))
        assert resp.enqueued == 1
        assert [m.payload for m in r.get_messages(timeout_s=1)] == [b"2"]  # the broadcast alone came
    channel.close()


def test_unknown_session_not_found_when_auto_create_off():
    with serve(auto_create_sessions=False) as server:
        channel = make_channel(server.address)
        stub = pb_grpc.BrokerServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.GetStates(pb.GetStatesRequest(session="nope", agent_id="a"), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in info.value.details()
        stub.CreateSession(
            pb.CreateSessionRequest(session="run", agents=["a", "b"], fixed_roster=True), timeout=5
        )
        with MartiCommClient("a", server.address, session="run") as a:
            a.send_message("zed", "hi")
            with pytest.raises(NotFoundError, match="'zed'"):
                a.flush()
        channel.close()


def test_slow_consumer_backpressure_and_wait_if_full(address):
    with (
        MartiCommClient("fast", address, session="ep-slow") as fast,
        MartiCommClient("slow", address, session="ep-slow") as slow,
    ):
        slow.get_messages()
        for i in range(50):  # max_mailbox_messages=50 on this server
            fast.send_message("slow", {"i": i})
        fast.flush()  # the mailbox is full now
        fast.send_message("slow", {"i": 50})
        with pytest.raises(ResourceExhaustedError, match="max_mailbox_messages=50"):
            fast.flush()
        # a raw Send that waits for space: the consumer drains meanwhile, so it succeeds
        channel = make_channel(address)
        stub = pb_grpc.BrokerServiceStub(channel)
        raw = broker_pb2.EnvelopeBatch(
            envelopes=[
                broker_pb2.Envelope(message_id="late", sender="fast", receivers=["slow"], payload=b"{}")
            ]
        ).SerializeToString()
        frame = common_pb2.CompressedFrame(codec=common_pb2.CODEC_NONE, uncompressed_bytes=len(raw), data=raw)
        drained = []
        t = threading.Timer(
            0.3, lambda: drained.extend(slow.get_messages(max_messages=10) + slow.get_messages())
        )
        t.start()
        resp = stub.Send(
            pb.SendRequest(session="ep-slow", sender="fast", frame=frame, wait_if_full_ms=5000), timeout=10
        )
        t.join()
        assert resp.accepted == 1 and len(drained) == 50  # the Send waited until the first 10 were acked
        assert [m.message_id for m in slow.get_messages(timeout_s=1)] == ["late"]
        channel.close()


def test_many_concurrent_sessions_stay_isolated(address):
    errors: list[BaseException] = []

    def episode(k: int) -> None:
        try:
            with (
                MartiCommClient("a", address, session=f"iso-{k}") as a,
                MartiCommClient("b", address, session=f"iso-{k}") as b,
            ):
                a.broadcast_state({"k": k})
                for i in range(20):
                    a.send_message("b", {"k": k, "i": i})
                got = []
                while len(got) < 20:
                    got += b.get_messages(timeout_s=2)
                assert [(m.content["k"], m.content["i"]) for m in got] == [(k, i) for i in range(20)]
                assert b.get_agent_states() == {"a": {"k": k}}
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=episode, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[0]


async def test_async_client_subscribe_and_states():
    with serve() as server:
        async with (
            AsyncMartiCommClient("a", server.address, session="ep-async") as a,
            AsyncMartiCommClient("b", server.address, session="ep-async", batching_size=5) as b,
        ):
            await a.get_messages()
            received = []

            async def consume():
                async for msg in a.subscribe():
                    received.append(msg.content)
                    if len(received) == 5:
                        return

            task = asyncio.ensure_future(consume())
            for i in range(5):
                await b.send_message("a", {"i": i})
            await asyncio.wait_for(task, 5)
            assert received == [{"i": i} for i in range(5)]
            await b.broadcast_state({"ready": True})
            assert await a.get_agent_states() == {"b": {"ready": True}}
            stats = b.get_communication_stats()
            assert stats.total_sent == 5
            await a.flush()  # the consumer stopped mid-batch: its pending auto-acks go out with flush()
            # the four it moved past are acked; the one it returned on stays unacked (delivered again later)
            assert (await a.get_broker_stats()).acked == 4


def test_dictionary_session_roundtrip():
    samples = [json.dumps(realistic(i, f"agent_{i % 3}")).encode() for i in range(300)]
    dictionary = broker_codec.train_dictionary(samples, 8192)
    with serve() as server:
        channel = make_channel(server.address)
        stub = pb_grpc.BrokerServiceStub(channel)
        info = stub.CreateSession(
            pb.CreateSessionRequest(session="ep-dict", zstd_dictionary=dictionary), timeout=5
        )
        assert info.dictionary_id == broker_codec.dictionary_id(dictionary) != 0
        with (
            MartiCommClient("a", server.address, session="ep-dict") as a,
            MartiCommClient("b", server.address, session="ep-dict") as b,
        ):
            b.get_messages()
            a.send_message("b", realistic(1, "a"))
            a.flush()  # sent (and counted in a's stats) before b reads it
            assert b.get_messages(timeout_s=1)[0].content == realistic(1, "a")
            assert a.get_communication_stats().compression_ratio > 2.0
        channel.close()


def test_clients_share_one_channel_and_leave_it_open(address):
    """Many clients on one long-lived channel (``open_channel`` + ``channel=``): closing them keeps it open."""
    from marti.clients.broker import open_channel

    channel = open_channel(address)
    try:
        for episode in range(3):
            with (
                MartiCommClient("a", address, session=f"ep-shared-{episode}", channel=channel) as a,
                MartiCommClient("b", address, session=f"ep-shared-{episode}", channel=channel) as b,
            ):
                a.send_message("b", {"text": f"hello {episode}"})
                a.flush()
                assert [m.content for m in b.get_messages(timeout_s=2)] == [{"text": f"hello {episode}"}]
        # the clients are closed, the channel is not: a new client still talks over it
        with MartiCommClient("c", "ignored:1", session="ep-shared-0", channel=channel) as c:
            assert c.get_messages() == []
    finally:
        channel.close()
