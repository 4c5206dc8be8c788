"""An env server restart loses its in-memory sessions: clients get a typed ``SessionLostError`` (NOT_FOUND with a
``google.rpc.ErrorInfo`` detail, reason ``SESSION_LOST``) and a ``marti.make(address=...)`` env carries on after
``reset()``, over both transports and the async client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from sdk_servers import once_reachable
from waits import until

import marti
import marti.env.make
from marti.aio import EnvClient as AsyncEnvClient
from marti.api.env.v1 import env_pb2 as pb
from marti.api.env.v1 import env_service_pb2_grpc as pb_grpc
from marti.clients.env import EnvClient, RemoteParallelEnv
from marti.errors import ERROR_DOMAIN, NotFoundError, SessionLostError, UnavailableError
from marti.rpc.testing import ServerThread
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings

ENV = "collaborative_task_solving"


class RestartableServer:
    """An env server in a thread that can be stopped and started again on the same port (fresh memory)."""

    def __init__(self) -> None:
        self.port = 0
        self.thread: ServerThread | None = None

    def start(self) -> str:
        """Start (again) on the same port; returns the address."""
        settings = EnvServerSettings(host="127.0.0.1", port=self.port, reap_interval_s=60.0)
        self.thread = ServerThread(lambda: [env_service(settings)], settings)
        server = self.thread.start()
        self.port = server.port
        return server.address

    def stop(self) -> None:
        """Stop the server; its sessions are gone."""
        if self.thread is not None:
            self.thread.stop(grace_s=None)
            self.thread = None

    def restart(self) -> None:
        """Stop, then start on the same port."""
        self.stop()
        self.start()


@pytest.fixture
def server():
    srv = RestartableServer()
    srv.start()
    yield srv
    srv.stop()


def address(srv: RestartableServer) -> str:
    return f"127.0.0.1:{srv.port}"


def play(env: Any, n: int) -> list[Any]:
    """Play up to ``n`` steps with a fixed text; returns the step tuples."""
    out = []
    for _ in range(n):
        if not env.agents:
            break
        out.append(env.step({env.acting_agents[0]: "plan: split evenly"}))
    return out


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_make_env_recovers_after_server_restart(server, transport):
    env = marti.make(ENV, address=address(server), seed=5, transport=transport, timeout_s=10)
    try:
        first_obs, _ = env.reset(seed=3)
        assert play(env, 2)
        old_id = env.session_id
        server.restart()

        with pytest.raises(SessionLostError) as info:
            once_reachable(lambda: env.step({env.acting_agents[0]: "x"}))
        err = info.value
        assert isinstance(err, NotFoundError)
        assert "reset()" in str(err)
        assert err.session_id == old_id
        assert env.session_lost
        # every later step says the same, without a round trip that could succeed
        with pytest.raises(SessionLostError, match=r"reset\(\)"):
            env.step({env.acting_agents[0]: "x"})

        obs, _ = once_reachable(lambda: env.reset(seed=3))
        assert env.session_id != old_id and not env.session_lost
        assert obs == first_obs, "same env id, config and seed: the same episode as before the restart"
        assert play(env, 3), "play continues in the new session"
    finally:
        env.close()


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_reset_alone_recovers_a_lost_session(server, transport):
    env = marti.make(ENV, address=address(server), transport=transport, scenario="debate", timeout_s=10)
    try:
        env.reset(seed=1)
        server.restart()
        obs, infos = once_reachable(lambda: env.reset(seed=1))
        assert set(obs) == set(env.possible_agents) and infos
        assert play(env, 2)
    finally:
        env.close()


def test_reset_while_server_away_raises_unavailable_then_recovers(server):
    env = marti.make(ENV, address=address(server), transport="unary", timeout_s=2)
    try:
        env.reset(seed=0)
        server.stop()
        with pytest.raises(UnavailableError):
            env.reset(seed=0)
        server.start()
        once_reachable(lambda: env.reset(seed=0))
        assert play(env, 1)
    finally:
        env.close()


@pytest.fixture
def stub(server) -> Iterator[pb_grpc.EnvServiceStub]:
    """A raw EnvService stub over a channel of its own to ``server`` (closed after the test)."""
    channel = grpc.insecure_channel(address(server))
    try:
        yield pb_grpc.EnvServiceStub(channel)
    finally:
        channel.close()


def test_unary_lost_session_carries_error_info_detail(stub):
    """The rich error model on the wire: NOT_FOUND plus ``ErrorInfo(reason=SESSION_LOST, domain=marti.ai)``."""
    with pytest.raises(grpc.RpcError) as info:
        stub.Step(pb.StepRequest(session_id="nope", request_id="r1"), timeout=10)
    call = info.value
    assert call.code() == grpc.StatusCode.NOT_FOUND
    status = rpc_status.from_call(call)
    assert status is not None, "the status must carry grpc-status-details-bin"
    found = []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            ei = error_details_pb2.ErrorInfo()
            detail.Unpack(ei)
            found.append(ei)
    assert [(e.reason, e.domain, dict(e.metadata)) for e in found] == [
        ("SESSION_LOST", ERROR_DOMAIN, {"session_id": "nope"})
    ]


def test_stream_lost_session_status_carries_error_info_detail(stub):
    """In-band statuses on the Session stream carry the same detail."""
    req = pb.SessionRequest(sequence=1, step=pb.StepRequest(session_id="gone", request_id="r"))
    (resp,) = list(stub.Session(iter([req]), timeout=10))
    assert resp.status.code == grpc.StatusCode.NOT_FOUND.value[0]
    ei = error_details_pb2.ErrorInfo()
    assert len(resp.status.details) == 1 and resp.status.details[0].Unpack(ei)
    assert (ei.reason, ei.domain, ei.metadata["session_id"]) == ("SESSION_LOST", ERROR_DOMAIN, "gone")


def test_sync_client_maps_lost_session_from_the_detail(server):
    with EnvClient(address(server), timeout_s=10) as client:
        info = client.create_session(ENV, seed=0)
        client.reset(info.session_id, seed=0)
        server.restart()
        with pytest.raises(SessionLostError) as err:
            once_reachable(lambda: client.step(info.session_id, {"leader": "x"}))
        assert err.value.session_id == info.session_id
        # an unknown env id is still a plain NotFoundError: the class comes from the detail, not the code
        with pytest.raises(NotFoundError) as other:
            client.create_session("no_such_env")
        assert type(other.value) is NotFoundError


def test_async_client_gets_session_lost_and_recreates(server):
    async def run() -> None:
        client = AsyncEnvClient(address(server), timeout_s=10)
        try:
            info = await client.create_session(ENV, seed=0)
            first = await client.reset(info.session_id, seed=0)
            await asyncio.get_running_loop().run_in_executor(None, server.restart)
            deadline = time.monotonic() + 20
            while True:
                try:
                    await client.step(info.session_id, {first.acting_agents[0]: "x"})
                except UnavailableError:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.1)
                    continue
                except SessionLostError as e:
                    assert e.session_id == info.session_id
                    break
                pytest.fail("step on a lost session must raise SessionLostError")
            again = await client.create_session(ENV, seed=0)
            assert (await client.reset(again.session_id, seed=0)).observations == first.observations
        finally:
            await client.close()

    asyncio.run(run())


def test_step_batch_marks_lost_envs(server):
    from marti.clients.env import open_channel

    channel = open_channel(address(server))
    envs = [marti.make(ENV, channel=channel, transport="unary", timeout_s=10) for _ in range(2)]
    try:
        for e in envs:
            e.reset(seed=2)
        server.restart()
        acts = [{e.acting_agents[0]: "x"} for e in envs]
        out = once_reachable(lambda: RemoteParallelEnv.step_batch(envs, acts))
        assert all(isinstance(r, SessionLostError) and "reset()" in str(r) for r in out)
        assert all(e.session_lost for e in envs)
        for e in envs:
            e.reset(seed=2)
        assert marti.env.make.step_many(envs, [{e.acting_agents[0]: "x"} for e in envs])
    finally:
        for e in envs:
            e.close()
        channel.close()


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_idle_sessions_are_reaped_on_both_transports(transport: str) -> None:
    """docs/environments.md: the server reaps a session unused for idle_timeout_s, a stream's one too (the
    stream itself stays open); the env's next step says it is lost and reset() carries on."""
    from marti.rpc.testing import serve_in_thread

    # 2 s: a reset and a step in a row on a loaded machine come well within it (at 0.3 s the new session
    # could be reaped between them)
    settings = EnvServerSettings(port=0, idle_timeout_s=2.0, reap_interval_s=0.05)
    with (
        serve_in_thread(lambda: [env_service(settings)], settings) as server,
        EnvClient(server.address) as watch,
    ):
        env = marti.make(ENV, address=server.address, transport=transport, seed=1)
        try:
            env.reset()
            first = env.session_id
            until(lambda: watch.server_info().live_sessions == 0, "the idle session reaped")
            with pytest.raises(SessionLostError):
                env.step({env.acting_agents[0]: "task_1: 1"})
            env.reset()
            assert env.session_id != first
            env.step({env.acting_agents[0]: "task_1: 1"})
        finally:
            env.close()
