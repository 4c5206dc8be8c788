"""What the broker SDK promises a user (issue 29, items 2, 3, 4, 9 and the broker part of 14), over a real broker
process on port 0, sync and asyncio clients alike:

* a constructed client has joined its session: a broadcast from another process reaches it before it polls,
  and ``broadcast`` says how many agents it reached;
* with ``auto_ack=False`` a redelivery of a message the caller has not acked reaches the caller;
* a closed client raises ``FailedPreconditionError`` naming its agent on every call, also under a waiting
  ``get_messages`` or ``subscribe`` (never ``asyncio.CancelledError``);
* integers beyond 64 bits arrive exactly, and NaN becomes ``null`` whatever its neighbours;
* arguments of the wrong type or sign raise ``InvalidArgumentError`` naming the argument.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import threading
import time

import pytest
from faults import procs

from marti.clients.broker import AsyncMartiCommClient, MartiCommClient
from marti.errors import FailedPreconditionError, InvalidArgumentError

ACK_TIMEOUT_S = 0.3


@pytest.fixture(scope="module")
def address():
    """A real ``marti broker`` process on port 0 (the clients run in this process or in children of it)."""
    broker = procs.start("broker", settings={"tick_interval_s": "0.05", "ack_timeout_s": str(ACK_TIMEOUT_S)})
    try:
        yield broker.address
    finally:
        broker.stop()


# ------------------------------------------------------------------------------ item 2: joined on construction
_WAITING_AGENT = """
import asyncio, json, sys
from marti.clients.broker import AsyncMartiCommClient, MartiCommClient
address, session, flavour = sys.argv[1:4]
if flavour == "sync":
    client = MartiCommClient("agent_2", address, session=session)
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps([m.content for m in client.get_messages(timeout_s=2)]), flush=True)
    client.close()
else:
    async def main():
        async with AsyncMartiCommClient("agent_2", address, session=session) as client:
            print("ready", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            print(json.dumps([m.content for m in await client.get_messages(timeout_s=2)]), flush=True)
    asyncio.run(main())
"""


@pytest.mark.parametrize("flavour", ["sync", "aio"])
def test_a_constructed_client_in_another_process_gets_a_broadcast_sent_before_it_polls(address, flavour):
    session = f"join-{flavour}"
    child = subprocess.Popen(
        [sys.executable, "-c", _WAITING_AGENT, address, session, flavour],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout.readline().strip() == "ready"  # agent_2 constructed, never polled
        with MartiCommClient("agent_1", address, session=session) as agent_1:
            result = agent_1.broadcast({"plan": "task_1: 2", "big": 2**70})
            agent_1.flush()
        assert result.receivers == 1 and not result.duplicate
        out, _ = child.communicate("go\n", timeout=20)
    finally:
        child.kill()
    assert out.strip() == '[{"plan": "task_1: 2", "big": 1180591620717411303424}]'
    assert child.returncode == 0


async def test_broadcast_says_how_many_agents_it_reached_aio(address):
    async with AsyncMartiCommClient("alone", address, session="count-aio") as a:
        assert (await a.broadcast("nobody")).receivers == 0
        async with (
            AsyncMartiCommClient("b", address, session="count-aio"),
            AsyncMartiCommClient("c", address, session="count-aio"),
        ):
            assert (await a.broadcast("two")).receivers == 2


# ------------------------------------------------------------------------------ item 3: manual acks
def test_an_unacked_redelivery_reaches_the_caller_and_an_acked_message_does_not_come_back(address):
    with (
        MartiCommClient("a", address, session="redeliver") as a,
        MartiCommClient("b", address, session="redeliver", auto_ack=False) as b,
    ):
        a.send_message("b", "m")
        a.flush()
        first = b.get_messages(timeout_s=1)
        assert [(m.content, m.attempt) for m in first] == [("m", 1)]
        again = b.get_messages(timeout_s=ACK_TIMEOUT_S * 6)  # not acked: the broker redelivers it
        assert [(m.message_id, m.attempt) for m in again] == [(first[0].message_id, 2)]
        assert b.ack([first[0].message_id]) == 1
        assert b.get_messages(timeout_s=ACK_TIMEOUT_S * 3) == []  # acked: never again
        assert b.get_broker_stats().dead_lettered == 0


async def test_an_unacked_redelivery_reaches_the_caller_aio(address):
    async with (
        AsyncMartiCommClient("a", address, session="redeliver-aio") as a,
        AsyncMartiCommClient("b", address, session="redeliver-aio", auto_ack=False) as b,
    ):
        await a.send_message("b", "m")
        await a.flush()
        first = await b.get_messages(timeout_s=1)
        again = await b.get_messages(timeout_s=ACK_TIMEOUT_S * 6)
        assert [m.message_id for m in again] == [first[0].message_id] and again[0].attempt == 2
        assert await b.ack([first[0].message_id]) == 1


# ------------------------------------------------------------------------------ item 4: closed clients
CALLS = {
    "send_message": lambda c: c.send_message("x", "m"),
    "broadcast": lambda c: c.broadcast("m"),
    "publish": lambda c: c.publish("t", "m"),
    "flush": lambda c: c.flush(),
    "get_messages": lambda c: c.get_messages(),
    "ack": lambda c: c.ack(["id"]),
    "subscribe": lambda c: c.subscribe(),
    "broadcast_state": lambda c: c.broadcast_state({"turn": 1}),
    "get_agent_states": lambda c: c.get_agent_states(),
    "get_agent_state_entries": lambda c: c.get_agent_state_entries(),
    "get_broker_stats": lambda c: c.get_broker_stats(),
}


def _closed_message(exc: BaseException, agent: str) -> None:
    assert type(exc) is FailedPreconditionError
    assert f"agent {agent!r}" in str(exc) and "closed" in str(exc)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_every_call_on_a_closed_client_raises_at_once(address, call):
    client = MartiCommClient("shut", address, session="closed", batching_size=1)
    client.close()
    with pytest.raises(FailedPreconditionError) as info:
        CALLS[call](client)
    _closed_message(info.value, "shut")
    client.close()  # a second close does nothing


@pytest.mark.parametrize("call", sorted(CALLS) + ["connect"])
async def test_every_call_on_a_closed_aio_client_raises_the_same_class(address, call):
    client = await AsyncMartiCommClient("shut", address, session="closed").connect()
    await client.close()
    with pytest.raises(FailedPreconditionError) as info:
        result = client.connect() if call == "connect" else CALLS[call](client)
        if asyncio.iscoroutine(result):
            await result
    _closed_message(info.value, "shut")


def test_close_sends_what_is_buffered(address):
    with MartiCommClient("r", address, session="close-flush") as r:
        sender = MartiCommClient("s", address, session="close-flush", batching_size=100, update_frequency_s=0)
        sender.send_message("r", "last words")
        sender.close()
        assert [m.content for m in r.get_messages(timeout_s=1)] == ["last words"]


def test_a_get_messages_waiting_in_another_thread_gets_the_closed_error(address):
    client = MartiCommClient("waiter", address, session="close-wait")
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            client.get_messages(timeout_s=10)
        except BaseException as exc:  # noqa: BLE001 - the test checks what came out
            raised.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.3)
    client.close()
    thread.join(5)
    assert len(raised) == 1
    _closed_message(raised[0], "waiter")


@pytest.mark.parametrize("how", ["get_messages", "subscribe"])
async def test_an_aio_client_closed_under_a_waiting_call_gives_the_closed_error(address, how):
    client = await AsyncMartiCommClient("waiter", address, session="close-wait-aio").connect()

    async def wait() -> None:
        if how == "get_messages":
            await client.get_messages(timeout_s=10)
        else:
            async for _ in client.subscribe():
                pass

    task = asyncio.create_task(wait())
    await asyncio.sleep(0.3)
    await client.close()
    with pytest.raises(FailedPreconditionError) as info:
        await asyncio.wait_for(task, 5)
    _closed_message(info.value, "waiter")


# ------------------------------------------------------------------------------ item 9: payloads
PAYLOAD = {"big": 2**70, "neg": -(2**80), "u64": 2**64 - 1, "nan": math.nan, "items": [2**64, math.inf, 1.5]}
ARRIVES = {"big": 2**70, "neg": -(2**80), "u64": 2**64 - 1, "nan": None, "items": [2**64, None, 1.5]}


def test_integers_beyond_64_bits_and_nan_round_trip_over_the_broker(address):
    with (
        MartiCommClient("a", address, session="payloads") as a,
        MartiCommClient("b", address, session="payloads") as b,
    ):
        a.send_message("b", PAYLOAD)
        a.send_message("b", [math.nan])
        a.broadcast_state(PAYLOAD)
        got = [m.content for m in b.get_messages(timeout_s=1)]
        assert got == [ARRIVES, [None]]
        assert type(got[0]["big"]) is int
        assert b.get_agent_states() == {"a": ARRIVES}


async def test_payloads_round_trip_over_the_broker_aio(address):
    async with (
        AsyncMartiCommClient("a", address, session="payloads-aio") as a,
        AsyncMartiCommClient("b", address, session="payloads-aio") as b,
    ):
        await a.send_message("b", PAYLOAD)
        await a.flush()
        assert [m.content for m in await b.get_messages(timeout_s=1)] == [ARRIVES]


# ------------------------------------------------------------------------------ item 14: bad arguments
class _Opaque:
    pass


BAD_CONSTRUCTOR = [
    ("agent_id", 5), ("session", None), ("batching_size", -1), ("batching_size", True), ("timeout_s", -1.0),
    ("update_frequency_s", math.nan), ("topics", "t"), ("dedup_memory", -3), ("compression_level", 30),
    ("max_frame_bytes", 1.5), ("auto_ack", "yes"), ("on_error", 3), ("token", 7),
]  # fmt: skip
BAD_CALLS = [
    ("receiver_id", lambda c: c.send_message(5, "m")),
    ("receiver_id", lambda c: c.send_message([], "m")),
    ("receiver_id", lambda c: c.send_message("a\udcff", "m")),  # one id UTF-8 cannot carry (a lone surrogate)
    ("receiver_id[1]", lambda c: c.send_message(["x", "a\udcff"], "m")),
    ("ttl_s", lambda c: c.send_message("x", "m", ttl_s=-1)),
    ("content_type", lambda c: c.broadcast("m", content_type=3)),
    ("message['a'][1]", lambda c: c.send_message("x", {"a": [1, _Opaque()]})),
    ("state['k']", lambda c: c.broadcast_state({"k": {1, 2}})),
    ("expected_version", lambda c: c.broadcast_state({}, expected_version=-1)),
    ("topic", lambda c: c.publish("", "m")),
    ("max_messages", lambda c: c.get_messages(max_messages=0)),
    ("timeout_s", lambda c: c.get_messages(timeout_s=-1)),
    ("message_ids", lambda c: c.ack("an-id")),
    ("max_unacked", lambda c: c.subscribe(max_unacked=-1)),
    ("exclude_self", lambda c: c.get_agent_states(exclude_self="no")),
    ("whole_broker", lambda c: c.get_broker_stats(whole_broker=1)),
    ("acks", lambda c: c.flush(acks=None)),
]


@pytest.mark.parametrize("cls", [MartiCommClient, AsyncMartiCommClient])
@pytest.mark.parametrize(("name", "value"), BAD_CONSTRUCTOR)
def test_a_bad_constructor_argument_is_named(address, cls, name, value):
    kwargs = {"agent_id": "a", "session": "bad-args", name: value}
    with pytest.raises(InvalidArgumentError, match=name):
        cls(address=address, **kwargs)


@pytest.mark.parametrize(("name", "call"), BAD_CALLS, ids=[n for n, _ in BAD_CALLS])
def test_a_bad_method_argument_is_named(address, name, call):
    with MartiCommClient("a", address, session="bad-args") as client:
        with pytest.raises(InvalidArgumentError) as info:
            call(client)
        assert name in str(info.value)


@pytest.mark.parametrize(("name", "call"), BAD_CALLS, ids=[n for n, _ in BAD_CALLS])
async def test_a_bad_method_argument_is_named_aio(address, name, call):
    async with AsyncMartiCommClient("a", address, session="bad-args") as client:
        with pytest.raises(InvalidArgumentError) as info:
            result = call(client)
            if asyncio.iscoroutine(result):
                await result
        assert name in str(info.value)
