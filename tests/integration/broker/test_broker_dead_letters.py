"""``read_dead_letters`` of the SDK clients, over a real broker on port 0.

A message delivered ``max_delivery_attempts`` times without an ack (its receiver never acks, or its payload
does not decode, so the SDK never acks it) goes to the session's dead-letter queue. Before, only the broker
rpc ReadDeadLetters read that queue and an SDK user lost such messages silently; now both clients read it,
and a letter whose payload does not decode comes back with its raw bytes and the decode error instead of
failing the batch. The response is bounded by bytes as a delivered frame is: many large dead letters no
longer make every call fail on the gRPC message limit.
"""

from __future__ import annotations

import os
import time

import pytest

from marti.clients.broker import AsyncMartiCommClient, DeadLetter, MartiCommClient
from marti.errors import FailedPreconditionError, InvalidArgumentError
from marti.rpc.testing import serve_in_thread
from services.comm_broker.servicer import broker_service
from services.comm_broker.settings import BrokerSettings
from tests.integration.broker.test_broker_undecodable import send_raw

MIB = 1024 * 1024
ATTEMPTS = 2
PAYLOAD = 300_000  # bytes per large message: 10 of them are about 3 MB, over the 2 MiB gRPC limit below


@pytest.fixture(scope="module")
def address():
    settings = BrokerSettings(
        port=0,
        tick_interval_s=0.05,
        ack_timeout_s=0.3,
        max_delivery_attempts=ATTEMPTS,
        max_message_bytes=2 * MIB,
    )
    with serve_in_thread(lambda: [broker_service(settings)], settings) as server:
        yield server.address


def never_ack(address: str, session: str, n: int, timeout_s: float = 15.0) -> None:
    """Receives as agent ``b`` of ``session`` without ever acking (an undecodable message raises and is
    skipped) until the session counts ``n`` dead letters."""
    with MartiCommClient("b", address, session=session, auto_ack=False) as b:
        deadline = time.monotonic() + timeout_s
        while b.get_broker_stats().dead_lettered < n:
            assert time.monotonic() < deadline, "messages were not dead-lettered in time"
            try:
                b.get_messages(timeout_s=0.1)
            except InvalidArgumentError:
                pass


def send(address: str, session: str, contents: list) -> None:
    """Sends ``contents`` from ``a`` to ``b``, one Send each."""
    with MartiCommClient("a", address, session=session, batching_size=1) as a:
        for c in contents:
            a.send_message("b", c)


def test_a_message_its_receiver_never_acks_is_read_back(address):
    before = time.time()
    send(address, "never-acked", [{"task": 1}])
    never_ack(address, "never-acked", 1)
    with MartiCommClient("r", address, session="never-acked") as r:
        [dead] = r.read_dead_letters()
        assert isinstance(dead, DeadLetter)
        assert dead.message is not None and dead.message.content == {"task": 1}
        assert (dead.message.sender, dead.sender, dead.message_id) == ("a", "a", dead.message.message_id)
        assert (dead.receiver, dead.attempts, dead.reason) == ("b", ATTEMPTS, "max_delivery_attempts")
        assert before <= dead.dead_at <= time.time() and dead.decode_error is None
        assert r.read_dead_letters(receiver="b") == [dead] and r.read_dead_letters(receiver="r") == []
        # no cursor: without remove the same letter comes back; with it the queue drains
        assert r.read_dead_letters(remove=True) == [dead]
        assert r.read_dead_letters() == []


def test_an_undecodable_payload_is_returned_raw_with_the_good_letters(address):
    send_raw(address, "poison-dead", [b'"good-1"', b"{bad", b'"good-2"'])
    never_ack(address, "poison-dead", 3)
    with MartiCommClient("r", address, session="poison-dead") as r:
        dead = r.read_dead_letters()
    assert [d.message_id for d in dead] == ["raw-0", "raw-1", "raw-2"]
    assert [d.message.content for d in (dead[0], dead[2])] == ["good-1", "good-2"]
    bad = dead[1]
    assert (bad.message, bad.payload, bad.content_type, bad.sender) == (
        None,
        b"{bad",
        "application/json",
        "x",
    )
    assert "'raw-1' from 'x'" in bad.decode_error and "does not parse" in bad.decode_error


async def test_the_async_client_reads_and_removes_dead_letters(address):
    send(address, "async-dead", ["one", "two"])
    never_ack(address, "async-dead", 2)
    async with AsyncMartiCommClient("r", address, session="async-dead") as r:
        first = await r.read_dead_letters(max_messages=1, remove=True)
        rest = await r.read_dead_letters(remove=True)
        assert await r.read_dead_letters() == []
    assert [d.message.content for d in first + rest] == ["one", "two"]


def drain(r: MartiCommClient) -> list[list[DeadLetter]]:
    """Reads with ``remove`` until the queue is empty; returns each call's letters (every call must
    succeed)."""
    calls = []
    while batch := r.read_dead_letters(max_messages=256, remove=True):
        calls.append(batch)
    return calls


def test_many_large_dead_letters_stay_under_the_brokers_grpc_message_limit(address):
    payloads = [os.urandom(PAYLOAD) for _ in range(10)]
    send(address, "big-dead", payloads)
    never_ack(address, "big-dead", 10)
    with MartiCommClient("r", address, session="big-dead") as r:  # default max_frame_bytes: 32 MiB
        calls = drain(r)
    assert [d.payload for batch in calls for d in batch] == payloads
    assert len(calls) > 1  # 10 letters of 300 KB are over the 2 MiB response limit


def test_a_limit_between_one_and_two_letters_gives_one_letter_per_call(address):
    payloads = [os.urandom(PAYLOAD) for _ in range(3)]
    send(address, "one-dead-each", payloads)
    never_ack(address, "one-dead-each", 3)
    with MartiCommClient("r", address, session="one-dead-each", max_frame_bytes=PAYLOAD + PAYLOAD // 2) as r:
        assert len(r.read_dead_letters()) == 1  # also without remove
        calls = drain(r)
    assert [len(batch) for batch in calls] == [1, 1, 1]
    assert [batch[0].message.content for batch in calls] == payloads


def test_bad_arguments_are_refused_by_name(address):
    with MartiCommClient("r", address, session="dead-args") as r:
        with pytest.raises(InvalidArgumentError, match="remove=True with receiver='b'"):
            r.read_dead_letters(receiver="b", remove=True)
        with pytest.raises(InvalidArgumentError, match="max_messages"):
            r.read_dead_letters(max_messages=0)
        with pytest.raises(InvalidArgumentError, match="max_messages=5000 is outside.*max_batch_messages"):
            r.read_dead_letters(max_messages=5000)  # refused by the broker
        with pytest.raises(InvalidArgumentError, match="receiver"):
            r.read_dead_letters(receiver="")


def test_a_closed_client_refuses_to_read_dead_letters(address):
    r = MartiCommClient("r", address, session="dead-closed")
    r.close()
    with pytest.raises(FailedPreconditionError, match="'r'"):
        r.read_dead_letters()
