"""A client whose ``batching_size`` is above the broker's ``max_batch_messages`` (here 8) over a real broker on port
0: the first full batch is refused for its count alone, the client learns the limit from the refusal's
``ErrorInfo`` (``max_batch_messages``), sends that batch again in parts and keeps later batches under it. Every
message arrives once, in order; nothing is reported refused. Sync and asyncio clients alike."""

from __future__ import annotations

import asyncio
import logging

import pytest

from marti.clients.broker import AsyncMartiCommClient, MartiCommClient
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
