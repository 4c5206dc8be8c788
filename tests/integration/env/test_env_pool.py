"""Several env servers behind one client (marti.clients.env): sessions spread over real servers, each
pinned to the server that created it, across unary calls, streams, ``marti.make`` envs, the aio pool, the
``dns:///`` form and the trainer's rollouts; a stopped server fails only its own sessions, by name."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import marti
import marti.env.make as me
from marti.clients.env import (
    AsyncEnvPool,
    EnvClient,
    EnvPool,
    EnvSessions,
    open_env_sessions,
    shared_env_pool,
)
from marti.env.registry import default_registry
from marti.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    SessionLostError,
    UnavailableError,
)
from marti.rpc.testing import ServerThread
from marti.types.inference import Generation
from services.env_server.core.sessions import SessionManager
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings

ENV = "collaborative_task_solving"


class _Counted(SessionManager):
    """A server's session core that counts the sessions ever created on it."""

    created = 0

    async def create_async(self, *args, **kwargs):  # noqa: D102
        self.created += 1
        return await super().create_async(*args, **kwargs)


@dataclass
class _Server:
    thread: ServerThread
    address: str
    sessions: _Counted

    def stop(self) -> None:
        if self.thread.server is not None and not self.thread.server._stopped:
            self.thread.stop(grace_s=0)


def _start(host: str = "127.0.0.1", port: int = 0, max_sessions: int = 32) -> _Server:
    settings = EnvServerSettings(host=host, port=port, max_sessions=max_sessions, reap_interval_s=0.05)
    sessions = _Counted(default_registry(), max_sessions=max_sessions, idle_timeout_s=600.0)
    thread = ServerThread(lambda: [env_service(settings, sessions=sessions)], settings)
    server = thread.start()
    return _Server(thread, server.address, sessions)


@contextlib.contextmanager
def _servers(*caps: int):
    started: list[_Server] = []
    try:
        for cap in caps or (32, 32):
            started.append(_start(max_sessions=cap))
        yield started
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def two():
    with _servers() as servers:
        yield servers


@pytest.fixture(autouse=True)
def _servers_left_empty(request):
    yield
    if "two" in request.fixturenames:
        servers = request.getfixturevalue("two")
        assert [len(s.sessions) for s in servers] == [0, 0]


def _act(result, turn: int = 0) -> dict[str, str]:
    return {result.acting_agents[0]: f"task_1: {turn % 3 + 1}"}


def _local_step(seed: int, turn: int = 0) -> dict:
    """Observations of an in-process env after its reset with ``seed`` and one step (what the remote one gives)."""
    env = me.make(ENV, seed=seed)
    env.reset(seed=seed)
    obs = env.step({env.acting_agents[0]: f"task_1: {turn % 3 + 1}"})[0]
    env.close()
    return obs


def _one_episode_step(sessions: EnvSessions, seed: int) -> dict:
    """Code written against the EnvSessions protocol: list, create, reset, step (single and batched), close."""
    assert ENV + "-v1" in [e["env_id"] for e in sessions.list_envs()]
    info = sessions.create_session(ENV, seed=seed)
    first = sessions.reset(info.session_id, seed=seed)
    obs = sessions.step(info.session_id, _act(first)).observations
    [batched] = sessions.batch_step([(info.session_id, _act(first, 1))])
    assert not isinstance(batched, Exception)
    assert sessions.close_session(info.session_id) is True
    return obs


def test_a_pool_and_a_client_are_interchangeable_where_the_protocol_is_used(two):
    """EnvClient (one server) and EnvPool (several) both satisfy EnvSessions, give the same results through it,
    and open_env_sessions picks the one an address value calls for."""
    a, b = two
    with EnvClient(a.address) as client, EnvPool([a.address, b.address]) as pool:
        for sessions in (client, pool):
            assert isinstance(sessions, EnvSessions)
            assert _one_episode_step(sessions, seed=3) == _local_step(3)
    with open_env_sessions(a.address) as one, open_env_sessions(f"{a.address},{b.address}") as many:
        assert type(one) is EnvClient and type(many) is EnvPool
        assert _one_episode_step(many, seed=4) == _one_episode_step(one, seed=4) == _local_step(4)


def test_sessions_spread_over_both_servers_and_stay_on_theirs(two):
    a, b = two
    with EnvPool([a.address, b.address]) as pool:
        infos = [pool.create_session(ENV, seed=s) for s in range(8)]
        ids = [i.session_id for i in infos]
        assert pool.live_sessions() == {a.address: 4, b.address: 4}
        assert sorted(a.sessions.session_ids()) == sorted(s for s in ids if pool.server_of(s) == a.address)
        assert sorted(b.sessions.session_ids()) == sorted(s for s in ids if pool.server_of(s) == b.address)
        assert len(a.sessions) == len(b.sessions) == 4
        firsts = {sid: pool.reset(sid, seed=k) for k, sid in enumerate(ids)}
        # every step lands on the session's server; the other server does not know the session
        with EnvClient(a.address) as ca, EnvClient(b.address) as cb:
            other = {a.address: cb, b.address: ca}
            for k, sid in enumerate(ids[:4]):
                r = pool.step(sid, _act(firsts[sid]))
                assert r.observations == _local_step(k)
                with pytest.raises(SessionLostError):
                    other[pool.server_of(sid)].step(sid, _act(firsts[sid]))
        # batch_step across both servers: results in request order (each equal to its own seed's local step)
        order = [6, 5, 7, 4]  # the sessions not stepped yet, in an order that mixes the servers
        assert {pool.server_of(ids[k]) for k in order} == {a.address, b.address}
        results = pool.batch_step([(ids[k], _act(firsts[ids[k]])) for k in order])
        for k, r in zip(order, results, strict=True):
            assert not isinstance(r, Exception) and r.observations == _local_step(k), k
        # unknown sessions: a typed error naming the id, before anything is sent
        with pytest.raises(NotFoundError, match="'no-such-session' was not created by this env pool") as e:
            pool.step("no-such-session", {})
        assert type(e.value) is NotFoundError and e.value.metadata["session_id"] == "no-such-session"
        with pytest.raises(NotFoundError):
            pool.batch_step([(ids[0], {}), ("no-such-session", {})])
        # a session its server lost (closed behind the pool's back): SessionLostError once, then forgotten
        lost = ids.pop()
        with EnvClient(pool.server_of(lost)) as c:
            assert c.close_session(lost)
        with pytest.raises(SessionLostError, match="^env server "):
            pool.step(lost, _act(firsts[lost]))
        assert sum(pool.live_sessions().values()) == 7
        with pytest.raises(NotFoundError, match="was not created by this env pool"):
            pool.step(lost, {})
        # closing: each session on its server; a second close is False; a closed session is unknown
        assert all(pool.close_session(sid) for sid in ids)
        assert pool.live_sessions() == {a.address: 0, b.address: 0}
        assert len(a.sessions) == len(b.sessions) == 0
        assert not pool.close_session(ids[0])
        with pytest.raises(NotFoundError):
            pool.reset(ids[0])


def test_stream_sessions_are_placed_and_pinned_like_unary_ones(two):
    a, b = two
    with EnvPool(f"{a.address},{b.address}") as pool:
        with pool.stream() as stream:
            ids = [stream.create_session(ENV, seed=s).session_id for s in range(4)]
            assert pool.live_sessions() == {a.address: 2, b.address: 2}
            assert len(a.sessions) == len(b.sessions) == 2
            firsts = [stream.reset(sid, seed=k) for k, sid in enumerate(ids)]
            results = stream.batch_step([(sid, _act(r)) for sid, r in zip(ids, firsts, strict=True)])
            assert [r.observations for r in results] == [_local_step(k) for k in range(4)]
            assert stream.step(ids[0], _act(results[0], 1)).observations
            assert stream.close_session(ids[0]) and not stream.close_session(ids[0])
            with pytest.raises(NotFoundError):
                stream.step(ids[0], {})
        assert pool.live_sessions() == {a.address: 0, b.address: 0}  # the stream closed the other three


def test_make_spreads_envs_over_the_servers_and_step_many_batches_per_server(two):
    a, b = two
    envs = [marti.make(ENV, address=[a.address, b.address], seed=s) for s in range(4)]
    try:
        assert [e.client.address for e in envs] == [a.address, b.address, a.address, b.address]
        assert len(a.sessions) == len(b.sessions) == 2
        for k, e in enumerate(envs):
            e.reset(seed=k)
        out = me.step_many(envs, [{e.acting_agents[0]: "task_1: 1"} for e in envs])
        assert [o[0] for o in out] == [_local_step(k) for k in range(4)]
        for server in (a, b):
            mine = sorted(e.session_id for e in envs if e.client.address == server.address)
            assert sorted(server.sessions.session_ids()) == mine
        # a lost session is re-created by reset on the same server
        old = envs[3].session_id
        with EnvClient(b.address) as c:
            assert c.close_session(old)
        with pytest.raises(SessionLostError):
            envs[3].step({envs[3].acting_agents[0]: "task_1: 1"})
        envs[3].reset(seed=3)
        assert envs[3].session_id != old and envs[3].session_id in b.sessions.session_ids()
        assert (len(a.sessions), len(b.sessions)) == (2, 2)
        envs[1].close()  # frees its place on b: the next env goes there
        envs.append(marti.make(ENV, address=f"{a.address},{b.address}", seed=9))
        assert envs[-1].client.address == b.address
    finally:
        for e in envs:
            e.close()
    listed = marti.list_envs(address=[a.address, b.address])
    assert [e["env_id"] for e in listed] == [e["env_id"] for e in marti.list_envs(address=a.address)]
    assert f"{ENV}-v1" in [e["env_id"] for e in listed]


async def test_the_aio_pool_places_routes_and_closes(two):
    a, b = two
    async with marti.aio.EnvPool([a.address, b.address]) as pool:
        assert isinstance(pool, AsyncEnvPool)
        ids = [(await pool.create_session(ENV, seed=s)).session_id for s in range(4)]
        assert pool.live_sessions() == {a.address: 2, b.address: 2}
        firsts = [await pool.reset(sid, seed=k) for k, sid in enumerate(ids)]
        results = await pool.batch_step([(sid, _act(r)) for sid, r in zip(ids, firsts, strict=True)])
        assert [r.observations for r in results] == [_local_step(k) for k in range(4)]
        assert (await pool.step(ids[1], _act(results[1], 1))).observations
        with pytest.raises(NotFoundError):
            await pool.step("no-such-session", {})
        assert [await pool.close_session(sid) for sid in ids] == [True] * 4
        assert [e["env_id"] for e in await pool.list_envs()]
    assert len(a.sessions) == len(b.sessions) == 0


def test_a_stopped_server_fails_only_its_sessions_by_name_and_new_ones_go_to_the_other():
    with _servers() as (a, b):
        with EnvPool([a.address, b.address], timeout_s=5) as pool:
            on_a, on_b = (pool.create_session(ENV, seed=s).session_id for s in range(2))
            assert (pool.server_of(on_a), pool.server_of(on_b)) == (a.address, b.address)
            ra, rb = pool.reset(on_a, seed=0), pool.reset(on_b, seed=1)
            b.stop()
            with pytest.raises(UnavailableError, match=f"^env server {b.address}: ") as e:
                pool.step(on_b, _act(rb))
            assert e.value.metadata["env_server"] == b.address
            both = pool.batch_step([(on_b, _act(rb)), (on_a, _act(ra))])
            assert isinstance(both[0], UnavailableError) and b.address in str(both[0])
            assert both[1].observations == _local_step(0)
            # new sessions go to the live server (the stopped one is tried once, then placed last)
            tried_b = []
            real = pool.clients[1].create_session
            pool.clients[1].create_session = lambda *args: tried_b.append(args) or real(*args)
            new = [pool.create_session(ENV, seed=s).session_id for s in range(3)]
            assert [pool.server_of(s) for s in new] == [a.address] * 3
            assert len(tried_b) == 1
            assert len(a.sessions) == 4
            with pytest.raises(UnavailableError, match=b.address):
                pool.close_session(on_b)
            a.stop()
            # every server away: the last one's error
            with pytest.raises(UnavailableError, match="^env server "):
                pool.create_session(ENV)


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_a_made_env_whose_server_stopped_moves_to_another_server_at_reset(transport):
    with _servers() as (a, b), EnvPool([a.address, b.address], timeout_s=5) as pool:
        env_a, env_b = (
            pool.make(ENV, seed=0, transport=transport),
            pool.make(ENV, seed=1, transport=transport),
        )
        assert (env_a.client.address, env_b.client.address) == (a.address, b.address)
        env_b.reset(seed=1)
        old_id = env_b.session_id
        b.stop()
        with pytest.raises((SessionLostError, UnavailableError)):
            env_b.step({env_b.acting_agents[0]: "task_1: 1"})
        obs, _ = env_b.reset(seed=1)  # re-created on a: same env id, config and seed
        local = me.make(ENV, seed=1)
        assert obs == local.reset(seed=1)[0]
        local.close()
        assert env_b.client.address == a.address and env_b.session_id != old_id and not env_b.session_lost
        assert pool.live_sessions() == {a.address: 2, b.address: 0} and len(a.sessions) == 2
        assert env_b.step({env_b.acting_agents[0]: "task_1: 1"})[0] == _local_step(1)
        env_b.close()
        assert pool.live_sessions() == {a.address: 1, b.address: 0} and len(a.sessions) == 1
        a.stop()  # every server away: reset raises the last server's error, named, and may be tried again
        with pytest.raises(UnavailableError, match="^env server "):
            env_a.reset(seed=0)
        assert pool.live_sessions()[a.address] == 1
        env_a.close()
        assert pool.live_sessions() == {a.address: 0, b.address: 0}


def test_a_full_server_sends_the_new_session_to_the_next_one():
    with _servers(1, 8) as (a, b), EnvPool([a.address, b.address]) as pool:
        ids = [pool.create_session(ENV).session_id for _ in range(3)]  # the third: a is full, so b
        assert [pool.server_of(s) for s in ids] == [a.address, b.address, b.address]
        assert (len(a.sessions), len(b.sessions)) == (1, 2)


def test_list_envs_is_what_every_server_offers(two, monkeypatch):
    a, b = two
    with EnvPool([a.address, b.address]) as pool:
        everything = pool.list_envs()
        assert [e["env_id"] for e in everything] == [e["env_id"] for e in marti.list_envs(address=a.address)]
        monkeypatch.setattr(pool.clients[1], "list_envs", lambda: everything[1:2])  # b offers one env only
        assert pool.list_envs() == everything[1:2]


async def test_the_aio_pool_calls_the_servers_concurrently_in_a_batch(two):
    a, b = two
    async with AsyncEnvPool([a.address, b.address]) as pool:
        ids = [(await pool.create_session(ENV)).session_id for _ in range(2)]
        started: list[int] = []
        both = asyncio.Event()

        def waiting(i):
            async def batch_step(steps):  # returns only once the other server's call started too
                started.append(i)
                if len(started) == 2:
                    both.set()
                await asyncio.wait_for(both.wait(), 5)
                return [f"result of {i}" for _ in steps]

            return batch_step

        for i, c in enumerate(pool.clients):
            c.batch_step = waiting(i)
        assert await pool.batch_step([(ids[1], {}), (ids[0], {})]) == ["result of 1", "result of 0"]
        for sid in ids:
            assert await pool.close_session(sid)


def test_a_dns_name_expands_to_one_server_per_address(monkeypatch):
    first = _start("127.0.0.1")
    port = int(first.address.rsplit(":", 1)[1])
    try:
        second = _start("127.0.0.2", port)
    except Exception as e:  # noqa: BLE001 - a machine whose loopback is only 127.0.0.1
        first.stop()
        pytest.skip(f"cannot bind 127.0.0.2:{port} here: {e}")
    real = socket.getaddrinfo

    def resolve(host, *args, **kwargs):
        if host == "envs.marti.test":
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port)) for ip in ("127.0.0.1", "127.0.0.2")
            ]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    try:
        with EnvPool(f"dns:///envs.marti.test:{port}") as pool:
            assert pool.addresses == (f"127.0.0.1:{port}", f"127.0.0.2:{port}")
            ids = [pool.create_session(ENV, seed=s).session_id for s in range(4)]
            assert len(first.sessions) == len(second.sessions) == 2
            assert sorted(second.sessions.session_ids()) == sorted(
                s for s in ids if pool.server_of(s) == f"127.0.0.2:{port}"
            )
            for k, sid in enumerate(ids):
                assert pool.step(sid, _act(pool.reset(sid, seed=k))).observations == _local_step(k)
                assert pool.close_session(sid)
        with pytest.raises(UnavailableError, match="dns:///nowhere.marti.test:1"):
            EnvPool("dns:///nowhere.marti.test:1")
    finally:
        second.stop()
        first.stop()


@pytest.mark.parametrize(
    ("value", "named"),
    [([], "no env server address"), ("", "no env server address"), ("h:1,,g:2", "empty env server address"),
     ("h:1,g", "'g'"), (["h:1", "g:99999"], "'g:99999'"), ("dns:///h", "'dns:///h'"), (["h:1", 5], "5")],
)  # fmt: skip
def test_bad_addresses_are_typed_errors_naming_the_value(value, named):
    with pytest.raises(InvalidArgumentError, match=named):
        EnvPool(value)
    if value != "":  # "" is a single (empty) address: make dials it as ever
        with pytest.raises(InvalidArgumentError, match=named):
            marti.make(ENV, address=value)


def test_make_refuses_a_channel_with_several_servers(two):
    a, b = two
    with EnvClient(a.address) as c, pytest.raises(InvalidArgumentError, match="several"):
        marti.make(ENV, address=[a.address, b.address], channel=c.channel)


def test_one_server_named_twice_is_dialed_as_that_server(two):
    a, _ = two
    twice = f"{a.address},{a.address}"
    env = marti.make(ENV, address=twice, seed=0, timeout_s=10)  # not the raw "A,A" (grpc: misformatted name)
    try:
        assert env.client.address == a.address and env.session_id in a.sessions.session_ids()
        env.reset(seed=0)
    finally:
        env.close()
    assert [e["env_id"] for e in marti.list_envs(address=twice)] == [
        e["env_id"] for e in marti.list_envs(address=a.address)
    ]


def _wait_empty(*servers: _Server) -> None:
    """The servers drop a stream's sessions when it ends, a moment after the client closed it."""
    deadline = time.monotonic() + 5
    while any(len(s.sessions) for s in servers) and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_closed_pool_stream_refuses_new_sessions_and_keeps_no_place(two):
    a, b = two
    with EnvPool([a.address, b.address]) as pool:
        stream = pool.stream()
        stream.create_session(ENV, seed=1)
        stream.close()
        with pytest.raises(FailedPreconditionError, match="pool stream is closed"):
            stream.create_session(ENV, seed=2)
        assert stream._streams == {}  # no new server stream was opened (nothing would ever close it)
        assert pool.live_sessions() == {a.address: 0, b.address: 0}
        # a create in flight when the stream is closed: its session is closed at once, its place freed
        stream = pool.stream()
        server_stream = stream._stream(0)
        real = server_stream.create_session

        def create_then_close(*args):
            info = real(*args)
            stream.close()
            return info

        server_stream.create_session = create_then_close
        with pytest.raises(FailedPreconditionError, match="pool stream is closed"):
            stream.create_session(ENV, seed=3)
        assert pool.live_sessions() == {a.address: 0, b.address: 0}
        assert stream._streams == {} and stream.closed
        _wait_empty(a, b)
        assert len(a.sessions) == len(b.sessions) == 0


def test_an_env_dropped_without_close_frees_its_place_once(two):
    a, b = two
    with EnvPool([a.address, b.address]) as pool:
        first = pool.make(ENV, seed=0, transport="unary")
        second = pool.make(ENV, seed=1, transport="unary")
        assert pool.live_sessions() == {a.address: 1, b.address: 1}
        leaked = first.session_id
        first.reset(seed=0)
        del first
        gc.collect()
        assert pool.live_sessions() == {a.address: 0, b.address: 1}
        second.close()
        second.close()
        del second
        gc.collect()
        assert pool.live_sessions() == {a.address: 0, b.address: 0}  # freed once, not twice
    # marti.make's envs: the process's shared pool frees the place of one dropped unclosed
    shared = shared_env_pool([a.address, b.address])
    third = marti.make(ENV, address=[a.address, b.address], seed=2, transport="unary")
    where, third_id = third.client.address, third.session_id
    before = shared.live_sessions()[where]
    del third
    gc.collect()
    assert shared.live_sessions()[where] == before - 1
    with EnvClient(a.address) as c:  # the dropped envs' sessions stay on their servers until reaped
        assert c.close_session(leaked)
    with EnvClient(where) as c:
        c.close_session(third_id)


# ---------------------------------------------------------------------------------------------- the trainer


class _FakeRuntime:
    """What ``TrainingLoop._runner`` needs from the Ray runtime: ``versions`` and an instant ``generate``."""

    def versions(self):
        return {"agent_1": 0, "agent_2": 0}

    def generate(self, agent, chats, greedy=False):
        return [Generation([1], [2], [-0.1], "task_1: 1", "stop") for _ in chats]


def test_the_training_loop_plays_its_sessions_on_every_env_server(two):
    from marti.config import load_config
    from marti.rpc.testing import serve_in_thread
    from services.comm_broker.servicer import broker_service
    from services.comm_broker.settings import BrokerSettings
    from services.trainer.job.connections.addresses import Addresses
    from services.trainer.job.run.loop import TrainingLoop

    a, b = two
    cfg = load_config(
        Path(__file__).resolve().parents[3] / "examples" / "tiny.yaml",
        ["environment.max_turns=2", f"services.env={a.address},{b.address}"],
    )
    created = (a.sessions.created, b.sessions.created)
    settings = BrokerSettings(port=0, tick_interval_s=0.05)
    with serve_in_thread(lambda: [broker_service(settings)], settings) as broker:
        loop = TrainingLoop(cfg, Addresses(broker.address, cfg.services.env, "unused:1"))
        try:
            results = loop._play(loop._runner(_FakeRuntime(), greedy=False), [1, 2, 3, 4], None, "rollout")
            assert len(results) == 4 and all(r.metrics["messages"] > 0 for r in results)
            pool = loop.connections._env_pool
            assert pool.live_sessions() == {a.address: 0, b.address: 0}  # every env closed
        finally:
            loop.close_channels()
        assert loop.connections._env_pool is None
        # the job's pool is closed with its channels: its clients refuse new calls
        with pytest.raises(marti.errors.FailedPreconditionError, match="is closed"):
            pool.list_envs()
    assert a.sessions.created - created[0] >= 1 and b.sessions.created - created[1] >= 1
    assert a.sessions.created - created[0] + b.sessions.created - created[1] == 4
