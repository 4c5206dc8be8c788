"""The ``marti.aio`` clients work from whichever event loop uses them.

Each client is built outside any running loop, then used from two ``asyncio.run`` calls (two different
loops), and from a loop in another thread, against real servers on a free port: broker, env server and store
hosted by one server, and an inference service (a fixed-answer servicer, so no model is loaded).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from sdk_servers import serve_sdk_services
from waits import until_async

import marti.aio
from marti.api.inference.v1 import inference_pb2 as ipb
from marti.api.inference.v1 import inference_service_pb2_grpc as igrpc
from marti.rpc.client.channel import make_channel
from marti.rpc.client.transport import ChannelClosedError, LoopBoundChannel
from marti.types.inference import ModelInfo
from marti.types.trajectory import Trajectory, Turn

TOKEN = "loops-token"


class _Models(igrpc.InferenceServiceServicer):
    """An inference service that only lists one model."""

    async def ListModels(self, request, context):  # noqa: N802 - gRPC method name
        return ipb.ListModelsResponse(
            models=[ipb.ModelInfo(id="a1", agent="a1", policy_version=3, pinned=False, max_model_len=64)]
        )


@pytest.fixture(scope="module")
def address(tmp_path_factory) -> Iterator[str]:
    """Broker, env server, store and an inference service hosted by one real server, token required."""
    with serve_sdk_services(tmp_path_factory.mktemp("store"), TOKEN, _Models()) as address:
        yield address


def _in_thread(coro_fn) -> object:
    """Run ``asyncio.run(coro_fn())`` in a new thread (a third loop, not the main thread's) and return its value."""
    out: dict[str, object] = {}

    def target() -> None:
        try:
            out["value"] = asyncio.run(coro_fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            out["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]


def test_env_client_from_two_loops_and_a_thread(address):
    client = marti.aio.EnvClient(address, token=TOKEN, timeout_s=5)

    async def use() -> list[str]:
        envs = await client.list_envs()
        info = await client.create_session("collaborative_task_solving", seed=1)
        assert await client.close_session(info.session_id)
        return sorted(e["env_id"] for e in envs)

    first = asyncio.run(use())
    assert first
    assert asyncio.run(use()) == first
    assert _in_thread(use) == first
    asyncio.run(client.close())


def test_broker_client_from_two_loops(address):
    client = marti.aio.MartiCommClient("a1", address, session="loops", token=TOKEN, timeout_s=5)

    async def use() -> int:
        await client.connect()
        await client.broadcast({"hello": 1})
        await client.flush()
        return await client.broadcast_state({"step": 1})

    first = asyncio.run(use())
    second = asyncio.run(use())
    assert second > first
    asyncio.run(client.close())


def test_batching_broker_client_flushes_on_its_timer_in_every_loop(address):
    """The send lock and the flush timer are made anew in each loop that uses the client."""
    from marti.clients.broker import MartiCommClient

    sender = marti.aio.MartiCommClient(
        "s1",
        address,
        session="loops-batch",
        token=TOKEN,
        timeout_s=5,
        batching_size=8,
        update_frequency_s=0.05,
    )
    receiver = MartiCommClient("r1", address, session="loops-batch", token=TOKEN, timeout_s=5)

    async def send(i: int) -> int:
        await sender.send_message("r1", {"i": i})  # buffered: 1 of 8, only the timer sends it
        assert sender.get_communication_stats().total_sent == i  # not sent yet
        # the timer (period 0.05 s) flushes while this loop runs (total_sent counts the acknowledged ones)
        sent = lambda: sender.get_communication_stats().total_sent  # noqa: E731
        await until_async(lambda: sent() > i, f"loop {i + 1}: the flush timer sent the message", timeout_s=10)
        return sent()

    try:
        for i in range(2):  # two successive asyncio.run loops
            assert asyncio.run(send(i)) == i + 1, f"loop {i + 1}: the flush timer did not send the message"
            assert [m.content for m in receiver.get_messages(timeout_s=10)] == [{"i": i}]
        assert _in_thread(lambda: send(2)) == 3  # a loop in another thread
        assert [m.content for m in receiver.get_messages(timeout_s=10)] == [{"i": 2}]
    finally:
        asyncio.run(sender.close())
        receiver.close()


def test_store_client_from_two_loops(address):
    client = marti.aio.ExperienceSharingClient("a1", address, token=TOKEN, timeout_s=5)
    turn = Turn(step=0, prompt_token_ids=[1], response_token_ids=[2], response_logprobs=[-0.1], reward=1.0)

    async def use(episode: str) -> int:
        await client.share_experience(Trajectory(episode_id=episode, agent_id="a1", turns=[turn]))
        return len(await client.list_tables())

    assert asyncio.run(use("e1")) >= 1
    assert asyncio.run(use("e2")) >= 1
    asyncio.run(client.close())


def test_inference_client_from_two_loops(address):
    client = marti.aio.InferenceClient(address, token=TOKEN, timeout_s=5)
    expected = [ModelInfo("a1", "a1", 3, False, 64)]
    assert asyncio.run(client.models()) == expected
    assert asyncio.run(client.models()) == expected
    asyncio.run(client.close())


def test_a_closed_channel_refuses_calls_with_a_named_error(address):
    channel = make_channel(address, token=TOKEN, aio=True)
    assert isinstance(channel, LoopBoundChannel)
    stub = igrpc.InferenceServiceStub(channel)

    async def call() -> int:
        return len((await stub.ListModels(ipb.ListModelsRequest(), timeout=5)).models)

    assert asyncio.run(call()) == 1
    asyncio.run(channel.close())
    assert channel.closed
    with pytest.raises(ChannelClosedError):
        asyncio.run(call())


def test_one_channel_per_live_loop_and_dead_loops_dropped(address):
    channel = make_channel(address, token=TOKEN, aio=True)
    stub = igrpc.InferenceServiceStub(channel)

    async def call() -> object:
        await stub.ListModels(ipb.ListModelsRequest(), timeout=5)
        return channel.current()

    first = asyncio.run(call())
    second = asyncio.run(call())
    assert first is not second  # a new loop got a new channel
    assert len(channel._channels) == 1  # the first loop's channel was dropped with its loop
    asyncio.run(channel.close())
