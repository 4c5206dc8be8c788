"""The env server over real gRPC: same behaviour as in-process, batched steps, the stream, retries, limits."""

from __future__ import annotations

import re
import time

import pytest

import marti.env.make as me
from marti.clients.env import EnvClient, open_channel
from marti.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SessionLostError,
)
from services.env_server.envs import allocation_problem as ap

ENV = "collaborative_task_solving"


@pytest.fixture
def client(env_server):
    with EnvClient(env_server[0], timeout_s=10) as c:
        yield c


def play(env, texts):
    out = [env.reset(seed=21)]
    for t in texts:
        if not env.agents:
            break
        out.append(env.step({env.acting_agents[0]: t}))
    return out


@pytest.mark.parametrize("transport", ["stream", "unary"])
@pytest.mark.parametrize(
    "cfg", [{}, {"scenario": "debate"}, {"observation_format": "json", "reward_type": "sparse"}]
)
def test_remote_equals_local(env_server, transport, cfg) -> None:
    texts = ["task_1: 1\ntask_2: 2", "answer: 3", "score: 0.4 revise", "\x00", "task_3: 1", "score: 1 accept"]
    remote = me.make(ENV, address=env_server[0], seed=2, transport=transport, **cfg)
    try:
        assert play(remote, texts) == play(me.make(ENV, seed=2, **cfg), texts)
        assert remote.observation_space("agent_1") == me.make(ENV, **cfg).observation_space("agent_1")
    finally:
        remote.close()


def test_list_envs(client) -> None:
    envs = {e["env_id"]: e for e in client.list_envs()}
    cts = envs[f"{ENV}-v1"]
    assert cts["roles"] == {"agent_1": "leader", "agent_2": "executor", "agent_3": "evaluator"}
    assert cts["action_spaces"]["agent_1"].startswith("Text(0..4096")
    keys = {f["name"]: f for f in cts["config_schema"]}
    assert {
        "scenario",
        "max_turns",
        "reward_type",
        "observation_format",
        "difficulty",
        "num_agents",
        "roles",
    } <= set(keys)
    assert keys["reward_type"]["choices"] == ["dense", "sparse"] and keys["max_turns"]["minimum"] == 1.0
    assert "pettingzoo-v1" in envs and "gymnasium-v1" in envs


def test_errors_over_grpc_keep_the_session(client) -> None:
    with pytest.raises(NotFoundError, match="'no_such_env'"):
        client.create_session("no_such_env")
    with pytest.raises(InvalidArgumentError, match="'colour'"):
        client.create_session(ENV, {"colour": "red"})
    s = client.create_session(ENV, {"max_action_chars": 64}, seed=1)
    try:
        with pytest.raises(FailedPreconditionError):
            client.step(s.session_id, {"agent_1": "x"})
        client.reset(s.session_id)
        with pytest.raises(InvalidArgumentError, match="max_action_chars=64"):
            client.step(s.session_id, {"agent_1": "x" * 65})
        with pytest.raises(InvalidArgumentError, match="'agent_7'"):
            client.step(s.session_id, {"agent_7": "x"})
        r = client.step(s.session_id, {"agent_1": "task_1: 1"})
        assert r.acting_agents == ["agent_2"]
    finally:
        assert client.close_session(s.session_id) is True
    with pytest.raises(NotFoundError):
        client.step(s.session_id, {})


def test_batch_step_in_band_errors(client) -> None:
    sids = [client.create_session(ENV, seed=i).session_id for i in range(3)]
    try:
        for sid in sids:
            client.reset(sid)
        out = client.batch_step(
            [(sids[0], {"agent_1": "task_1: 1"}), (sids[1], {"ghost": "x"}), ("missing", {}), (sids[2], {})]
        )
        assert out[0].acting_agents == ["agent_2"] and out[3].acting_agents == ["agent_2"]
        assert isinstance(out[1], InvalidArgumentError) and "'ghost'" in str(out[1])
        assert isinstance(out[2], NotFoundError)
        with pytest.raises(ResourceExhaustedError, match="max_batch_steps=16"):
            client.batch_step([(sids[0], {})] * 17)
    finally:
        for sid in sids:
            client.close_session(sid)


def test_stream_survives_bad_steps_and_closes_its_sessions(client, env_server) -> None:
    sessions = env_server[1]
    before = len(sessions)
    stream = client.stream()
    s = stream.create_session(ENV, seed=4)
    assert len(sessions) == before + 1
    stream.reset(s.session_id)
    with pytest.raises(InvalidArgumentError):
        stream.step(s.session_id, {"nobody": "x"})
    with pytest.raises(NotFoundError):
        stream.step("not-a-session", {})
    assert stream.step(s.session_id, {"agent_1": "task_1: 1"}).acting_agents == ["agent_2"]
    res = stream.batch_step([(s.session_id, {"agent_2": "task_1: 1"}), (s.session_id, {"x": "y"})])
    assert res[0].acting_agents == ["agent_3"] and isinstance(res[1], InvalidArgumentError)
    stream.close()
    deadline = time.monotonic() + 5
    while len(sessions) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(sessions) == before  # a client that goes away leaks no sessions


SEND_LIMIT = 64 * 1024  # grpc.max_send_message_length of the channel in the next tests


def test_a_stream_request_over_the_send_limit_keeps_the_stream_and_its_sessions(env_server) -> None:
    """gRPC refuses to send a message over its channel's ``grpc.max_send_message_length``; on the ``Session``
    stream that ended the stream, and the server closed every session on it. The stream refuses such a request
    itself now, before sending it (ResourceExhaustedError naming the sizes, as the unary call raises), and the
    stream and its sessions go on."""
    client = EnvClient(env_server[0], timeout_s=10, options=[("grpc.max_send_message_length", SEND_LIMIT)])
    stream = client.stream()
    try:
        a = stream.create_session(ENV, seed=4).session_id
        b = stream.create_session(ENV, seed=5).session_id
        stream.reset(a)
        stream.reset(b)
        big = {"agent_1": "x" * (2 * SEND_LIMIT)}
        with pytest.raises(ResourceExhaustedError, match=f"over the {SEND_LIMIT} bytes") as err:
            stream.step(a, big)
        assert a in str(err.value)
        with pytest.raises(ResourceExhaustedError, match="batch_step request"):
            stream.batch_step([(b, {"agent_1": "task_1: 1"}), (a, big)])
        with pytest.raises(ResourceExhaustedError, match="reset request"):
            stream.reset(a, options={"pad": big["agent_1"]})
        assert stream.step(a, {"agent_1": "task_1: 1"}).acting_agents == ["agent_2"]
        assert stream.step(b, {"agent_1": "task_1: 1"}).acting_agents == ["agent_2"]
        assert stream.generation == 1 and not stream.broken
    finally:
        stream.close()
        client.close()


def test_the_send_limit_is_kept_when_the_receive_limit_option_is_unreadable(env_server) -> None:
    """A receive limit given as a string (not an int, which gRPC ignores) left both limits unknown, so the stream
    sent an over-limit step and lost its session; the send limit is known on its own now and the step is refused
    before it is sent, the session going on."""
    options = [("grpc.max_send_message_length", SEND_LIMIT), ("grpc.max_receive_message_length", "4194304")]
    client = EnvClient(env_server[0], timeout_s=10, options=options)
    stream = client.stream()
    try:
        a = stream.create_session(ENV, seed=4).session_id
        stream.reset(a)
        with pytest.raises(ResourceExhaustedError, match=f"over the {SEND_LIMIT} bytes"):
            stream.step(a, {"agent_1": "x" * (2 * SEND_LIMIT)})
        assert stream.step(a, {"agent_1": "task_1: 1"}).acting_agents == ["agent_2"]
        assert not stream.broken
    finally:
        stream.close()
        client.close()


def test_a_made_env_keeps_its_episode_after_a_step_over_the_send_limit(env_server) -> None:
    """``marti.make``'s default transport (a stream) on a channel from ``open_channel``: a step too large for the
    channel raises ResourceExhaustedError, as on the unary transport, instead of losing the session
    (SessionLostError, "the env server restarted or the connection dropped"), and the episode goes on."""
    ch = open_channel(env_server[0], options=[("grpc.max_send_message_length", SEND_LIMIT)])
    envs = [me.make(ENV, seed=5, channel=ch, transport=t) for t in ("stream", "unary")]
    try:
        for env in envs:
            env.reset(seed=5)
            with pytest.raises(ResourceExhaustedError) as err:
                env.step({"agent_1": "x" * (2 * SEND_LIMIT)})
            assert not isinstance(err.value, SessionLostError)
            env.step({"agent_1": "task_1: 1"})
            assert env.acting_agents == ["agent_2"]
    finally:
        for env in envs:
            env.close()
        ch.close()


def test_retried_step_is_idempotent(client) -> None:
    s = client.create_session(ENV, seed=3)
    try:
        client.reset(s.session_id)
        a = client.step(s.session_id, {"agent_1": "task_1: 1"}, request_id="req-1")
        b = client.step(s.session_id, {"agent_1": "task_1: 1"}, request_id="req-1")
        assert a == b and a.acting_agents == ["agent_2"]
        c = client.step(s.session_id, {"agent_2": "task_1: 1"}, request_id="req-2")
        assert c.acting_agents == ["agent_3"]
    finally:
        client.close_session(s.session_id)


def test_session_cap_over_grpc(client, env_server) -> None:
    sessions = env_server[1]
    made = [client.create_session(ENV).session_id for _ in range(sessions.max_sessions - len(sessions))]
    try:
        with pytest.raises(ResourceExhaustedError, match="max_sessions=8"):
            client.create_session(ENV)
    finally:
        for sid in made:
            client.close_session(sid)
    client.close_session(client.create_session(ENV).session_id)


def test_idle_sessions_are_reaped_by_the_server(client, env_server) -> None:
    sessions = env_server[1]
    s = client.create_session(ENV)
    sessions.idle_timeout_s = 0.1  # the server's reaper runs every 0.05 s
    try:
        deadline = time.monotonic() + 5
        while s.session_id in sessions.session_ids() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert s.session_id not in sessions.session_ids()
    finally:
        sessions.idle_timeout_s = 600.0


def test_optimal_play_remote_metrics(env_server) -> None:
    env = me.make(ENV, address=env_server[0], seed=8, difficulty="medium")
    try:
        env.reset(seed=8)
        local = me.make(ENV, seed=8, difficulty="medium")
        local.reset(seed=8)
        value, opt = ap.solve(local.env.problem)
        plan = "\n".join(f"{k}: {v}" for k, v in opt.items())
        env.step({"agent_1": plan})
        _, rew, _, _, infos = env.step({"agent_2": plan})
        assert infos["agent_2"]["task_completion"] is True and infos["agent_2"]["optimal_value"] == float(
            value
        )
        assert rew["agent_2"] == pytest.approx(1.5)
    finally:
        env.close()


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"scenario": "a\udcff"}, "config['scenario']"),
        ({"max_turns": 2**70}, "config['max_turns']=1180591620717411303424 is outside the int64 range"),
        (
            {"roles": ["leader", {"x": object()}]},
            "config['roles'][1]['x']: cannot send a value of type object",
        ),
    ],
)
def test_a_config_the_wire_cannot_carry_is_named_before_any_rpc(env_server, config, named) -> None:
    """``make``'s config travels as a ``ValueMap``: text with a lone surrogate, an int outside int64 or an object
    raised a bare ``UnicodeEncodeError`` / ``ValueError: Value out of range`` from the proto; now
    ``InvalidArgumentError`` naming the key path, as ``reset``'s options already were."""
    for transport in ("stream", "unary"):
        with pytest.raises(InvalidArgumentError) as err:
            me.make(ENV, address=env_server[0], transport=transport, **config)
        assert named in str(err.value)
    with (
        EnvClient(env_server[0], timeout_s=10) as c,
        pytest.raises(InvalidArgumentError, match=re.escape(named)),
    ):
        c.create_session(ENV, config)
