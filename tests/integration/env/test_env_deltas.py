"""Delta results over real gRPC (port 0): every client flavour rebuilds exactly the observations and infos the
env produced, across resets, bad steps and lost sessions; deltas really travel (smaller responses); an old
client (no ``delta_base``) and an old server (no ``result_id``) both still work."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import marti.env.make as me
from marti.api.env.v1 import env_pb2 as pb
from marti.api.env.v1 import env_service_pb2_grpc as pb_grpc
from marti.clients.env import AsyncEnvClient, EnvClient, delta_cache, open_channel
from marti.codec.env import map_to_proto
from marti.errors import InvalidArgumentError, SessionLostError
from services.env_server import convert

ENV = "collaborative_task_solving"
CFG = {"scenario": "resource_allocation", "max_turns": 6}
TEXTS = ["task_1: 1\ntask_2: 2", "task_1: 1", "score: 0.4 revise", "\x00", "task_3: 1", "score: 1 accept"]


def _local_trace(seed: int, episodes: int) -> list:
    env = me.make(ENV, seed=seed, **CFG)
    out = []
    for e in range(episodes):
        out.append(env.reset(seed=seed + e))
        k = 0
        while env.agents:
            out.append(env.step({env.acting_agents[0]: TEXTS[k % len(TEXTS)]}))
            k += 1
    return out


def _client_trace(client, seed: int, episodes: int, stream: bool) -> list:
    api = client.stream() if stream else client
    sid = api.create_session(ENV, CFG, seed=seed).session_id
    out = []
    try:
        for e in range(episodes):
            r = api.reset(sid, seed=seed + e)
            out.append((r.observations, r.infos))
            k = 0
            while r.agents:
                if k == 2:  # a bad step in the middle: the session and the client's base stay as they were
                    with pytest.raises(InvalidArgumentError):
                        api.step(sid, {"nobody": "x"})
                r = api.step(sid, {r.acting_agents[0]: TEXTS[k % len(TEXTS)]})
                out.append(r.as_tuple())
                k += 1
    finally:
        if stream:
            api.close()
        else:
            api.close_session(sid)
    return out


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_step_by_step_deltas_equal_local_play_across_resets_and_bad_steps(env_server, stream) -> None:
    with EnvClient(env_server[0], timeout_s=10) as client:
        assert client.deltas is not None
        assert _client_trace(client, 5, 3, stream) == _local_trace(5, 3)
        assert len(client.deltas) == 0, "closed sessions are forgotten"
    with EnvClient(env_server[0], timeout_s=10, deltas=False) as client:
        assert client.deltas is None
        assert _client_trace(client, 5, 3, stream) == _local_trace(5, 3)


def test_batched_envs_with_deltas_equal_local_play(env_server) -> None:
    ch = open_channel(env_server[0])
    try:
        remote = [me.make(ENV, channel=ch, seed=i, **CFG) for i in range(3)]
        local = [me.make(ENV, seed=i, **CFG) for i in range(3)]
        for episode in range(2):
            assert [e.reset(seed=10 + episode) for e in remote] == [e.reset(seed=10 + episode) for e in local]
            k = 0
            while any(e.agents for e in local):
                acts = [
                    {e.acting_agents[0]: TEXTS[(k + i) % len(TEXTS)]} if e.agents else {}
                    for i, e in enumerate(local)
                ]
                live = [i for i, e in enumerate(local) if e.agents]
                got = me.step_many([remote[i] for i in live], [acts[i] for i in live])
                assert got == [local[i].step(acts[i]) for i in live]
                k += 1
        assert len(delta_cache(ch)) == 3
        for e in remote:
            e.close()
        assert len(delta_cache(ch)) == 0, "stream sessions are forgotten when their stream closes"
    finally:
        ch.close()


def test_async_batches_in_flight_with_deltas_equal_local_play(env_server) -> None:
    async def main() -> list:
        async with AsyncEnvClient(env_server[0], timeout_s=10) as client:
            sids = [(await client.create_session(ENV, CFG, seed=i)).session_id for i in range(4)]
            state = list(await asyncio.gather(*(client.reset(s, seed=i) for i, s in enumerate(sids))))
            trace = [[(r.observations, r.infos)] for r in state]

            async def group(idx: list[int]) -> None:
                k = 0
                while any(state[i].agents for i in idx):
                    live = [i for i in idx if state[i].agents]
                    steps = [
                        (sids[i], {state[i].acting_agents[0]: TEXTS[(k + i) % len(TEXTS)]}) for i in live
                    ]
                    for i, r in zip(live, await client.batch_step(steps), strict=True):
                        state[i] = r
                        trace[i].append(r.as_tuple())
                    k += 1

            await asyncio.gather(group([0, 2]), group([1, 3]))  # two batches in flight
            for s in sids:
                await client.close_session(s)
            assert len(client.deltas) == 0
            return trace

    traces = asyncio.run(main())
    for i, trace in enumerate(traces):
        env = me.make(ENV, seed=i, **CFG)
        want = [env.reset(seed=i)]
        k = 0
        while env.agents:
            want.append(env.step({env.acting_agents[0]: TEXTS[(k + i) % len(TEXTS)]}))
            k += 1
        assert trace == want


def test_deltas_travel_and_an_old_client_gets_full_results(env_server) -> None:
    ch = open_channel(env_server[0])
    stub = pb_grpc.EnvServiceStub(ch)
    try:
        sid = stub.CreateSession(
            pb.CreateSessionRequest(env_id=ENV, config=map_to_proto(CFG), seed=1)
        ).session_id
        reset = stub.Reset(pb.ResetRequest(session_id=sid))
        assert reset.result_id == 1
        act = [pb.AgentAction(agent="agent_1", action=pb.Value(text=TEXTS[0]))]
        old = stub.Step(pb.StepRequest(session_id=sid, actions=act))  # an old client: no delta_base
        assert old.result_id == 2 and old.delta_base == 0
        assert not any(r.HasField("observation_edit") or r.info_delta for r in old.results)
        act = [pb.AgentAction(agent="agent_2", action=pb.Value(text=TEXTS[1]))]
        new = stub.Step(pb.StepRequest(session_id=sid, actions=act, delta_base=2))
        assert new.result_id == 3 and new.delta_base == 2
        assert all(r.HasField("observation_edit") and r.info_delta for r in new.results)
        assert new.ByteSize() < old.ByteSize() / 2, (new.ByteSize(), old.ByteSize())
        stale = stub.Step(pb.StepRequest(session_id=sid, actions=[], delta_base=2))  # not the last result
        assert stale.delta_base == 0 and stale.result_id == 4
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))
    finally:
        ch.close()


def test_a_server_without_deltas_still_serves_a_new_client(env_server, monkeypatch) -> None:
    full_step, full_reset = convert.step_to_proto, convert.reset_to_proto

    def old_step(outcome, out=None, base=None):  # an old server: ignores delta_base, sends no result ids
        out = full_step(outcome, out)
        out.result_id = 0
        return out

    def old_reset(outcome, out=None):
        out = full_reset(outcome, out)
        out.result_id = 0
        return out

    monkeypatch.setattr(convert, "step_to_proto", old_step)
    monkeypatch.setattr(convert, "reset_to_proto", old_reset)
    with EnvClient(env_server[0], timeout_s=10) as client:
        assert _client_trace(client, 7, 2, stream=True) == _local_trace(7, 2)
        assert len(client.deltas) == 0


def test_a_lost_session_is_forgotten_and_its_replacement_starts_in_full(env_server) -> None:
    ch = open_channel(env_server[0])
    try:
        env = me.make(ENV, channel=ch, seed=3, transport="unary", **CFG)
        local = me.make(ENV, seed=3, **CFG)
        assert env.reset(seed=3) == local.reset(seed=3)
        assert env.step({"agent_1": TEXTS[0]}) == local.step({"agent_1": TEXTS[0]})
        assert delta_cache(ch).get(env.session_id).result_id == 2
        lost = env.session_id
        env_server[1].close(lost)  # the server drops it (as after a restart or idle reaping)
        with pytest.raises(SessionLostError):
            env.step({"agent_2": TEXTS[1]})
        assert delta_cache(ch).get(lost) is None
        assert env.reset(seed=4) == local.reset(seed=4)  # re-created: a new session, played in full first
        assert env.session_id != lost
        for k in range(3):
            assert env.step({env.acting_agents[0]: TEXTS[k]}) == local.step(
                {local.acting_agents[0]: TEXTS[k]}
            )
        env.close()
    finally:
        ch.close()


ACTION = st.one_of(
    st.sampled_from(TEXTS + ["task_1: 2\ntask_2: 0\ntask_3: 3", "score: 0.9 accept", ""]),
    st.text(alphabet=st.sampled_from("task_:0123 \nscorevi😀"), max_size=40),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**20), actions=st.lists(ACTION, min_size=1, max_size=30), stream=st.booleans())
def test_any_play_with_deltas_equals_in_process_play(env_server, seed, actions, stream) -> None:
    """Random actions (garbage included), episodes ended and reset: the delta client sees what the env made."""
    local = me.make(ENV, seed=seed, **CFG)
    with EnvClient(env_server[0], timeout_s=10) as client:
        api = client.stream() if stream else client
        sid = api.create_session(ENV, CFG, seed=seed).session_id
        try:
            r = api.reset(sid)
            assert (r.observations, r.infos) == local.reset()
            for text in actions:
                if not local.agents:
                    r = api.reset(sid)
                    assert (r.observations, r.infos) == local.reset()
                act = {local.acting_agents[0]: text}
                r = api.step(sid, act)
                assert r.as_tuple() == local.step(act)
        finally:
            if stream:
                api.close()
            else:
                api.close_session(sid)
