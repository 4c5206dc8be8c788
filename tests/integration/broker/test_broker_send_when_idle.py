"""Nagle's rule in the broker SDK (``send_when_idle``, on by default) against a real broker on port 0.

* With a 60 s linger, a lone ``send_message`` reaches another agent within 10 s (sync and asyncio clients):
  the flush timer sends a message buffered while no batch is in flight at once.
* With ``send_when_idle=False`` and a 60 s linger, the same message is not delivered within 0.5 s.
* Messages buffered while a Send is in flight (held open by :class:`GatedSends`) wait for it and then go out
  together as the next batch: 50 messages in 2 Send rpcs, all delivered in send order.
* A message buffered while another call's Send is in flight (``publish``, held open) goes out as soon as that
  Send ends: its end wakes the flush timer, which was waiting for the linger.
* A fork waits for the Send in flight (the hook ``os.fork`` runs first), so gRPC is not busy when it forks.
* A tight loop of 2,000 ``send_message`` calls (batches of up to 4,096, 60 s linger) is delivered in order in
  far fewer Send rpcs than messages, without waiting for the linger.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from marti.clients.broker import (
    IDEMPOTENT_METHODS,
    AsyncMartiCommClient,
    MartiCommClient,
    open_channel,
    sync_client,
)
from marti.rpc.client.channel import make_channel
from marti.rpc.testing import serve_in_thread
from services.comm_broker.servicer import broker_service
from services.comm_broker.settings import BrokerSettings

#: Long enough that a message the linger sends could never pass a test's bound.
LONG_LINGER_S = 60.0
#: A test's bound on a delivery that does not wait for the linger: generous on a loaded machine, far below it.
DELIVERY_S = 10.0


@pytest.fixture(scope="module")
def address():
    settings = BrokerSettings(port=0, tick_interval_s=0.05)
    with serve_in_thread(lambda: [broker_service(settings)], settings) as server:
        yield server.address


class GatedSends:
    """A real channel (sync or ``grpc.aio``) whose Send rpcs are counted; with ``gate_first``, the first one is
    held (before it reaches the broker) until :attr:`release` is set (at most :attr:`HOLD_S`, so a failing test
    still closes its clients), so the test controls how long it is in flight."""

    HOLD_S = 30.0

    def __init__(self, channel, aio: bool, gate_first: bool = True) -> None:
        self.channel, self.aio = channel, aio
        self.sends = 0
        self.in_first = threading.Event()
        self.release = threading.Event()
        if not gate_first:
            self.release.set()

    def _count(self) -> bool:
        """Counts a Send; returns whether it is the first (then :attr:`in_first` is set)."""
        self.sends += 1
        if self.sends == 1:
            self.in_first.set()
            return True
        return False

    def unary_unary(self, path: str, *args, **kwargs):
        real = self.channel.unary_unary(path, *args, **kwargs)
        if not path.endswith("/Send"):
            return real
        if self.aio:

            async def asend(request, *a, **kw):
                if self._count():
                    deadline = time.monotonic() + self.HOLD_S
                    while not self.release.is_set() and time.monotonic() < deadline:
                        await asyncio.sleep(0.005)
                return await real(request, *a, **kw)

            return asend

        def send(request, *a, **kw):
            if self._count():
                self.release.wait(self.HOLD_S)
            return real(request, *a, **kw)

        return send

    def __getattr__(self, name: str):
        return getattr(self.channel, name)


def aio_channel(address: str):
    return make_channel(address, aio=True, idempotent_methods=IDEMPOTENT_METHODS, service="broker")


# ------------------------------------------------------------------------------------------ lone messages
def test_lone_message_goes_at_once_despite_a_long_linger(address):
    with (
        MartiCommClient("s", address, session="idle-sync", update_frequency_s=LONG_LINGER_S) as a,
        MartiCommClient("r", address, session="idle-sync") as b,
    ):
        b.get_messages()  # join
        for i in range(3):
            t0 = time.monotonic()
            a.send_message("r", {"i": i})  # no flush: the flush timer sends it at once
            assert [m.content for m in b.get_messages(timeout_s=DELIVERY_S)] == [{"i": i}]
            assert time.monotonic() - t0 < DELIVERY_S


async def test_async_lone_message_goes_at_once_despite_a_long_linger(address):
    async with (
        AsyncMartiCommClient("s", address, session="idle-aio", update_frequency_s=LONG_LINGER_S) as a,
        AsyncMartiCommClient("r", address, session="idle-aio") as b,
    ):
        await b.get_messages()
        for i in range(3):
            t0 = time.monotonic()
            await a.send_message("r", {"i": i})
            assert [m.content for m in await b.get_messages(timeout_s=DELIVERY_S)] == [{"i": i}]
            assert time.monotonic() - t0 < DELIVERY_S


def test_without_send_when_idle_a_lone_message_waits_the_linger(address):
    with (
        MartiCommClient(
            "s", address, session="linger-sync", update_frequency_s=LONG_LINGER_S, send_when_idle=False
        ) as a,
        MartiCommClient("r", address, session="linger-sync") as b,
    ):
        b.get_messages()
        a.send_message("r", "late")
        assert b.get_messages(timeout_s=0.5) == []  # still lingering
        a.flush()
        assert [m.content for m in b.get_messages(timeout_s=DELIVERY_S)] == ["late"]


async def test_async_without_send_when_idle_a_lone_message_waits_the_linger(address):
    async with (
        AsyncMartiCommClient(
            "s", address, session="linger-aio", update_frequency_s=LONG_LINGER_S, send_when_idle=False
        ) as a,
        AsyncMartiCommClient("r", address, session="linger-aio") as b,
    ):
        await b.get_messages()
        await a.send_message("r", "late")
        assert await b.get_messages(timeout_s=0.5) == []  # the loop ran: the timer could have sent it
        await a.flush()
        assert [m.content for m in await b.get_messages(timeout_s=DELIVERY_S)] == ["late"]


# ------------------------------------------------------------------------------------------ batching
def test_messages_buffered_during_a_send_in_flight_go_out_together_after_it(address):
    gate = GatedSends(open_channel(address), aio=False)
    try:
        with (
            MartiCommClient(
                "s", address, session="inflight-sync", channel=gate, update_frequency_s=LONG_LINGER_S
            ) as a,
            MartiCommClient("r", address, session="inflight-sync") as b,
        ):
            b.get_messages()
            ids = [a.send_message("r", {"i": 0})]
            assert gate.in_first.wait(
                DELIVERY_S
            )  # the timer sent the lone message at once; its Send is held open
            ids += [a.send_message("r", {"i": i}) for i in range(1, 50)]
            time.sleep(0.3)
            assert gate.sends == 1  # buffered behind the Send in flight, not sent one by one
            gate.release.set()
            got = []
            deadline = time.monotonic() + DELIVERY_S
            while len(got) < 50 and time.monotonic() < deadline:
                got += b.get_messages(max_messages=100, timeout_s=1)
            assert [m.message_id for m in got] == ids
            assert gate.sends == 2  # then all 49 in one Send, long before the 60 s linger
    finally:
        gate.channel.close()


async def test_async_messages_buffered_during_a_send_in_flight_go_out_together_after_it(address):
    gate = GatedSends(aio_channel(address), aio=True)
    try:
        async with (
            AsyncMartiCommClient(
                "s", address, session="inflight-aio", channel=gate, update_frequency_s=LONG_LINGER_S
            ) as a,
            AsyncMartiCommClient("r", address, session="inflight-aio") as b,
        ):
            await b.get_messages()
            ids = [await a.send_message("r", {"i": 0})]
            deadline = time.monotonic() + DELIVERY_S
            while not gate.in_first.is_set():  # the timer task sends it at once
                assert time.monotonic() < deadline, "the lone message was not sent at once"
                await asyncio.sleep(0.005)
            ids += [await a.send_message("r", {"i": i}) for i in range(1, 50)]
            await asyncio.sleep(0.3)
            assert gate.sends == 1
            gate.release.set()
            got = []
            deadline = time.monotonic() + DELIVERY_S
            while len(got) < 50 and time.monotonic() < deadline:
                got += await b.get_messages(max_messages=100, timeout_s=1)
            assert [m.message_id for m in got] == ids
            assert gate.sends == 2
    finally:
        await gate.channel.close()


def test_message_buffered_while_another_call_sends_goes_when_that_send_ends(address):
    gate = GatedSends(open_channel(address), aio=False)
    try:
        with (
            MartiCommClient(
                "s", address, session="behind-sync", channel=gate, update_frequency_s=LONG_LINGER_S
            ) as a,
            MartiCommClient("r", address, session="behind-sync") as b,
        ):
            b.get_messages()
            publisher = threading.Thread(target=a.publish, args=("news", "held open"))
            publisher.start()
            assert gate.in_first.wait(DELIVERY_S)  # publish's own Send, in flight in that thread
            mid = a.send_message("r", "behind the publish")  # the timer now waits (up to the linger)
            assert b.get_messages(timeout_s=0.3) == []
            gate.release.set()
            publisher.join(5)
            assert [m.message_id for m in b.get_messages(timeout_s=DELIVERY_S)] == [
                mid
            ]  # not after the linger
    finally:
        gate.channel.close()


async def test_async_message_buffered_while_another_call_sends_goes_when_that_send_ends(address):
    gate = GatedSends(aio_channel(address), aio=True)
    try:
        async with (
            AsyncMartiCommClient(
                "s", address, session="behind-aio", channel=gate, update_frequency_s=LONG_LINGER_S
            ) as a,
            AsyncMartiCommClient("r", address, session="behind-aio") as b,
        ):
            await b.get_messages()
            publisher = asyncio.ensure_future(a.publish("news", "held open"))
            deadline = time.monotonic() + DELIVERY_S
            while not gate.in_first.is_set():
                assert time.monotonic() < deadline, "publish did not send"
                await asyncio.sleep(0.005)
            mid = await a.send_message("r", "behind the publish")
            assert await b.get_messages(timeout_s=0.3) == []
            gate.release.set()
            await asyncio.wait_for(publisher, 5)
            assert [m.message_id for m in await b.get_messages(timeout_s=DELIVERY_S)] == [mid]
    finally:
        await gate.channel.close()


def test_fork_hook_waits_for_the_send_in_flight(address):
    gate = GatedSends(open_channel(address), aio=False)
    try:
        with (
            MartiCommClient(
                "s", address, session="fork-wait", channel=gate, update_frequency_s=LONG_LINGER_S
            ) as a,
            MartiCommClient("r", address, session="fork-wait") as b,
        ):
            b.get_messages()
            first = a.send_message("r", "in flight at fork time")
            assert gate.in_first.wait(DELIVERY_S)
            threading.Timer(0.5, gate.release.set).start()
            t0 = time.monotonic()
            sync_client._before_fork()  # what os.fork runs before forking
            try:
                assert time.monotonic() - t0 >= 0.4 and a._core.in_flight == 0
            finally:
                sync_client._after_fork_in_parent()
            second = a.send_message("r", "after the fork")  # the send lock is free again
            got = []
            deadline = time.monotonic() + DELIVERY_S
            while len(got) < 2 and time.monotonic() < deadline:
                got += b.get_messages(timeout_s=1)
            assert [m.message_id for m in got] == [first, second]
    finally:
        gate.channel.close()


def test_a_fork_waits_for_hung_sends_at_most_fork_wait_s_in_all(address, monkeypatch):
    """Three clients whose sends hang (their send locks held elsewhere) delay a fork by FORK_WAIT_S once, not
    three times."""
    monkeypatch.setattr(sync_client, "FORK_WAIT_S", 1.0)
    clients = [MartiCommClient(f"h{i}", address, session="fork-hung") for i in range(3)]
    release, held = threading.Event(), threading.Barrier(4)

    def hang(c: MartiCommClient) -> None:
        with c._send_lock:  # what a Send to a broker that does not answer looks like to the fork hook
            held.wait()
            release.wait(10)

    threads = [threading.Thread(target=hang, args=(c,)) for c in clients]
    try:
        for t in threads:
            t.start()
        held.wait()
        t0 = time.monotonic()
        sync_client._before_fork()
        try:
            waited = time.monotonic() - t0
        finally:
            sync_client._after_fork_in_parent()
        assert 0.9 <= waited < 2.5, waited  # one FORK_WAIT_S in all (per client it would be 3 s)
    finally:
        release.set()
        for t in threads:
            t.join()
        for c in clients:
            c.close()


def test_tight_send_loop_still_batches_and_never_waits_the_linger(address):
    n = 2000
    gate = GatedSends(open_channel(address), aio=False, gate_first=False)
    try:
        with (
            MartiCommClient(
                "s",
                address,
                session="tight",
                channel=gate,
                batching_size=4096,
                update_frequency_s=LONG_LINGER_S,
            ) as a,
            MartiCommClient("r", address, session="tight") as b,
        ):
            b.get_messages()
            ids = [a.send_message("r", {"i": i}) for i in range(n)]  # no flush: never a full batch either
            got = []
            deadline = time.monotonic() + DELIVERY_S
            while len(got) < n and time.monotonic() < deadline:
                got += b.get_messages(max_messages=1000, timeout_s=1)
            assert [m.message_id for m in got] == ids
            assert gate.sends <= n // 10, gate.sends  # batches of what was buffered during each Send
            # The receiver may read a batch before the Send that carried it has returned to the sender (whose
            # stats count acknowledged messages): flush waits for the Send in flight.
            a.flush()
            assert a.get_communication_stats().total_sent == n
    finally:
        gate.channel.close()
