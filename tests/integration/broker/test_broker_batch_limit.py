"""A client whose ``batching_size`` is above the broker's ``max_batch_messages`` (here 8) over a real broker on port
0: the first full batch is refused for its count alone, the client learns the limit from the refusal's
``ErrorInfo`` (``max_batch_messages``), sends that batch again in parts and keeps later batches under it. Every
message arrives once, in order; nothing is reported refused. Sync and asyncio clients alike."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

from marti.clients.broker import AsyncMartiCommClient, MartiCommClient
from marti.errors import BatchTooLargeError, InvalidArgumentError
from marti.rpc.testing import serve_in_thread
from services.comm_broker.servicer import broker_service
from services.comm_broker.settings import BrokerSettings

LIMIT, N = 8, 50


@pytest.fixture(scope="module")
def address():
    settings = BrokerSettings(port=0, tick_interval_s=0.05, max_batch_messages=LIMIT)
    with serve_in_thread(lambda: [broker_service(settings)], settings) as server:
        yield server.address


def _received(address: str, session: str) -> list:
    got = []
    with MartiCommClient("r", address, session=session) as r:
        while batch := r.get_messages(max_messages=LIMIT, timeout_s=1):
            got += [m.content for m in batch]
    return got


def test_a_sync_client_splits_batches_at_the_brokers_limit(address, caplog) -> None:
    with MartiCommClient("r", address, session="sync"):
        pass  # the receiver joins first
    with caplog.at_level(logging.WARNING, logger="marti.broker.client"):
        with MartiCommClient("s", address, session="sync", batching_size=20, update_frequency_s=60) as s:
            for i in range(N):
                s.send_message("r", i)
            s.flush()
            stats = s.get_communication_stats()
            assert s._core.batching_size == LIMIT
    assert stats.refused_messages == 0 and stats.total_sent == N
    assert "at most 8 messages a batch" in caplog.text
    assert _received(address, "sync") == list(range(N))


def test_an_asyncio_client_splits_batches_at_the_brokers_limit(address) -> None:
    async def main() -> None:
        async with AsyncMartiCommClient(
            "s", address, session="aio", batching_size=20, update_frequency_s=60
        ) as s:
            await s.connect()
            for i in range(N):
                await s.send_message("r", i)
            await s.flush()

    with MartiCommClient("r", address, session="aio"):
        pass
    asyncio.run(main())
    assert _received(address, "aio") == list(range(N))


def test_an_ack_of_more_ids_than_the_broker_takes_is_sent_in_parts(address) -> None:
    """``ack(ids)`` with more ids than the broker's ``max_batch_messages`` raised ResourceExhaustedError and acked
    none (each came back after the ack timeout), although sends are split at the same limit; both clients now
    ack such a list in parts under it, and every delivery is acked."""
    with MartiCommClient("r", address, session="acks", auto_ack=False) as r:
        with MartiCommClient("s", address, session="acks") as s:
            for i in range(3 * LIMIT):
                s.send_message("r", i)
        ids = []
        while batch := r.get_messages(max_messages=LIMIT, timeout_s=1):
            ids += [m.message_id for m in batch]
        assert len(ids) == 3 * LIMIT
        assert r.ack(ids) == 3 * LIMIT
        assert r.get_broker_stats().acked == 3 * LIMIT

    async def main() -> None:
        async with AsyncMartiCommClient("r", address, session="acks-aio", auto_ack=False) as r:
            await r.connect()
            async with AsyncMartiCommClient("s", address, session="acks-aio") as s:
                await s.connect()
                for i in range(3 * LIMIT):
                    await s.send_message("r", i)
            ids = []
            while batch := await r.get_messages(max_messages=LIMIT, timeout_s=1):
                ids += [m.message_id for m in batch]
            assert await r.ack(ids) == 3 * LIMIT == len(ids)
            assert (await r.get_broker_stats()).acked == 3 * LIMIT

    asyncio.run(main())


FRAME_LIMIT = 4096  # uncompressed bytes: about 11 of the messages below


@pytest.fixture(scope="module")
def small_frames():
    settings = BrokerSettings(port=0, tick_interval_s=0.05, max_frame_bytes=FRAME_LIMIT)
    with serve_in_thread(lambda: [broker_service(settings)], settings) as server:
        yield server.address


def test_a_batch_over_the_brokers_frame_bytes_is_sent_again_in_parts(small_frames, caplog) -> None:
    """20 messages of ~350 bytes (~7 KB a batch) to a broker taking 4096-byte frames: the first batch is
    refused for its bytes alone (``BatchTooLargeError`` naming ``max_frame_bytes``), sent again in parts and
    later batches are closed under the limit; every message arrives once, in order."""
    texts = [f"{i:03d}" + "x" * 300 for i in range(N)]
    with MartiCommClient("r", small_frames, session="bytes"):
        pass
    with caplog.at_level(logging.WARNING, logger="marti.broker.client"):
        with MartiCommClient(
            "s", small_frames, session="bytes", batching_size=20, update_frequency_s=60
        ) as s:
            for text in texts:
                s.send_message("r", text)
            s.flush()
            stats = s.get_communication_stats()
            assert s._core.max_batch_bytes == FRAME_LIMIT
    assert stats.refused_messages == 0 and stats.total_sent == N
    assert "at most 4096 uncompressed bytes a batch (max_frame_bytes)" in caplog.text
    assert _received(small_frames, "bytes") == texts


def test_one_message_over_the_frame_bytes_alone_is_refused_and_reported(small_frames) -> None:
    """A message that alone makes a frame over ``max_frame_bytes`` cannot be split: it is refused, and the
    send that carries it raises the broker's ``BatchTooLargeError`` (nothing dropped silently)."""
    with MartiCommClient("r", small_frames, session="one"):
        pass
    with MartiCommClient("s", small_frames, session="one", batching_size=1) as s:
        with pytest.raises(BatchTooLargeError, match="max_frame_bytes=4096") as info:
            s.send_message("r", "y" * (2 * FRAME_LIMIT))
        assert info.value.max_frame_bytes == FRAME_LIMIT
        assert s.get_communication_stats().refused_messages == 1


def test_a_message_too_large_alone_is_the_only_one_refused(small_frames) -> None:
    """good, too-large, good, good in one batch (sync client): the broker refuses the batch for its bytes, the
    client splits it; the big message alone is refused (its error, and ``on_error``, name only its id) and
    the three good ones after and before it are delivered, in order."""
    good = ["good-0", "good-1", "good-2"]
    seen = []
    with MartiCommClient("r", small_frames, session="alone"):
        pass
    with MartiCommClient(
        "s",
        small_frames,
        session="alone",
        batching_size=20,
        update_frequency_s=60,
        send_when_idle=False,
        on_error=seen.append,
    ) as s:
        s.send_message("r", good[0])
        s.send_message("r", "y" * (2 * FRAME_LIMIT))
        big_id = s._core.buffered_ids()[1]
        s.send_message("r", good[1])
        s.send_message("r", good[2])
        with pytest.raises(BatchTooLargeError, match="max_frame_bytes=4096") as info:
            s.flush()
        stats = s.get_communication_stats()
    assert info.value.message_ids == (big_id,)
    assert [e.message_ids for e in seen] == [(big_id,)]
    assert (stats.refused_batches, stats.refused_messages, stats.total_sent) == (1, 1, 3)
    assert _received(small_frames, "alone") == good


def test_an_asyncio_client_refuses_only_the_message_too_large_alone(small_frames) -> None:
    """The same with the asyncio client: the three good messages arrive, the error names only the big one."""
    good = ["good-0", "good-1", "good-2"]

    async def main() -> tuple:
        async with AsyncMartiCommClient(
            "s",
            small_frames,
            session="alone-aio",
            batching_size=20,
            update_frequency_s=60,
            send_when_idle=False,
        ) as s:
            await s.send_message("r", good[0])
            await s.send_message("r", "y" * (2 * FRAME_LIMIT))
            big_id = s._core.buffered_ids()[1]
            for text in good[1:]:
                await s.send_message("r", text)
            with pytest.raises(BatchTooLargeError, match="max_frame_bytes=4096") as info:
                await s.flush()
            return big_id, info.value.message_ids, s.get_communication_stats().refused_messages

    with MartiCommClient("r", small_frames, session="alone-aio"):
        pass
    big_id, refused_ids, refused = asyncio.run(main())
    assert refused_ids == (big_id,) and refused == 1
    assert _received(small_frames, "alone-aio") == good


def test_a_subscribe_asking_for_bigger_batches_than_the_broker_allows_is_refused(address):
    """Subscribe's max_batch_messages over the broker's limit is INVALID_ARGUMENT naming both, as Receive's
    max_messages is (it was cut to the limit without a word)."""
    with MartiCommClient("r", address, session="sub-limit") as r:
        r.send_message("r", {"i": 1})  # a refused stream delivers nothing: the next one gets it
        with pytest.raises(
            InvalidArgumentError, match=rf"max_batch_messages=9 is outside \[1, max_batch_messages={LIMIT}\]"
        ):
            next(iter(r.subscribe(max_batch_messages=LIMIT + 1)))
        assert [m.content for m in itertools.islice(r.subscribe(max_batch_messages=LIMIT), 1)] == [{"i": 1}]


def test_default_counts_work_on_a_broker_taking_fewer_than_256_messages_a_batch(address) -> None:
    """``get_messages()``, ``subscribe()`` and ``read_dead_letters()`` with their default counts on a broker whose
    ``max_batch_messages`` (8) is below 256: each was refused (``InvalidArgumentError: max_messages=256 is outside
    [1, max_batch_messages=8]``; ``ReadDeadLetters`` refused even a count of 0), so a client with default
    arguments could receive nothing there. A default count now leaves the batch size to the broker; an explicit
    count over its limit is still refused by name. Sync and asyncio clients alike."""
    with MartiCommClient("r", address, session="defaults") as r:
        with MartiCommClient("s", address, session="defaults") as s:
            for i in range(LIMIT + 2):
                s.send_message("r", i)
        got = r.get_messages(timeout_s=1)
        assert [m.content for m in got] == list(range(LIMIT))  # one frame: the broker's limit
        assert [m.content for m in r.get_messages(timeout_s=1)] == [LIMIT, LIMIT + 1]
        assert r.read_dead_letters() == []
        with pytest.raises(
            InvalidArgumentError, match=r"max_messages=9 is outside \[1, max_batch_messages=8\]"
        ):
            r.get_messages(max_messages=LIMIT + 1)
        with MartiCommClient("s", address, session="defaults") as s:
            s.send_message("r", "pushed")
        assert next(iter(r.subscribe())).content == "pushed"

    async def main() -> tuple:
        async with AsyncMartiCommClient("r", address, session="defaults-aio") as r:
            await r.connect()
            async with AsyncMartiCommClient("s", address, session="defaults-aio") as s:
                await s.connect()
                for i in range(LIMIT + 2):
                    await s.send_message("r", i)
            first = [m.content for m in await r.get_messages(timeout_s=1)]
            assert [m.content for m in await r.get_messages(timeout_s=1)] == [LIMIT, LIMIT + 1]
            dead = await r.read_dead_letters()
            async with AsyncMartiCommClient("s", address, session="defaults-aio") as s:
                await s.send_message("r", "pushed")
            async for msg in r.subscribe():
                return first, dead, msg.content

    assert asyncio.run(main()) == (list(range(LIMIT)), [], "pushed")
