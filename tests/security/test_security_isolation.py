"""Session isolation: what one agent can see of another session's (or another agent's) data.

Trust model (docs/operations.md, "Security"): the bearer token (or the mTLS client certificate) is the
authentication boundary; agent ids inside a deployment are declared by the caller, not proven. Within
that model the services guarantee:

- broker: mailboxes, topics and the state board are scoped by session; a session created with
  ``fixed_roster`` admits only its roster: any other agent id (observers included) gets NOT_FOUND on
  Receive, Subscribe, Send, PutState and GetStates;
- env server: session ids are 96-bit random tokens (not enumerable), and sessions opened on a bidi
  ``Session`` stream are closed when that stream ends, so another caller cannot step them afterwards;
- experience store: tables are shared by design (agents share experience); separate tenants need separate
  stores or tokens.
"""

from __future__ import annotations

import grpc
import pytest

from marti.api.broker.v1 import broker_service_pb2 as bpb
from marti.api.broker.v1 import broker_service_pb2_grpc as bgrpc
from marti.api.env.v1 import env_pb2 as epb
from marti.api.env.v1 import env_service_pb2_grpc as egrpc
from marti.clients.broker import MartiCommClient
from marti.rpc.settings import ServerSettings


@pytest.fixture(scope="module")
def address(stack_factory) -> str:
    return stack_factory(ServerSettings(host="127.0.0.1", port=0))


def _code(fn) -> grpc.StatusCode:
    try:
        fn()
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code()


def test_messages_and_states_do_not_cross_sessions(address):
    a = MartiCommClient("a", address, session="run-1")
    b1 = MartiCommClient("b", address, session="run-1")
    b2 = MartiCommClient("b", address, session="run-2")  # same agent id, other session
    a.send_message("b", {"secret": 1})
    a.broadcast_state({"plan": "x"})
    a.flush()
    assert b2.get_messages(timeout_s=0.3) == []
    assert b2.get_agent_states(exclude_self=False) == {}
    assert [m.content for m in b1.get_messages(timeout_s=2)] == [{"secret": 1}]
    assert b1.get_agent_states() == {"a": {"plan": "x"}}
    for c in (a, b1, b2):
        c.close()


def test_fixed_roster_refuses_outsiders_and_observers(address):
    channel = grpc.insecure_channel(address)
    stub = bgrpc.BrokerServiceStub(channel)
    stub.CreateSession(bpb.CreateSessionRequest(session="private", agents=["a", "b"], fixed_roster=True))
    a = MartiCommClient("a", address, session="private")
    a.send_message("b", {"secret": 2})
    a.broadcast_state({"secret": 3})
    a.flush()
    nf = grpc.StatusCode.NOT_FOUND
    for intruder in ("mallory", ""):
        assert (
            _code(lambda i=intruder: stub.GetStates(bpb.GetStatesRequest(session="private", agent_id=i)))
            == nf
        )
    assert _code(lambda: stub.Receive(bpb.ReceiveRequest(session="private", agent_id="mallory"))) == nf
    assert _code(lambda: stub.PutState(bpb.PutStateRequest(session="private", agent_id="mallory"))) == nf
    sub = stub.Subscribe(bpb.SubscribeRequest(session="private", agent_id="mallory"), timeout=10)
    assert _code(lambda: next(iter(sub))) == nf
    # the roster itself still works
    states = stub.GetStates(bpb.GetStatesRequest(session="private", agent_id="b"))
    assert [s.agent_id for s in states.states] == ["a"]
    b = MartiCommClient("b", address, session="private")
    assert [m.content for m in b.get_messages(timeout_s=10)] == [{"secret": 2}]
    for c in (a, b):
        c.close()
    channel.close()


def test_env_stream_sessions_die_with_their_stream(address):
    channel = grpc.insecure_channel(address)
    stub = egrpc.EnvServiceStub(channel)
    env_id = stub.ListEnvs(epb.ListEnvsRequest()).envs[0].env_id
    requests = [epb.SessionRequest(create=epb.CreateSessionRequest(env_id=env_id, seed=1))]
    responses = list(stub.Session(iter(requests), timeout=10))
    session_id = responses[0].create.session_id
    assert len(session_id) == 24 and int(session_id, 16) >= 0  # 96 random bits
    code = _code(lambda: stub.Reset(epb.ResetRequest(session_id=session_id), timeout=10))
    assert code == grpc.StatusCode.NOT_FOUND
    # a guessed id is unknown too
    code = _code(lambda: stub.Reset(epb.ResetRequest(session_id="0" * 24), timeout=10))
    assert code == grpc.StatusCode.NOT_FOUND
    channel.close()
