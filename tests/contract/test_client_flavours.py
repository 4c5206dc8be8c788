"""One contract for every client flavour: the same calls give the same results and the same error types.

Each area's client is run as ``sync`` (``marti.X``) and ``aio`` (``marti.aio.X``, its coroutines driven on one
event loop), and envs also ``in-process`` (``marti.make`` without an address) against ``remote``, all against
real servers on a free port: broker, env server, store, an idle trainer and a scripted inference service
(fixed completions, so no model is loaded) hosted by one server that requires a token.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sdk_servers import ScriptedInference, serve_sdk_services

import marti
import marti.aio
from marti.api.broker.v1 import broker_service_pb2 as bpb
from marti.api.broker.v1 import broker_service_pb2_grpc as bgrpc
from marti.clients.env import EnvClient
from marti.errors import InvalidArgumentError, NotFoundError
from marti.rpc.client.channel import make_channel
from marti.types.inference import Completion, InferenceResult, ModelInfo
from marti.types.trajectory import Trajectory, Turn

TOKEN = "contract-token"
ENV = "collaborative_task_solving"

#: Client class of each area, per flavour.
CLIENTS: dict[str, dict[str, type]] = {
    "sync": {
        "broker": marti.MartiCommClient,
        "env": EnvClient,
        "store": marti.ExperienceSharingClient,
        "trainer": marti.TrainerClient,
        "inference": marti.InferenceClient,
    },
    "aio": {
        "broker": marti.aio.MartiCommClient,
        "env": marti.aio.EnvClient,
        "store": marti.aio.ExperienceSharingClient,
        "trainer": marti.aio.TrainerClient,
        "inference": marti.aio.InferenceClient,
    },
}


@pytest.fixture(scope="module")
def address(tmp_path_factory) -> Iterator[str]:
    """Broker, env server, store, idle trainer and scripted inference hosted by one server, token required."""
    with serve_sdk_services(
        tmp_path_factory.mktemp("store"), TOKEN, ScriptedInference(), trainer=True
    ) as address:
        yield address


class _Blocking:
    """Calls a client's methods as plain calls whatever its flavour (coroutines run on the flavour's loop)."""

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._client = client
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def run(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            return self._loop.run_until_complete(out) if inspect.isawaitable(out) else out

        return run


class Flavour:
    """Builds the clients of one flavour and closes them (and its event loop) at the end of a test."""

    def __init__(self, name: str, address: str) -> None:
        self.name = name
        self.address = address
        self.loop = asyncio.new_event_loop()
        self._open: list[_Blocking] = []

    def client(self, area: str, *args: Any, **kwargs: Any) -> Any:
        """A client of ``area`` dialing the test server (extra arguments go to its constructor)."""
        cls = CLIENTS[self.name][area]
        if area in ("broker", "store"):  # agent-bound clients: agent id first, then the address
            args = (args[0], self.address, *args[1:])
        else:
            args = (self.address, *args)
        client = _Blocking(cls(*args, token=TOKEN, **kwargs), self.loop)
        self._open.append(client)
        return client

    def close(self) -> None:
        for client in reversed(self._open):
            client.close()
        self.loop.close()


@pytest.fixture(params=["sync", "aio"])
def flavour(request, address) -> Iterator[Flavour]:
    """Each client flavour in turn."""
    f = Flavour(request.param, address)
    yield f
    f.close()


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------------------------------------ env


def test_env_session_round_trip_and_errors(flavour):
    env = flavour.client("env", timeout_s=10)
    assert f"{ENV}-v1" in [e["env_id"] for e in env.list_envs()]
    info = env.create_session(ENV, seed=1)
    reset = env.reset(info.session_id, seed=3)
    assert reset.acting_agents == ["agent_1"] and set(reset.observations) >= {"agent_1"}
    step = env.step(info.session_id, {"agent_1": "task_1: 1"})
    assert step.acting_agents == ["agent_2"]
    with pytest.raises(InvalidArgumentError, match="'agent_7'"):
        env.step(info.session_id, {"agent_7": "x"})
    assert env.close_session(info.session_id) is True
    with pytest.raises(NotFoundError):
        env.step(info.session_id, {"agent_1": "x"})
    with pytest.raises(NotFoundError, match="'no_such_env'"):
        env.create_session("no_such_env")


def test_env_results_agree_across_flavours(address):
    """The sync and aio clients see the same observations for the same seeds."""
    seen = []
    for name in CLIENTS:
        f = Flavour(name, address)
        try:
            env = f.client("env", timeout_s=10)
            sid = env.create_session(ENV, seed=5).session_id
            r = env.reset(sid, seed=5)
            s = env.step(sid, {"agent_1": "task_1: 1"})
            seen.append((r.observations, s.observations, s.rewards, s.terminations))
            env.close_session(sid)
        finally:
            f.close()
    assert seen[0] == seen[1]


@pytest.mark.parametrize("where", ["in-process", "remote"])
def test_make_in_process_and_remote_agree(address, where):
    """``marti.make`` gives the same env (and the same errors) with and without an address."""
    kwargs = {} if where == "in-process" else {"address": address, "token": TOKEN}
    with pytest.raises(NotFoundError):
        marti.make("no_such_env", **kwargs)
    env = marti.make(ENV, seed=5, **kwargs)
    other = marti.make(ENV, seed=5)  # the in-process reference
    try:
        assert env.reset(seed=5) == other.reset(seed=5)
        assert env.step({"agent_1": "task_1: 1"}) == other.step({"agent_1": "task_1: 1"})
        with pytest.raises(InvalidArgumentError, match="'agent_7'"):
            env.step({"agent_7": "x"})
    finally:
        env.close()
        other.close()


# ------------------------------------------------------------------------------------------------ broker


def test_broker_send_receive_round_trip(flavour):
    session = _unique("contract")
    sender = flavour.client("broker", "a1", session=session, timeout_s=5)
    receiver = flavour.client("broker", "a2", session=session, timeout_s=5)
    receiver.get_messages()  # joins the session before the message is sent
    message_id = sender.send_message("a2", {"x": [1, 2]})
    sender.flush()
    got = receiver.get_messages(timeout_s=2)
    assert [(m.message_id, m.sender, m.content) for m in got] == [(message_id, "a1", {"x": [1, 2]})]
    assert receiver.get_messages() == []  # acked on receipt: not delivered twice


def test_broker_agent_outside_a_fixed_roster_is_not_found(flavour):
    session = _unique("roster")
    channel = make_channel(flavour.address, token=TOKEN)
    try:
        bgrpc.BrokerServiceStub(channel).CreateSession(
            bpb.CreateSessionRequest(session=session, agents=["a1"], fixed_roster=True), timeout=5
        )
    finally:
        channel.close()
    with pytest.raises(NotFoundError, match="'zed'"):  # the sync constructor joins; aio joins on first call
        flavour.client("broker", "zed", session=session, timeout_s=5).get_messages()


# ------------------------------------------------------------------------------------------------ store


def test_store_insert_sample_and_unknown_table(flavour):
    store = flavour.client("store", "a1", timeout_s=5)
    table = _unique("t")
    store.create_table(table)
    turn = Turn(step=0, prompt_token_ids=[1, 2], response_token_ids=[3], response_logprobs=[-0.5], reward=1.0)
    traj = Trajectory(episode_id="e1", agent_id="a1", turns=[turn])
    key = store.share_experience(traj, table=table)
    sampled = store.sample(table, 1, timeout_s=2)
    assert [s.key for s in sampled] == [key]
    got = sampled[0].trajectory
    assert (got.episode_id, got.agent_id, got.turns[0].response_token_ids) == ("e1", "a1", [3])
    assert store.info(table).size == 1
    with pytest.raises(NotFoundError):
        store.info("no_such_table")
    with pytest.raises(NotFoundError):
        store.sample("no_such_table", 1, timeout_s=1)
    with pytest.raises(NotFoundError):
        store.share_experience(traj, table="no_such_table")


# ------------------------------------------------------------------------------------------------ trainer


def test_trainer_unknown_job_is_not_found(flavour):
    trainer = flavour.client("trainer", timeout_s=5)
    assert trainer.list_jobs() == []
    with pytest.raises(NotFoundError):
        trainer.get_job("no-such-job")
    with pytest.raises(NotFoundError):
        trainer.stop_job("no-such-job")


# ------------------------------------------------------------------------------------------------ inference


def test_inference_generate_models_and_errors(flavour):
    client = flavour.client("inference", timeout_s=5)
    assert client.models() == [ModelInfo("a1", "a1", 2, False, 64)]
    result = client.generate("a1", text="abc", n=2, max_tokens=2)
    assert result == InferenceResult(
        choices=[Completion(f"c{i}", "cba", [7, 8], [-0.5, -0.25], "length", 2, i) for i in range(2)],
        prompt_token_ids=[1, 2, 3],
        agent="a1",
    )
    with pytest.raises(NotFoundError, match="'nope'"):
        client.generate("nope", text="abc")
    with pytest.raises(InvalidArgumentError, match="exactly one prompt"):
        client.generate("a1", text="abc", token_ids=[1])
    with pytest.raises(InvalidArgumentError, match="n must be >= 1"):
        client.generate("a1", text="abc", n=0)


# ------------------------------------------------------------------------------------------------ channel=

#: Per area: the constructor's positional arguments before the address, and one cheap call (client -> value).
_ON_CHANNEL: dict[str, tuple[tuple[str, ...], Any]] = {
    "broker": (("a1",), lambda c: c.get_communication_stats()),
    "env": ((), lambda c: c.list_envs()),
    "store": (("a1",), lambda c: c.list_tables()),
    "trainer": ((), lambda c: c.list_jobs()),
    "inference": ((), lambda c: c.models()),
}


def test_every_client_runs_on_a_given_channel_and_leaves_it_open(flavour):
    """Every area's client, sync and aio, accepts an open channel through ``channel=`` (no address dialed: the
    address is a port nothing listens on), calls over it, and its close() leaves the channel to its owner."""

    async def open_aio() -> Any:
        return make_channel(flavour.address, token=TOKEN, aio=True)

    aio = flavour.name == "aio"
    channel = (
        flavour.loop.run_until_complete(open_aio()) if aio else make_channel(flavour.address, token=TOKEN)
    )
    try:
        for area, (head, one_call) in _ON_CHANNEL.items():
            kwargs = {"session": _unique("s")} if area == "broker" else {}
            cls = CLIENTS[flavour.name][area]
            for _ in range(2):  # the second client works on the channel the first one's close() left open
                client = _Blocking(
                    cls(*head, "127.0.0.1:1", timeout_s=5, channel=channel, **kwargs), flavour.loop
                )
                if area == "broker" and aio:
                    client.connect()
                one_call(client)
                client.close()
    finally:
        if aio:
            flavour.loop.run_until_complete(channel.close())
        else:
            channel.close()
