"""The SDK's default batching with a linger, on a fake channel (no broker, no sockets).

Every rpc the clients make lands in :class:`FakeChannel`, which records it with the time it was made, so the
tests see exactly when a batch leaves: with ``send_when_idle=False``, a lone message after the linger and not
before (the tests that need a batch to stay buffered turn it off: with it, the flush timer sends a lone
message at once); with the default ``send_when_idle``, a lone message at once whatever the linger and the
messages buffered during a Send in flight as one batch when it ends; a full batch at once, ``flush``/``close``
at once, a refused timer flush reported by the next call, a transient failure retried after
:data:`~marti.clients.broker.protocol.TIMER_RETRY_S`, and a flush timer that sleeps while idle. (The same
rule against a real broker: ``tests/integration/broker/test_broker_send_when_idle.py``.)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import grpc
import pytest

from marti.api.broker.v1 import broker_pb2
from marti.api.broker.v1 import broker_service_pb2 as pb
from marti.api.common.v1 import common_pb2
from marti.clients.broker import (
    DEFAULT_BATCHING_SIZE,
    DEFAULT_LINGER_S,
    DEFAULT_MAX_BATCH_BYTES,
    AsyncMartiCommClient,
    BatchRefusedError,
    MartiCommClient,
)
from marti.clients.broker.protocol import TIMER_RETRY_S
from marti.codec import broker as codec
from marti.errors import ResourceExhaustedError, UnavailableError


class _Status(grpc.RpcError):
    """A gRPC error with a status code, as a real channel raises."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def envelopes(frame: common_pb2.CompressedFrame) -> list[broker_pb2.Envelope]:
    """The envelopes of a sent frame (raw or zstd)."""
    kind = codec.CODEC_NONE if frame.codec == common_pb2.CODEC_NONE else codec.CODEC_ZSTD
    raw = codec.decode(frame.data, kind, frame.uncompressed_bytes, 1 << 30)
    return list(broker_pb2.EnvelopeBatch.FromString(raw).envelopes)


class FakeChannel:
    """A channel whose unary calls are answered here and recorded as ``(method, request, perf_counter)``.

    Args:
        aio: Answer with coroutines (for the asyncio client).
        fail: ``fail(method, request)`` may raise to make that call fail (called before answering).
    """

    def __init__(self, aio: bool = False, fail: Callable[[str, object], None] | None = None) -> None:
        self.aio = aio
        self.fail = fail
        self.calls: list[tuple[str, object, float]] = []
        self.lock = threading.Lock()

    def _answer(self, method: str, request: object) -> object:
        with self.lock:
            self.calls.append((method, request, time.perf_counter()))
        if self.fail is not None:
            self.fail(method, request)
        if method in ("Send", "Broadcast"):
            n = len(envelopes(request.frame))
            return (pb.SendResponse if method == "Send" else pb.BroadcastResponse)(accepted=n)
        if method == "PutState":
            return pb.PutStateResponse(state=broker_pb2.AgentState(agent_id=request.agent_id, version=1))
        return getattr(pb, f"{method}Response")()

    def unary_unary(self, path: str, *args, **kwargs):
        method = path.rsplit("/", 1)[1]
        if self.aio:

            async def acall(request, timeout=None, **kw):
                return self._answer(method, request)

            return acall
        return lambda request, timeout=None, **kw: self._answer(method, request)

    def unary_stream(self, *args, **kwargs):
        return None

    def sends(self) -> list[tuple[list[object], float]]:
        """Each Send's messages (decoded contents) and when it was made."""
        out = []
        with self.lock:
            calls = list(self.calls)
        for method, request, at in calls:
            if method == "Send":
                out.append(([e.payload for e in envelopes(request.frame)], at))
        return out

    def methods(self) -> list[str]:
        with self.lock:
            return [m for m, _, _ in self.calls]


def wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


def client(channel: FakeChannel, **kw) -> MartiCommClient:
    return MartiCommClient("a", "unused:1", session="s", channel=channel, **kw)


def lingering(channel: FakeChannel, **kw) -> MartiCommClient:
    """A client whose batches all wait the linger (``send_when_idle=False``): only ``flush``, ``close``, a
    full batch or the timer after ``update_frequency_s`` sends them."""
    return client(channel, send_when_idle=False, **kw)


# ------------------------------------------------------------------------------------------ the defaults
def test_defaults_batch_with_a_short_linger_in_both_clients():
    assert (DEFAULT_BATCHING_SIZE, DEFAULT_LINGER_S, DEFAULT_MAX_BATCH_BYTES) == (128, 0.001, 1 << 20)
    with client(FakeChannel()) as c:
        core = c._core
        assert (core.batching_size, core.update_frequency_s, core.max_batch_bytes) == (128, 0.001, 1 << 20)
    a = AsyncMartiCommClient("a", "unused:1", session="s", channel=FakeChannel(aio=True))
    assert (a._core.batching_size, a._core.update_frequency_s) == (128, 0.001)


def test_without_send_when_idle_a_lone_message_goes_after_the_linger():
    ch = FakeChannel()
    with lingering(ch) as c:
        t0 = time.perf_counter()
        c.send_message("b", {"n": 1})  # buffered: send_message does not wait for the broker
        wait_for(lambda: ch.sends())
        [(payloads, at)] = ch.sends()
        assert payloads == [b'{"n":1}']
        assert at - t0 >= DEFAULT_LINGER_S  # not before the linger
        assert at - t0 < 1.0  # and soon after it (a generous bound: the machine is shared)


def test_lone_message_waits_the_whole_linger_and_not_longer_than_needed():
    linger = 0.5
    ch = FakeChannel()
    with lingering(ch, update_frequency_s=linger) as c:
        t0 = time.perf_counter()
        c.send_message("b", "one")
        wait_for(lambda: ch.sends())
        at = ch.sends()[0][
            1
        ]  # when the Send was made: none before it (no sleep then a look, which can be late)
        assert len(ch.sends()) == 1 and linger <= at - t0 < linger + 1.0


def test_full_batch_goes_at_once_in_the_call_that_fills_it():
    ch = FakeChannel()
    with lingering(ch, batching_size=4, update_frequency_s=30) as c:
        for i in range(3):
            c.send_message("b", i)
        assert ch.sends() == []
        c.send_message("b", 3)  # the 4th fills the batch: sent before send_message returns
        assert [p for p, _ in ch.sends()] == [[b"0", b"1", b"2", b"3"]]


def test_max_batch_bytes_closes_a_batch_early():
    ch = FakeChannel()
    with lingering(ch, max_batch_bytes=1000, update_frequency_s=30) as c:
        c.send_message("b", b"x" * 600)
        assert ch.sends() == []
        c.send_message("b", b"y" * 600)  # 1200 bytes >= 1000
        assert len(ch.sends()) == 1 and len(ch.sends()[0][0]) == 2


def test_batching_size_one_sends_in_the_call():
    ch = FakeChannel()
    with client(ch, batching_size=1) as c:
        c.send_message("b", "now")
        assert [p for p, _ in ch.sends()] == [[b'"now"']]
        assert c._flusher is None  # no timer thread at all


def test_flush_and_close_send_what_is_buffered():
    ch = FakeChannel()
    c = lingering(ch, update_frequency_s=30)
    c.send_message("b", "flushed")
    c.flush()
    assert [p for p, _ in ch.sends()] == [[b'"flushed"']]
    c.send_message("b", "closed")
    c.broadcast("to all")
    c.close()  # a 30 s linger: only close can have sent these
    assert [p for p, _ in ch.sends()] == [[b'"flushed"'], [b'"closed"']]
    assert ch.methods().count("Broadcast") == 1


def test_broadcast_state_sends_the_buffered_messages_first():
    ch = FakeChannel()
    with lingering(ch, update_frequency_s=30) as c:
        c.send_message("b", "before the state")
        c.broadcast_state({"turn": 1})
        assert [m for m in ch.methods() if m in ("Send", "PutState")] == ["Send", "PutState"]


def test_get_messages_sends_the_buffered_messages_first():
    ch = FakeChannel()
    with lingering(ch, update_frequency_s=30) as c:
        c.send_message("b", "question")
        c.get_messages()
        assert [m for m in ch.methods() if m in ("Send", "Receive")] == ["Send", "Receive"]


# ------------------------------------------------------------------------------------------ errors
def test_refused_timer_flush_of_a_default_client_is_raised_by_the_next_call():
    def refuse(method, request):
        if method == "Send":
            raise _Status(grpc.StatusCode.RESOURCE_EXHAUSTED, "over max_payload_bytes")

    seen: list[BatchRefusedError] = []
    ch = FakeChannel(fail=refuse)
    with client(ch, on_error=seen.append) as c:
        mid = c.send_message("b", "refused")
        wait_for(lambda: c.refused_batches == 1)  # the timer sent it after the linger
        assert seen and seen[0].message_ids == (mid,) and seen[0].background
        with pytest.raises(BatchRefusedError) as info:
            c.get_agent_states()
        assert isinstance(info.value, ResourceExhaustedError) and info.value.message_ids == (mid,)
        assert c.refused_messages == 1


@pytest.mark.parametrize(
    ("call", "own_rpc"),
    [
        (lambda c: c.flush(), None),
        (lambda c: c.broadcast_state({"turn": 1}), "PutState"),
        (lambda c: c.get_messages(), "Receive"),
        (lambda c: c.publish("t", "topic message"), "Send"),
    ],
    ids=["flush", "broadcast_state", "get_messages", "publish"],
)
def test_calls_that_flush_first_raise_the_refusal_of_a_timer_flush_in_flight(call, own_rpc):
    in_rpc, release = threading.Event(), threading.Event()

    def slow_refusal(method, request):
        if method == "Send":
            in_rpc.set()
            release.wait(5)
            raise _Status(grpc.StatusCode.RESOURCE_EXHAUSTED, "over max_payload_bytes")

    ch = FakeChannel(fail=slow_refusal)
    with client(ch) as c:
        mid = c.send_message("b", "refused")
        assert in_rpc.wait(5)  # the timer took the batch and waits for the broker
        before = ch.methods().count(own_rpc)
        threading.Timer(0.2, release.set).start()
        with pytest.raises(BatchRefusedError) as info:
            call(c)  # waits for the timer's Send, then reports its refusal
        assert info.value.message_ids == (mid,)
        assert own_rpc is None or ch.methods().count(own_rpc) == before  # and did not go on


async def test_async_flush_raises_the_refusal_of_a_timer_flush_in_flight_meanwhile():
    in_rpc, release = asyncio.Event(), asyncio.Event()

    class Slow(FakeChannel):
        def unary_unary(self, path, *args, **kwargs):
            if path.rsplit("/", 1)[1] != "Send":
                return super().unary_unary(path)

            async def refuse(request, timeout=None, **kw):
                in_rpc.set()
                await release.wait()
                raise _Status(grpc.StatusCode.RESOURCE_EXHAUSTED, "over max_payload_bytes")

            return refuse

    async with AsyncMartiCommClient("a", "unused:1", session="s", channel=Slow(aio=True)) as c:
        mid = await c.send_message("b", "refused")
        await asyncio.wait_for(in_rpc.wait(), 5)
        asyncio.get_running_loop().call_later(0.2, release.set)
        with pytest.raises(BatchRefusedError) as info:
            await c.flush()
        assert info.value.message_ids == (mid,)


def test_transient_failure_of_a_timer_flush_is_retried_after_a_pause():
    failures = [1]

    def flaky(method, request):
        if method == "Send" and failures:
            failures.pop()
            raise _Status(grpc.StatusCode.UNAVAILABLE, "broker restarting")

    ch = FakeChannel(fail=flaky)
    with client(ch) as c:
        c.send_message("b", "survives")
        wait_for(lambda: len(ch.sends()) == 2)
        (first, t1), (second, t2) = ch.sends()
        assert first == second == [b'"survives"']  # the same batch again (same ids: delivered once)
        assert t2 - t1 >= TIMER_RETRY_S  # not hammered every linger (1 ms)
        assert c.refused_batches == 0


def test_close_that_cannot_send_says_which_messages_were_not_sent():
    def down(method, request):
        if method in ("Send", "Ack"):
            raise _Status(grpc.StatusCode.UNAVAILABLE, "broker down")

    ch = FakeChannel(fail=down)
    c = lingering(ch, update_frequency_s=30)
    mid = c.send_message("b", "stuck")
    with pytest.raises(UnavailableError) as info:
        c.close()
    assert any(mid in note and "not sent" in note for note in info.value.__notes__)


def test_exit_flush_sends_the_buffer_and_logs_refusals_nobody_raised(caplog):
    from marti.clients.broker import sync_client

    def refuse(method, request):
        if method == "Send":
            raise _Status(grpc.StatusCode.RESOURCE_EXHAUSTED, "over max_payload_bytes")

    refused = client(FakeChannel(fail=refuse))
    big = refused.send_message("b", b"x" * 200)
    wait_for(lambda: refused.refused_batches == 1)  # refused by a timer flush: no call has raised it yet
    ch = FakeChannel()
    waiting = lingering(ch, update_frequency_s=30)
    waiting.send_message("b", "ok")  # only the exit flush can send it now
    with caplog.at_level("ERROR", logger="marti.broker.client"):
        sync_client._flush_at_exit()  # what atexit runs
    assert [p for p, _ in ch.sends()] == [[b'"ok"']]
    assert any(big in r.getMessage() and "at exit" in r.getMessage() for r in caplog.records), caplog.text
    waiting.close()
    refused.close()  # the refusal was reported at exit, once: close does not raise it again


def test_idle_flush_timer_does_not_wake_up():
    ch = FakeChannel()
    with client(ch) as c:
        c.send_message("b", "one")
        wait_for(lambda: ch.sends())
        calls = []
        real = c._core.flush_delay

        def counting():
            calls.append(1)
            return real()

        c._core.flush_delay = counting
        time.sleep(0.3)  # 150 linger periods: a polling timer would check about 150-300 times
        assert len(calls) <= 2, len(calls)
        c.send_message("b", "two")  # and it still wakes up for the next message
        wait_for(lambda: len(ch.sends()) == 2)


# ------------------------------------------------------------------------------------------ asyncio
async def test_async_client_without_send_when_idle_sends_a_lone_message_after_the_linger():
    ch = FakeChannel(aio=True)
    async with AsyncMartiCommClient("a", "unused:1", session="s", channel=ch, send_when_idle=False) as c:
        t0 = time.perf_counter()
        await c.send_message("b", "lone")
        assert ch.sends() == []
        deadline = time.monotonic() + 5
        while not ch.sends():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        assert ch.sends()[0][1] - t0 >= DEFAULT_LINGER_S


async def test_async_full_batch_goes_at_once_and_close_flushes():
    ch = FakeChannel(aio=True)
    c = await AsyncMartiCommClient(
        "a", "unused:1", session="s", channel=ch, batching_size=2, update_frequency_s=30, send_when_idle=False
    ).connect()
    await c.send_message("b", 1)
    assert ch.sends() == []
    await c.send_message("b", 2)
    assert [p for p, _ in ch.sends()] == [[b"1", b"2"]]
    await c.send_message("b", 3)
    await c.close()
    assert [p for p, _ in ch.sends()] == [[b"1", b"2"], [b"3"]]


async def test_async_broadcast_state_sends_the_buffered_messages_first():
    ch = FakeChannel(aio=True)
    async with AsyncMartiCommClient(
        "a", "unused:1", session="s", channel=ch, update_frequency_s=30, send_when_idle=False
    ) as c:
        await c.send_message("b", "before the state")
        await c.broadcast_state({"turn": 1})
        assert [m for m in ch.methods() if m in ("Send", "PutState")] == ["Send", "PutState"]


def test_async_client_sends_the_buffer_when_its_loop_ends_without_close():
    ch = FakeChannel(aio=True)
    c = AsyncMartiCommClient(
        "a", "unused:1", session="s", channel=ch, update_frequency_s=30, send_when_idle=False
    )

    async def main() -> None:
        await c.connect()
        await c.send_message("b", "left behind")  # no flush, no close: asyncio.run ends here

    asyncio.run(main())
    assert [p for p, _ in ch.sends()] == [[b'"left behind"']]


def test_async_loop_end_flush_that_fails_is_logged(caplog):
    def down(method, request):
        if method == "Send":
            raise _Status(grpc.StatusCode.UNAVAILABLE, "broker down")

    c = AsyncMartiCommClient("a", "unused:1", session="s", channel=FakeChannel(aio=True, fail=down))

    async def main() -> str:
        await c.connect()
        return await c.send_message("b", "cannot leave")

    with caplog.at_level("ERROR", logger="marti.broker.client"):
        mid = asyncio.run(main())
    assert any("could not send 1 buffered message(s)" in r.getMessage() and mid in r.getMessage() for r in
               caplog.records), caplog.text  # fmt: skip


async def test_async_cancelled_send_keeps_its_batch():
    started = asyncio.Event()

    class Slow(FakeChannel):
        def unary_unary(self, path, *args, **kwargs):
            method = path.rsplit("/", 1)[1]
            if method != "Send":
                return super().unary_unary(path)

            async def hang(request, timeout=None, **kw):
                started.set()
                await asyncio.sleep(3600)

            return hang

    c = await AsyncMartiCommClient(
        "a", "unused:1", session="s", channel=Slow(aio=True), update_frequency_s=30, send_when_idle=False
    ).connect()
    await c.send_message("b", "kept")
    task = asyncio.ensure_future(c.flush())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert c._core.buffered_ids() != []  # put back: the next flush retries it with the same id
    c._closed = True  # nothing can be sent on this channel; drop the client without a final flush
    c._flusher.cancel()


def test_exit_flush_waits_for_a_batch_in_flight_at_most_timeout_s_then_logs(caplog):
    """A batch still in flight (another thread holds the send lock) when the exit flush runs: it waits
    ``timeout_s``, then says the batch may not have reached the broker, and returns."""
    ch = FakeChannel()
    c = lingering(ch, update_frequency_s=30, timeout_s=0.2)
    c.send_message("b", "ok")
    held, release = threading.Event(), threading.Event()

    def in_flight() -> None:
        with c._send_lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=in_flight)
    t.start()
    assert held.wait(30)
    t0 = time.monotonic()
    with caplog.at_level("ERROR", logger="marti.broker.client"):
        c._flush_on_exit()
    took = time.monotonic() - t0
    release.set()
    t.join()
    assert 0.15 <= took < 10, took  # waiting for the batch in flight would take 30 s
    assert "still in flight after 0.2 s" in caplog.text, caplog.text
    assert ch.sends() == []  # nothing was sent behind the batch in flight
    c.close()
