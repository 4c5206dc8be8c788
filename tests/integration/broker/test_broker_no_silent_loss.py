"""The SDK never loses data silently (issue 16), over a real broker on port 0.

* A batch the broker refuses after the flush timer sent it is raised by the client's next call, with the
  ids of its messages, passed to ``on_error`` and counted; transient errors keep the batch buffered.
* ``publish`` reports how many subscribers got the message (topic messages are not stored for later
  subscribers) and can require at least one.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
import pytest
from waits import until

import marti.clients.broker as sdk
from marti.clients.broker import (
    AsyncMartiCommClient,
    BatchRefusedError,
    MartiCommClient,
    NoSubscribersError,
    PublishResult,
)
from marti.errors import FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError
from marti.rpc.testing import serve_in_thread
from services.comm_broker.servicer import broker_service
from services.comm_broker.settings import BrokerSettings

LIMIT = 1024  # the broker's max_payload_bytes in this module


@pytest.fixture(scope="module")
def address():
    settings = BrokerSettings(port=0, tick_interval_s=0.05, max_payload_bytes=LIMIT)
    with serve_in_thread(lambda: [broker_service(settings)], settings) as server:
        yield server.address


def drain(client: MartiCommClient, want: int, timeout_s: float = 10.0) -> list:
    """The contents ``client`` reads until it has ``want`` messages (at most ``timeout_s``: a fixed window can
    end before a loaded machine delivers), then with whatever comes in one more 0.5 s read (a duplicate)."""
    out, deadline = [], time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        out += client.get_messages(timeout_s=0.1)
    out += client.get_messages(timeout_s=0.5)
    return [m.content for m in out]


@contextmanager
def timer_sender_and_receiver(
    address: str,
    sender: str,
    session: str,
    on_error: Callable[[BatchRefusedError], None],
    timer_s: float = 0.05,
) -> Iterator[tuple[MartiCommClient, MartiCommClient]]:
    """``sender`` batching up to 10 messages with a ``timer_s`` flush timer (refusals go to ``on_error``), and
    receiver ``r`` already joined to ``session``. Its batches all wait the linger (``send_when_idle=False``),
    so messages sent within ``timer_s`` of the first share the timer's batch."""
    with (
        MartiCommClient(
            sender,
            address,
            session=session,
            batching_size=10,
            update_frequency_s=timer_s,
            on_error=on_error,
            send_when_idle=False,
        ) as a,
        MartiCommClient("r", address, session=session) as b,
    ):
        b.get_messages()  # join
        yield a, b


# ---------------------------------------------------------------------------------- refused timer flushes
def test_timer_flushed_refusal_is_raised_by_the_next_call_with_ids(address):
    seen: list[BatchRefusedError] = []
    # a 1 s timer: the two sends share its batch (with 50 ms, a loaded machine sent "fits" alone)
    with timer_sender_and_receiver(address, "s", "refuse-sync", seen.append, timer_s=1.0) as (a, b):
        ok_id = a.send_message("r", "fits")
        big_id = a.send_message("r", b"x" * (LIMIT + 1))  # the whole batch is refused (atomic Send)
        until(lambda: a.refused_batches == 1, "the timer's batch refused", timeout_s=5.0)  # nobody told yet
        assert seen and seen[0].message_ids == (ok_id, big_id) and seen[0].background
        with pytest.raises(BatchRefusedError) as info:
            a.send_message("r", "next")
        err = info.value
        assert isinstance(err, ResourceExhaustedError)  # still caught as the broker's status class
        assert err.message_ids == (ok_id, big_id)
        assert f"max_payload_bytes={LIMIT}" in str(err) and err is seen[0]
        stats = a.get_communication_stats()
        assert (stats.refused_batches, stats.refused_messages) == (1, 2)
        assert (a.refused_batches, a.refused_messages) == (1, 2)
        # reported once: the client works normally afterwards, and "next" was not buffered
        a.send_message("r", "after")
        a.flush()
        assert drain(b, 1) == ["after"]


def test_refusal_is_raised_by_any_next_call(address):
    with MartiCommClient("s2", address, session="refuse-any", batching_size=10, update_frequency_s=0.05) as a:
        big_id = a.send_message("nobody", b"x" * (LIMIT + 1))
        until(lambda: a.refused_batches == 1, "the timer's batch refused", timeout_s=5.0)
        with pytest.raises(BatchRefusedError) as info:
            a.get_agent_states()
        assert info.value.message_ids == (big_id,)
        assert a.get_agent_states() == {}


def test_refused_unicast_batch_before_a_broadcast_is_raised_by_it_and_the_broadcast_not_sent(address):
    with (
        MartiCommClient("s3", address, session="refuse-mixed", batching_size=10, update_frequency_s=0) as a,
        MartiCommClient("r", address, session="refuse-mixed") as b,
    ):
        big_id = a.send_message("r", b"x" * (LIMIT + 1))
        with pytest.raises(BatchRefusedError) as info:
            a.broadcast("hello all")  # sends the buffered batch first (sender order), which is refused
        assert info.value.message_ids == (big_id,) and not info.value.background
        assert a.broadcast("hello again").receivers == 1
        assert drain(b, 1) == ["hello again"]


class _Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE

    def details(self):
        return "broker restarting"


def test_transient_error_of_a_timer_flush_keeps_the_batch(address):
    seen: list = []
    with timer_sender_and_receiver(address, "s4", "transient", seen.append) as (a, b):
        real, calls = a._stub.Send, []

        def flaky(request, timeout=None):
            calls.append(1)
            if len(calls) == 1:
                raise _Unavailable()
            return real(request, timeout=timeout)

        a._stub.Send = flaky
        a.send_message("r", "survives")
        assert drain(b, 1) == ["survives"]
        assert len(calls) >= 2 and a.refused_batches == 0 and seen == []
        a.send_message("r", "and the client is fine")


async def test_async_timer_flushed_refusal_is_raised_by_the_next_call(address):
    seen: list[BatchRefusedError] = []
    async with (
        AsyncMartiCommClient(
            "s",
            address,
            session="refuse-async",
            batching_size=10,
            update_frequency_s=0.05,
            on_error=seen.append,
        ) as a,
        AsyncMartiCommClient("r", address, session="refuse-async") as b,
    ):
        await b.get_messages()
        big_id = await a.send_message("r", b"x" * (LIMIT + 1))
        deadline = time.monotonic() + 5
        while a.refused_batches == 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        with pytest.raises(ResourceExhaustedError) as info:
            await a.get_messages()
        assert isinstance(info.value, BatchRefusedError) and info.value.message_ids == (big_id,)
        assert seen == [info.value]
        await a.send_message("r", "after")
        await a.flush()
        assert [m.content for m in await b.get_messages(timeout_s=2)] == ["after"]


# ---------------------------------------------------------------------------------- loop end without close
@pytest.mark.parametrize("update_frequency_s", [0.0, 0.001, 30.0])
@pytest.mark.parametrize("raises", [False, True])
def test_async_client_never_closed_sends_its_buffer_when_asyncio_run_ends(
    address, update_frequency_s, raises
):
    """With or without a flush timer (``update_frequency_s=0``: none; review s4 finding 2), and whether
    ``main`` returns or raises, what is buffered when ``asyncio.run`` ends reaches the broker."""
    session = f"loop-end-{update_frequency_s}-{raises}"
    with MartiCommClient("r", address, session=session) as b:

        async def main() -> None:
            c = AsyncMartiCommClient(
                "s", address, session=session, update_frequency_s=update_frequency_s, batching_size=100
            )
            await c.connect()
            for i in range(3):
                await c.send_message("r", i)
            if raises:
                raise RuntimeError("main failed")

        if raises:
            with pytest.raises(RuntimeError):
                asyncio.run(main())
        else:
            asyncio.run(main())
        assert drain(b, 3) == [0, 1, 2]


#: A user's script: an asyncio client driven by ``loop.run_until_complete`` (no ``close``, no ``asyncio.run``),
#: its messages buffered (batches of 100) or left in flight by the stopped loop when the script exits; argv:
#: address, session, ``close`` (the loop is closed before exit) or ``open``, ``own`` or ``given`` (a caller's
#: channel), ``update_frequency_s``.
RUN_UNTIL_COMPLETE = """
import asyncio, sys
import grpc
from marti.aio import MartiCommClient
address, session, close, given = sys.argv[1], sys.argv[2], sys.argv[3] == "close", sys.argv[4] == "given"
linger = float(sys.argv[5])
async def main():
    channel = grpc.aio.insecure_channel(address) if given else None
    a = MartiCommClient("s", address, session=session, update_frequency_s=linger, batching_size=100, channel=channel)
    await a.connect()
    for i in range(5):
        await a.send_message("r", i)
loop = asyncio.new_event_loop()
loop.run_until_complete(main())
if close:
    loop.close()
"""


@pytest.mark.parametrize(
    ("close_loop", "update_frequency_s"),
    [(True, 0.0), (False, 0.0), (True, 0.001), (False, 0.001), (True, 30.0)],
)
def test_async_client_never_closed_sends_its_buffer_at_exit_after_run_until_complete(
    address, close_loop, update_frequency_s, tmp_path
):
    """Review s4b finding 2: a loop run by ``run_until_complete`` ends without cancelling the client's task,
    so nothing is sent at the loop's end; the client's exit handler sends the buffered messages (over a
    short-lived sync channel) when the process exits, whether or not the loop was closed. With a flush timer
    (``send_when_idle``) the first message's batch is left in flight by the stopped loop: it goes out again."""
    session = f"run-until-complete-{close_loop}-{update_frequency_s}"
    script = tmp_path / "sender.py"
    script.write_text(RUN_UNTIL_COMPLETE)
    with MartiCommClient("r", address, session=session) as b:
        b.get_messages()  # join
        how = "close" if close_loop else "open"
        done = subprocess.run(
            [sys.executable, str(script), address, session, how, "own", str(update_frequency_s)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert drain(b, 5) == [0, 1, 2, 3, 4]


def test_async_client_on_a_callers_channel_logs_what_it_cannot_send_at_exit(address, tmp_path):
    """The same on a caller's ``grpc.aio`` channel, which the client cannot dial again at exit: an error
    names the client and the messages it did not send (nothing silent)."""
    script = tmp_path / "sender.py"
    script.write_text(RUN_UNTIL_COMPLETE)
    done = subprocess.run(
        [sys.executable, str(script), address, "run-until-complete-given", "close", "given", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "broker client 's' (session 'run-until-complete-given')" in done.stderr
    assert "5 buffered message(s)" in done.stderr and "were not sent" in done.stderr


# ---------------------------------------------------------------------------------- publish
def test_publish_reports_receivers_and_can_require_them(address):
    with (
        MartiCommClient("pub", address, session="pubsub") as a,
        MartiCommClient("sub", address, session="pubsub", topics=["plans"]) as b,
    ):
        early = a.publish("plans", {"n": 0})  # b has not subscribed yet (it subscribes on its first Receive)
        assert isinstance(early, PublishResult) and early.receivers == 0 and not early.duplicate
        with pytest.raises(NoSubscribersError) as info:
            a.publish("plans", {"n": 1}, require_subscribers=True)
        assert isinstance(info.value, FailedPreconditionError) and info.value.topic == "plans"
        assert b.get_messages() == []  # subscribes now; the earlier messages were not stored for it
        late = a.publish("plans", {"n": 2}, require_subscribers=True)
        assert late.receivers == 1 and late.message_id != early.message_id
        assert [m.content for m in b.get_messages(timeout_s=2)] == [{"n": 2}]
        # refused before anything is sent, naming the value (the broker would refuse the batch)
        for bad in ("", None):
            with pytest.raises(InvalidArgumentError, match="topic must be a non-empty string"):
                a.publish(bad, {"n": 3})
        for bad in ([], [""], ["sub", 7]):
            with pytest.raises(InvalidArgumentError, match="receiver"):
                a.send_message(bad, {"n": 4})
        assert a.refused_batches == 0


def test_publish_sends_at_once_after_the_buffered_messages(address):
    with (
        MartiCommClient("pub2", address, session="pub-order", batching_size=50, update_frequency_s=0) as a,
        MartiCommClient("sub2", address, session="pub-order", topics=["t"]) as b,
    ):
        b.get_messages()
        a.send_message("sub2", "first")  # buffered (batch of 50, no timer)
        assert a.publish("t", "second").receivers == 1  # sends "first", then itself
        assert [m.content for m in b.get_messages(timeout_s=2)] == ["first", "second"]


async def test_async_publish_reports_receivers(address):
    async with (
        AsyncMartiCommClient("apub", address, session="apubsub") as a,
        AsyncMartiCommClient("asub", address, session="apubsub", topics=["t"]) as b,
    ):
        assert (await a.publish("t", "lost")).receivers == 0
        with pytest.raises(NoSubscribersError):
            await a.publish("t", "lost too", require_subscribers=True)
        await b.get_messages()
        result = await a.publish("t", "got", require_subscribers=True)
        assert result.receivers == 1
        assert [m.content for m in await b.get_messages(timeout_s=2)] == ["got"]


def test_package_keeps_every_old_name():
    for name in (
        "AgentStateEntry", "AsyncMartiCommClient", "CommunicationStats", "MartiCommClient", "Message",
        "decode_payload", "encode_payload", "open_channel", "_Core", "IDEMPOTENT_METHODS", "SERVICE_NAME",
        "JSON", "OCTET_STREAM",
    ):  # fmt: skip
        assert hasattr(sdk, name), name
