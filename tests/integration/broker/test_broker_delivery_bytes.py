"""A delivered frame is bounded by bytes as well as by count (review s4 finding 5), over a real broker on
port 0.

Large messages, each within the limits, must reach a receiver however many wait: the broker closes a
delivery frame before it passes the receiver's ``max_frame_bytes`` (sent in Receive and Subscribe), its own
``max_frame_bytes`` and its gRPC message limit, with at least one message per frame. Before, a frame held
``max_messages`` messages whatever their size: every ``get_messages`` failed and all were dead-lettered.
"""

from __future__ import annotations

import os
import time

import pytest

from marti.clients.broker import MartiCommClient
from marti.rpc.testing import serve_in_thread
from services.comm_broker.servicer import broker_service
from services.comm_broker.settings import BrokerSettings

MIB = 1024 * 1024
PAYLOAD = 300_000  # bytes per message: 10 of them are about 3 MB


@pytest.fixture(scope="module")
def address():
    # gRPC messages up to 2 MiB (so 10 messages do not fit one response), frames up to 32 MiB
    settings = BrokerSettings(port=0, tick_interval_s=0.05, max_message_bytes=2 * MIB)
    with serve_in_thread(lambda: [broker_service(settings)], settings) as server:
        yield server.address


def send_big(address: str, session: str, n: int) -> list[bytes]:
    """Sends ``n`` random payloads of ``PAYLOAD`` bytes from ``a`` to ``b``, one Send each; returns them."""
    payloads = [os.urandom(PAYLOAD) for _ in range(n)]
    with MartiCommClient("a", address, session=session, batching_size=1) as a:
        for p in payloads:
            a.send_message("b", p)
    return payloads


def poll_all(b: MartiCommClient, n: int, timeout_s: float = 10.0) -> list[bytes]:
    """Polls (``max_messages=256``) until ``n`` messages came or the time is up; every call must succeed."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += [m.content for m in b.get_messages(max_messages=256, timeout_s=0.5)]
    return got


def test_receive_frames_stay_under_the_receivers_max_frame_bytes(address):
    payloads = send_big(address, "rx-client", 10)
    with MartiCommClient("b", address, session="rx-client", max_frame_bytes=MIB) as b:
        assert poll_all(b, 10) == payloads


def test_receive_frames_stay_under_the_brokers_grpc_message_limit(address):
    payloads = send_big(address, "rx-grpc", 10)
    with MartiCommClient("b", address, session="rx-grpc") as b:  # default max_frame_bytes: 32 MiB
        assert poll_all(b, 10) == payloads


def test_subscribe_frames_stay_under_the_receivers_max_frame_bytes(address):
    payloads = send_big(address, "sub-client", 10)
    with MartiCommClient("b", address, session="sub-client", max_frame_bytes=MIB) as b:
        got = []
        for m in b.subscribe(max_batch_messages=256):
            got.append(m.content)
            if len(got) == 10:
                break
        assert got == payloads


def test_a_limit_between_one_and_two_messages_gives_one_message_per_frame(address):
    payloads = send_big(address, "one-each", 4)
    with MartiCommClient("b", address, session="one-each", max_frame_bytes=PAYLOAD + PAYLOAD // 2) as b:
        sizes, got = [], []
        deadline = time.monotonic() + 10
        while len(got) < 4 and time.monotonic() < deadline:
            batch = b.get_messages(max_messages=256, timeout_s=0.5)
            sizes.append(len(batch))
            got += [m.content for m in batch]
        assert got == payloads and set(sizes) == {1}
