"""Remote envs on one long-lived channel: declared metrics over gRPC, ``BatchStep`` for lockstep envs
(``marti.env.make.step_many``), and the episode runner giving the same episodes remotely as in-process."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import grpc
import pytest

import marti
import marti.env.make as me
from marti.clients.env import EnvClient, RemoteParallelEnv, open_channel
from marti.env.registry import default_registry
from marti.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from marti.rpc.testing import serve_in_thread
from marti.types.inference import Generation
from services.env_server.core.sessions import SessionManager
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings
from services.trainer.rollout.episodes.runner import EpisodeRunner

ENV = "collaborative_task_solving"
ALLOCATION_METRICS = ("task_completion", "resource_utilization", "constraint_violations", "team_score")
#: Declared too, but present in an episode's results only once the evaluator wrote a readable score.
DECLARED_METRICS = (*ALLOCATION_METRICS, "calibration_error")
BATCH_STEP = "/marti.api.env.v1.EnvService/BatchStep"


class _Calls(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Counts the rpcs made on a channel, by method."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    def intercept_unary_unary(self, continuation, details, request):  # noqa: D102
        self.methods.append(details.method)
        return continuation(details, request)

    def intercept_stream_stream(self, continuation, details, request_iterator):  # noqa: D102
        self.methods.append(details.method)
        return continuation(details, request_iterator)


@pytest.fixture
def channel(env_server):
    ch = open_channel(env_server[0])
    calls = _Calls()
    yield grpc.intercept_channel(ch, calls), calls
    ch.close()


def test_declared_metrics_travel_with_sessions_and_listings(env_server, channel):
    ch, _ = channel
    local = me.make(ENV, seed=1)
    remote = me.make(ENV, seed=1, channel=ch)
    debate = me.make(ENV, seed=1, scenario="debate", channel=ch)
    try:
        assert me.declared_metrics(local) == me.declared_metrics(remote) == DECLARED_METRICS
        assert me.declared_metrics(debate) == ()  # the debate env declares none
        assert remote.session.metrics == DECLARED_METRICS
    finally:
        remote.close()
        debate.close()
    with EnvClient(env_server[0]) as client:
        listed = {e["env_id"]: e for e in client.list_envs()}
    local_listing = {e["env_id"]: e for e in marti.list_envs()}
    assert listed[f"{ENV}-v1"]["metrics"] == local_listing[f"{ENV}-v1"]["metrics"] == list(DECLARED_METRICS)


def test_envs_share_the_channel_and_lockstep_steps_are_one_batch_per_turn(env_server, channel):
    ch, calls = channel
    seeds = [3, 3, 8]
    remote = [me.make(ENV, seed=s, channel=ch) for s in seeds]
    local = [me.make(ENV, seed=s) for s in seeds]
    try:
        for envs in (remote, local):
            for e, s in zip(envs, seeds, strict=True):
                e.reset(seed=s)
        turns = 0
        while any(e.agents for e in local):
            live = [i for i, e in enumerate(local) if e.agents]
            acts = [{local[i].acting_agents[0]: f"task_1: {turns % 3 + 1}"} for i in live]
            got = me.step_many([remote[i] for i in live], acts)
            want = [local[i].step(a) for i, a in zip(live, acts, strict=True)]
            assert got == want
            for i in live:  # each remote env is left as after its own step
                assert (remote[i].agents, remote[i].acting_agents) == (
                    local[i].agents,
                    local[i].acting_agents,
                )
            turns += 1
        assert [e.agents for e in remote] == [[] for _ in remote]
        assert calls.methods.count(BATCH_STEP) == turns  # one round trip per turn for all three sessions
        assert calls.methods.count("/marti.api.env.v1.EnvService/Session") == 3  # one stream per env
        assert "/marti.api.env.v1.EnvService/Step" not in calls.methods
    finally:
        for e in remote:
            e.close()
    # the envs closed their sessions, not the shared channel
    again = me.make(ENV, seed=1, channel=ch)
    again.reset()
    again.close()


def test_step_batch_reports_errors_per_env_and_step_many_raises_the_first(env_server, channel):
    ch, _ = channel
    envs = [me.make(ENV, seed=s, channel=ch, transport="unary") for s in (1, 2)]
    try:
        for e in envs:
            e.reset()
        EnvClient(env_server[0], channel=ch).close_session(envs[0].session_id)  # gone server-side
        acts = [{e.acting_agents[0]: "task_1: 1"} for e in envs]
        out = RemoteParallelEnv.step_batch(envs, acts)
        assert isinstance(out[0], NotFoundError) and "session" in str(out[0])
        assert isinstance(out[1], tuple) and envs[1].acting_agents != ["agent_1"]
        with pytest.raises(NotFoundError, match="session"):
            me.step_many(envs, acts)
        with pytest.raises(ValueError, match="max_batch"):
            RemoteParallelEnv.step_batch(envs, acts, max_batch=0)
    finally:
        for e in envs:
            e.close()


def test_step_many_says_which_envs_moved_when_one_fails(env_server, channel):
    """Issue 29 item 12: a failed step no longer throws away the steps of the envs that moved."""
    ch, _ = channel
    envs = [me.make(ENV, seed=1), *(me.make(ENV, seed=s, channel=ch) for s in (2, 3)), me.make(ENV, seed=4)]
    try:
        for e in envs:
            e.reset()
        EnvClient(env_server[0], channel=ch).close_session(envs[1].session_id)  # gone server-side
        acts = [{e.acting_agents[0]: "task_1: 1"} for e in envs]
        acts[3] = {"agent_9": "x"}  # a bad action for the last, local env
        with pytest.raises(NotFoundError, match="session") as info:
            me.step_many(envs, acts)
        err = info.value
        assert err.failed_index == 1
        out = err.step_results
        assert isinstance(out[0], tuple) and isinstance(out[2], tuple)  # these two moved
        assert envs[0].acting_agents == envs[2].acting_agents == ["agent_2"]
        assert out[1] is err and isinstance(out[3], InvalidArgumentError) and "agent_9" in str(out[3])
        assert "envs [0, 2] stepped, envs [1, 3] failed" in "".join(err.__notes__)
        again = me.step_many([envs[0], envs[2]], [{"agent_2": "task_1: 1"}] * 2, errors="return")
        assert all(isinstance(r, tuple) for r in again)
        with pytest.raises(InvalidArgumentError, match="errors"):
            me.step_many(envs, acts, errors="ignore")
    finally:
        for e in envs:
            e.close()


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_a_closed_env_in_a_batch_fails_as_its_own_step_does(env_server, channel, transport):
    """A closed env batched with others on its channel got the server's unknown-session answer, a SessionLostError
    saying "call reset()" (which a closed env refuses), where its own ``step`` raises the closed-env
    FailedPreconditionError; now its slot holds that error, nothing is sent for it, and the others step."""
    ch, calls = channel
    envs = [me.make(ENV, seed=s, channel=ch, transport=transport) for s in (1, 2, 3)]
    try:
        for e in envs:
            e.reset()
        envs[1].close()
        with pytest.raises(FailedPreconditionError, match="closed") as own:
            envs[1].step({"agent_1": "task_1: 1"})
        acts = [{"agent_1": "task_1: 1"}] * 3
        sent = calls.methods.count(BATCH_STEP)
        out = me.step_many(envs, acts, errors="return")
        assert type(out[1]) is FailedPreconditionError and str(out[1]) == str(own.value)
        assert isinstance(out[0], tuple) and isinstance(out[2], tuple)
        assert envs[0].acting_agents == envs[2].acting_agents == ["agent_2"]
        assert calls.methods.count(BATCH_STEP) == sent + 1
        out = RemoteParallelEnv.step_batch([envs[1], envs[1]], acts[:2])  # nothing to send: no call
        assert all(type(r) is FailedPreconditionError for r in out)
        assert calls.methods.count(BATCH_STEP) == sent + 1
        with pytest.raises(FailedPreconditionError, match="closed"):
            me.step_many(envs, [{"agent_2": "task_1: 1"}] * 3)
    finally:
        for e in envs:
            e.close()


def test_step_batch_refuses_envs_of_two_channels_and_loses_no_session(env_server, channel):
    """step_batch sent every env's step through the first env's channel: an env of another server came back as
    "the env server does not know it" and was marked lost (its live session left to the idle reaper). Envs of
    two channels are refused now, naming the env, before anything is sent; step_many batches per channel."""
    ch, _ = channel
    settings = EnvServerSettings(port=0, max_sessions=8)
    other = SessionManager(default_registry(), max_sessions=8, idle_timeout_s=600.0)
    with serve_in_thread(lambda: [env_service(settings, sessions=other)], settings) as server:
        envs = [me.make(ENV, seed=1, channel=ch), me.make(ENV, seed=1, address=server.address)]
        try:
            for e in envs:
                e.reset()
            acts = [{"agent_1": "task_1: 1"}] * 2
            with pytest.raises(
                InvalidArgumentError, match=r"envs\[1\] \(127\.0\.0\.1:\d+\) is not on the channel"
            ):
                RemoteParallelEnv.step_batch(envs, acts)
            assert not envs[1].session_lost and envs[1].acting_agents == ["agent_1"]  # nothing was sent
            assert all(isinstance(r, tuple) for r in me.step_many(envs, acts))
            assert [e.acting_agents for e in envs] == [["agent_2"], ["agent_2"]]
        finally:
            for e in envs:
                e.close()


def test_step_batch_splits_large_batches(env_server, channel):
    ch, calls = channel
    envs = [me.make(ENV, seed=s, channel=ch) for s in range(5)]
    try:
        for e in envs:
            e.reset()
        out = RemoteParallelEnv.step_batch(
            envs, [{e.acting_agents[0]: "task_1: 1"} for e in envs], max_batch=2
        )
        assert all(isinstance(r, tuple) for r in out)
        assert calls.methods.count(BATCH_STEP) == 3
    finally:
        for e in envs:
            e.close()


def test_a_remote_env_needs_an_address_or_a_channel():
    with pytest.raises(InvalidArgumentError, match="address or a channel"):
        RemoteParallelEnv.create(None, ENV)


def _record_runner(make_env, seen):
    prompts: list = []

    def generate(agent, chats):
        prompts.append([agent, chats])
        return [
            Generation([len(c[1]["content"])], [7], [-0.5], f"task_1: {len(c[1]['content']) % 3 + 1}", "stop")
            for c in chats
        ]

    runner = EpisodeRunner(
        make_env=make_env,
        generate=generate,
        comm_factory=None,
        agents=["agent_1", "agent_2", "agent_3"],
        roles={"agent_1": "leader", "agent_2": "executor", "agent_3": "evaluator"},
        system_prompts={"agent_1": "p", "agent_2": "e", "agent_3": "v"},
        policy_version=lambda a: 0,
        on_episode_end=seen.append,
    )
    return runner, prompts


def test_runner_plays_the_same_episodes_on_remote_batched_envs_as_in_process(env_server, channel):
    ch, calls = channel
    config = {"max_turns": 3, "history_messages": 0}
    records, seen = [], []
    for make_env in (
        lambda seed: me.make(ENV, seed=seed, **config),
        lambda seed: me.make(ENV, seed=seed, channel=ch, **config),
    ):
        runner, prompts = _record_runner(make_env, seen)
        results = runner.play([5, 5, 6])
        records.append(
            json.dumps(
                [
                    prompts,
                    [
                        [r.seed, r.returns, r.metrics, r.transcript]
                        + [[a, [dataclasses.asdict(u) for u in t.turns]] for a, t in r.trajectories.items()]
                        for r in results
                    ],
                ]
            )
        )
        # the env's declared metrics, local or remote
        assert set(ALLOCATION_METRICS) <= set(results[0].metrics)
    assert records[0] == records[1]
    assert calls.methods.count(BATCH_STEP) == 3  # one per turn for the three remote episodes
    assert len(seen) == 6


# ---------------------------------------------------------------------------------------------- the loop
class _FakeRuntime:
    """What ``TrainingLoop._runner`` needs from the Ray runtime: ``versions`` and an instant ``generate``."""

    def versions(self):
        return {"agent_1": 0, "agent_2": 0}

    def generate(self, agent, chats, greedy=False):
        return [Generation([1], [2], [-0.1], "task_1: 1", "stop") for _ in chats]


def test_the_loop_opens_one_channel_per_service_and_closes_them(env_server, monkeypatch):
    from marti.config import load_config
    from marti.rpc.testing import serve_in_thread
    from services.comm_broker.servicer import broker_service
    from services.comm_broker.settings import BrokerSettings
    from services.trainer.job.connections.addresses import Addresses
    from services.trainer.job.run.loop import TrainingLoop
    from services.trainer.observe.episode_metrics import episode_metrics

    cfg = load_config(
        Path(__file__).resolve().parents[3] / "examples" / "tiny.yaml", ["environment.max_turns=2"]
    )
    opened = []
    real = grpc.insecure_channel
    monkeypatch.setattr(grpc, "insecure_channel", lambda *a, **k: opened.append(a[0]) or real(*a, **k))
    settings = BrokerSettings(port=0, tick_interval_s=0.05)
    with serve_in_thread(lambda: [broker_service(settings)], settings) as broker:
        loop = TrainingLoop(cfg, Addresses(broker.address, env_server[0], "unused:1"))
        try:
            for step in range(2):
                results = loop._play(loop._runner(_FakeRuntime(), greedy=False), cfg.rollout.train_seeds(step),
                                     None, "rollout")  # fmt: skip
                assert len(results) == 4 and all(r.metrics["messages"] > 0 for r in results)
            assert sorted(opened) == sorted([broker.address, env_server[0]])  # 8 episodes, 2 channels
            m = episode_metrics(results)
            assert {
                f"team/{k}" for k in (*ALLOCATION_METRICS, "format_valid", "num_turns", "messages")
            } <= set(m)
            channels = dict(loop.connections._channels)
        finally:
            loop.close_channels()
        with pytest.raises(ValueError):  # closed: grpc refuses new calls on it
            EnvClient(env_server[0], channel=channels["env"]).list_envs()
        loop.close_channels()  # idempotent
        loop._play(loop._runner(_FakeRuntime(), greedy=False), [1], None, "after close")  # reopens
        loop.close_channels()
    assert len(env_server[1]) == 0  # every session was closed


async def test_async_client_on_a_shared_channel_leaves_it_open(env_server):
    from marti.clients.env import IDEMPOTENT_METHODS, AsyncEnvClient
    from marti.rpc.client.channel import make_channel

    channel = make_channel(env_server[0], aio=True, idempotent_methods=IDEMPOTENT_METHODS)
    try:
        for _ in range(2):  # the first client's close leaves the channel usable
            client = AsyncEnvClient("label", channel=channel)
            info = await client.create_session(ENV, seed=1)
            assert info.metrics == DECLARED_METRICS
            assert await client.close_session(info.session_id)
            await client.close()
    finally:
        await channel.close()
