"""``marti.env.make.step_many`` over an env server whose ``max_batch_steps`` (here 2) is below the number of envs it
steps on one channel: the server refuses the ``BatchStep`` for its count alone (``BatchTooLargeError`` naming
``max_batch_steps``, nothing stepped), the SDK learns the limit from the refusal, steps the envs in parts under it
and keeps later calls under it. Before, every env's slot held the refusal and step_many raised it: a job on such a
server could step nothing. A raw ``EnvClient.batch_step`` over the limit is still refused, naming it."""

from __future__ import annotations

import grpc
import pytest

import marti.env.make as me
from marti.clients.env import EnvClient, open_channel
from marti.errors import BatchTooLargeError
from marti.rpc.testing import serve_in_thread
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings

ENV, LIMIT, N = "collaborative_task_solving", 2, 5
BATCH_STEP = "/marti.api.env.v1.EnvService/BatchStep"


class _Calls(grpc.UnaryUnaryClientInterceptor):
    """Counts the unary rpcs made on a channel, by method."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    def intercept_unary_unary(self, continuation, details, request):  # noqa: D102
        self.methods.append(details.method)
        return continuation(details, request)


@pytest.fixture(scope="module")
def address():
    settings = EnvServerSettings(port=0, max_batch_steps=LIMIT)
    with serve_in_thread(lambda: [env_service(settings)], settings) as server:
        yield server.address


def test_step_many_steps_every_env_in_parts_under_the_servers_limit(address, caplog) -> None:
    raw = open_channel(address)
    calls = _Calls()
    ch = grpc.intercept_channel(raw, calls)
    remote = [me.make(ENV, seed=i, channel=ch, transport="unary") for i in range(N)]
    local = [me.make(ENV, seed=i) for i in range(N)]
    try:
        for env in remote + local:
            env.reset(seed=7)
        for turn in range(2):
            acts = [{a: f"task_{1 + (i + turn) % 3}: 1" for a in env.agents} for i, env in enumerate(local)]
            calls.methods.clear()
            got = me.step_many(remote, acts)
            want = [env.step(a) for env, a in zip(local, acts, strict=True)]
            assert [g[1:4] for g in got] == [w[1:4] for w in want]  # rewards, terminations, truncations
            assert [g[0] for g in got] == [w[0] for w in want]  # observations
            # the first call is refused once, then sent in parts of 2; the second goes in parts at once
            assert calls.methods.count(BATCH_STEP) == (4 if turn == 0 else 3)
        assert "at most 2 steps a BatchStep (max_batch_steps)" in caplog.text
    finally:
        for env in remote + local:
            env.close()
        raw.close()


def test_a_raw_batch_step_over_the_limit_is_refused_naming_it(address) -> None:
    with EnvClient(address) as client:
        sids = [client.create_session(ENV, seed=i).session_id for i in range(LIMIT + 1)]
        for sid in sids:
            client.reset(sid)
        with pytest.raises(BatchTooLargeError, match="max_batch_steps=2") as info:
            client.batch_step([(sid, {}) for sid in sids])
        assert info.value.max_batch_steps == LIMIT
        assert len(client.batch_step([(sid, {}) for sid in sids[:LIMIT]])) == LIMIT
