"""``subscribe()`` acks only what the caller was handed and moved past (review s4 finding 1), over a real
broker on port 0.

Leaving the loop (``break``, an exception in the caller's code) must not ack the rest of the pushed batch,
nor the message the loop was left on: the broker delivers them again after its ``ack_timeout_s``, and the
client's dedup memory does not drop those redeliveries. Messages the caller moved past are acked.
"""

from __future__ import annotations

import time

import pytest

from marti.clients.broker import AsyncMartiCommClient, MartiCommClient
from marti.rpc.testing import serve_in_thread
from services.comm_broker.servicer import broker_service
from services.comm_broker.settings import BrokerSettings

ACK_TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def address():
    settings = BrokerSettings(port=0, tick_interval_s=0.05, ack_timeout_s=ACK_TIMEOUT_S)
    with serve_in_thread(lambda: [broker_service(settings)], settings) as server:
        yield server.address


def send_five(address: str, session: str) -> None:
    """Sends ``{"i": 0..4}`` from agent ``a`` to agent ``b`` of ``session`` (the broker holds them on return)."""
    with MartiCommClient("a", address, session=session) as a:
        for i in range(5):
            a.send_message("b", {"i": i})


def receive_all(client: MartiCommClient, want: int, timeout_s: float = 5.0) -> list[int]:
    """The ``i`` of the messages ``client`` polls until it has ``want`` of them (or the time is up)."""
    got: list[int] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += [m.content["i"] for m in client.get_messages(timeout_s=0.2)]
    return got


def test_break_leaves_the_unhandled_messages_for_redelivery(address):
    send_five(address, "brk")
    with MartiCommClient("b", address, session="brk") as b:
        handled = []
        for m in b.subscribe():
            handled.append(m.content["i"])
            if len(handled) == 2:
                break
    assert handled == [0, 1]
    with MartiCommClient("b", address, session="brk") as b2:
        # 0 was moved past (acked); 1, the message the loop was left on, and 2-4 come back
        assert receive_all(b2, 4) == [1, 2, 3, 4]
        time.sleep(ACK_TIMEOUT_S * 2)
        assert b2.get_messages(timeout_s=0.2) == []  # b2 acked them: nothing more


def test_a_handler_error_leaves_its_message_and_the_rest_for_the_same_client(address):
    send_five(address, "raise")
    with MartiCommClient("b", address, session="raise") as b:
        with pytest.raises(RuntimeError):
            for m in b.subscribe():
                if m.content["i"] == 1:
                    raise RuntimeError("handler failed")
        # the same client gets the redeliveries: its dedup memory holds only message 0
        assert receive_all(b, 4) == [1, 2, 3, 4]


async def test_async_break_leaves_the_unhandled_messages_for_redelivery(address):
    send_five(address, "abrk")
    async with AsyncMartiCommClient("b", address, session="abrk") as b:
        agen = b.subscribe()
        async for m in agen:
            assert m.content["i"] == 0
            break
        await agen.aclose()
    with MartiCommClient("b", address, session="abrk") as b2:
        assert receive_all(b2, 5) == [0, 1, 2, 3, 4]
