"""The gateway's gRPC adapter (``marti.api.inference.v1.InferenceService``) over a real port, with a token.

Two tiny random models (agents ``planner`` and ``executor``, different init seeds) behind one gateway, served by
``start_server`` through ``service_spec`` (which starts and closes the gateway), driven by the SDK clients
(:mod:`marti.clients.inference`) and by raw stubs where the server's own validation is under test.
"""

from __future__ import annotations

import asyncio
import re

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import marti
import marti.aio
from marti.api.inference.v1 import inference_pb2 as pb
from marti.api.inference.v1 import inference_service_pb2_grpc as sgrpc
from marti.clients.inference import InferenceClient
from marti.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnauthenticatedError,
)
from marti.rpc.settings import ServerSettings
from marti.rpc.testing import serve_in_thread
from marti.types.inference import (
    Completion,
    CompletionDelta,
    Generation,
    InferenceResult,
    ModelInfo,
    RewardReceipt,
)
from services.gateway.convert import token_texts
from services.gateway.core.backend import InferenceBackend
from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.gateway.servicer import SERVICE_NAME, service_spec
from services.trainer.rollout.engines.base import chat_to_ids
from tests.integration.gateway.one_agent import OneAgent
from tests.integration.gateway.tiny_gateway import MAX_MODEL_LEN, tiny_gateway

TOKEN = "grpc-gateway-token"
MSG = [{"role": "user", "content": "hello there"}]
META = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture(scope="module")
def served():
    """``(address, sink, tokenizer)``: a running gateway with two agents; ``sink`` collects released episodes."""
    sink: list = []
    gateway, tok = tiny_gateway(sink)
    with serve_in_thread(lambda: [service_spec(gateway)], ServerSettings(port=0, token=TOKEN)) as server:
        yield server.address, sink, tok


@pytest.fixture(scope="module")
def client(served):
    with InferenceClient(served[0], token=TOKEN) as c:
        yield c


def test_models_lists_each_agent_and_its_resident_version(client):
    models = client.models()
    assert [m.id for m in models] == ["planner", "planner@0", "executor", "executor@0"]
    assert models[1] == ModelInfo("planner@0", "planner", 0, True, MAX_MODEL_LEN)
    assert all(isinstance(m, ModelInfo) for m in models)


def test_generate_by_messages_text_and_token_ids(client, served):
    tok = served[2]
    by_msg = client.generate("planner", MSG, max_tokens=5, seed=1)
    assert isinstance(by_msg, InferenceResult) and by_msg.agent == "planner"
    (c,) = by_msg.choices
    assert isinstance(c, Completion) and c.call_id.startswith("call-") and c.policy_version == 0
    assert 1 <= len(c.token_ids) <= 5 and len(c.logprobs) == len(c.token_ids)
    assert all(lp <= 0.0 for lp in c.logprobs) and c.finish_reason in ("stop", "length")
    assert by_msg.prompt_token_ids == chat_to_ids(tok, MSG)

    by_text = client.generate("executor", text="once upon a time", max_tokens=4, temperature=0.0)
    assert by_text.agent == "executor"
    assert by_text.prompt_token_ids == tok("once upon a time", add_special_tokens=False)["input_ids"]

    # the prompt ids of the chat call, sent as ids, are the same prompt: same seed, same completion
    by_ids = client.generate("planner", token_ids=by_msg.prompt_token_ids, max_tokens=5, seed=1)
    assert by_ids.prompt_token_ids == by_msg.prompt_token_ids
    assert by_ids.choices[0].token_ids == c.token_ids and by_ids.choices[0].text == c.text

    # unset max_tokens: 64, cut to the room the 128-token context leaves after a long prompt
    long_prompt = [5] * (MAX_MODEL_LEN - 3)
    out = client.generate("planner", token_ids=long_prompt, temperature=1.0, seed=3)
    assert len(out.choices[0].token_ids) <= 3


def test_content_parts_are_the_prompt_their_joined_text_is(client, served):
    """A message's content as OpenAI's text parts is sent as their text joined with newlines (as the HTTP route
    joins it), never as the list's repr; an OpenAI-style message whose tool fields are None is sent too."""
    tok = served[2]
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}]
    out = client.generate("planner", parts, max_tokens=2, seed=1)
    joined = client.generate("planner", [{"role": "user", "content": "hi\nthere"}], max_tokens=2, seed=1)
    assert out.prompt_token_ids == joined.prompt_token_ids
    assert "there" in tok.decode(out.prompt_token_ids) and "'type'" not in tok.decode(out.prompt_token_ids)
    openai_style = [{**m, "tool_calls": None, "name": None} for m in MSG]
    assert client.generate("planner", openai_style, max_tokens=2).prompt_token_ids == chat_to_ids(tok, MSG)


def test_n_completions_and_seeds_are_reproducible(client):
    a = client.generate("planner", MSG, n=3, max_tokens=6, seed=11)
    b = client.generate("planner", MSG, n=3, max_tokens=6, seed=11)
    assert [c.index for c in a.choices] == [0, 1, 2]
    assert len({c.call_id for c in a.choices + b.choices}) == 6
    assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices]
    assert [c.logprobs for c in a.choices] == [c.logprobs for c in b.choices]
    other = client.generate("executor", MSG, n=3, max_tokens=6, seed=11)
    assert [c.token_ids for c in other.choices] != [c.token_ids for c in a.choices]  # a different policy


def test_stream_deltas_reassemble_to_the_unary_result(client):
    kw = {"n": 2, "max_tokens": 8, "seed": 5}
    unary = client.generate("executor", MSG, **kw)
    with client.generate_stream("executor", MSG, **kw) as stream:
        assert stream.agent == "executor" and stream.n == 2
        assert stream.prompt_token_ids == unary.prompt_token_ids
        deltas = list(stream)
    assert all(isinstance(d, CompletionDelta) for d in deltas)
    for c in unary.choices:
        mine = [d for d in deltas if d.index == c.index]
        tokens, (end,) = mine[:-1], mine[-1:]
        assert [d.token_id for d in tokens] == c.token_ids
        assert [d.logprob for d in tokens] == c.logprobs
        assert "".join(d.text for d in tokens) == c.text
        assert end.done and end.finish_reason == c.finish_reason and end.token_id is None
        assert end.policy_version == c.policy_version and end.call_id.startswith("call-")
    # completions come one after the other, each closed by its final event
    assert [d.index for d in deltas] == sorted(d.index for d in deltas)
    collected = client.generate_stream("executor", MSG, **kw).collect()
    assert [c.token_ids for c in collected.choices] == [c.token_ids for c in unary.choices]
    assert [c.text for c in collected.choices] == [c.text for c in unary.choices]


def test_token_texts_join_to_the_text_and_follow_the_tokens(served):
    tok = served[2]
    ids = tok("héllo wörld, naïve café", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    text = tok.decode(ids, skip_special_tokens=True)

    def decode(x):
        return tok.decode(x, skip_special_tokens=True)

    pieces = token_texts(ids, text, decode)
    assert "".join(pieces) == text and len(pieces) == len(ids) and pieces[-1] == ""
    assert sum(1 for p in pieces if p) >= 5  # spread over the tokens, not all on one
    cut = text[:7]  # a stop string cut the text: pieces still join to it exactly
    assert "".join(token_texts(ids, cut, decode)) == cut
    assert token_texts(ids, text, None) == [""] * (len(ids) - 1) + [text]


def test_report_reward_releases_the_exact_calls_to_the_sink(client, served):
    sink = served[1]
    before = len(sink)
    first = client.generate("planner", MSG, max_tokens=4, episode_id="ep-exact", group_id="g-exact")
    second = client.generate("executor", text="the plan is", max_tokens=4, n=2, episode_id="ep-exact")
    stats = client.stats()
    assert stats["open_episodes"] >= 1 and stats["calls"] >= 3
    receipt = client.report_reward(
        "ep-exact", {"planner": 1.5}, call_rewards={second.choices[1].call_id: 0.25}
    )
    assert receipt == RewardReceipt(released=1, dropped=0)
    (episode,) = sink[before:]
    planner, executor = episode["planner"], episode["executor"]
    assert planner.group_id == "g-exact" and planner.episode_return == 1.5
    (turn,) = planner.turns
    c = first.choices[0]
    assert turn.prompt_token_ids == first.prompt_token_ids
    assert turn.response_token_ids == c.token_ids and turn.response_logprobs == c.logprobs
    assert turn.response_text == c.text and turn.policy_version == c.policy_version
    assert [t.response_token_ids for t in executor.turns] == [c.token_ids for c in second.choices]
    assert [t.response_logprobs for t in executor.turns] == [c.logprobs for c in second.choices]
    assert [t.reward for t in executor.turns] == [None, 0.25]

    with pytest.raises(FailedPreconditionError, match="already reported"):
        client.report_reward("ep-exact", {"planner": 0.0})
    with pytest.raises(FailedPreconditionError, match="already reported"):
        client.generate("planner", MSG, max_tokens=2, episode_id="ep-exact")


def test_groups_wait_for_every_member_and_failures_drop_them(client, served):
    sink = served[1]
    before = len(sink)
    for ep in ("grp-a", "grp-b"):
        client.generate("planner", MSG, max_tokens=2, episode_id=ep, group_id="grp")
    assert client.report_reward("grp-a", {"planner": 1.0}, group_size=2) == RewardReceipt(0, 0)
    assert len(sink) == before
    assert client.report_reward("grp-b", {"planner": 0.0}, group_size=2) == RewardReceipt(2, 0)
    assert [ep["planner"].episode_id for ep in sink[before:]] == ["grp-a", "grp-b"]
    client.generate("planner", MSG, max_tokens=2, episode_id="bad-1", group_id="bad")
    client.generate(
        "planner", MSG, max_tokens=2, episode_id="bad-2", group_id="bad"
    )  # open when the group dies
    assert client.report_reward("bad-1", {}, failed=True) == RewardReceipt(0, 1)
    assert marti.report_reward(served[0], "bad-2", {"planner": 1.0}, token=TOKEN, group_id="bad").dropped == 1


def test_errors_map_to_domain_exceptions(client, served):
    with pytest.raises(NotFoundError, match="does not exist"):
        client.generate("nobody", MSG)
    with pytest.raises(NotFoundError, match="not resident"):
        client.generate("planner@7", MSG)
    with pytest.raises(InvalidArgumentError, match="exceeds model 'planner'"):
        client.generate("planner", token_ids=[5] * 100, max_tokens=64)
    with pytest.raises(InvalidArgumentError, match="fills the model's context"):
        client.generate("planner", token_ids=[5] * MAX_MODEL_LEN)
    with pytest.raises(InvalidArgumentError, match="temperature"):
        client.generate("planner", MSG, temperature=-1.0)
    with pytest.raises(InvalidArgumentError, match="n must be an int in"):
        client.generate("planner", MSG, n=9)
    with pytest.raises(InvalidArgumentError, match=r"n is 4, more than gateway.max_queue \(3\)"):
        client.generate("planner", MSG, n=4, max_tokens=2)  # it can never fit: not RESOURCE_EXHAUSTED
    with pytest.raises(InvalidArgumentError, match="not a trained agent"):
        client.report_reward("ep-unknown-agent", {"someone": 1.0})
    with pytest.raises(NotFoundError):
        next(iter(client.generate_stream("nobody", MSG)))
    with pytest.raises(InvalidArgumentError, match="exactly one prompt"):
        client.generate("planner", MSG, text="and text")
    with InferenceClient(served[0], token="wrong") as bad:
        with pytest.raises(UnauthenticatedError, match="invalid bearer token"):
            bad.models()
    with InferenceClient(served[0], token="") as none:
        with pytest.raises(UnauthenticatedError, match="missing"):
            none.generate("planner", MSG)


@pytest.mark.parametrize(
    ("request_kw", "field"),
    [
        ({"text": "hi"}, "model is required"),
        ({"model": "planner"}, "prompt is required"),
        ({"model": "planner", "text": "hi", "n": 0}, "n must be >= 1"),
        ({"model": "planner", "text": "hi", "max_tokens": 0}, "max_tokens must be > 0"),
        ({"model": "planner", "messages": pb.ChatMessages()}, "messages.messages must hold"),
        (
            {"model": "planner", "messages": pb.ChatMessages(messages=[pb.ChatMessage(content="x")])},
            r"messages.messages\[0\].role",
        ),
        (
            {
                "model": "planner",
                "messages": pb.ChatMessages(messages=[pb.ChatMessage(role="robot", content="x")]),
            },
            r"messages.messages\[0\].role is 'robot'; a chat message's role must be one of",
        ),
        ({"model": "planner", "token_ids": pb.TokenIds(ids=[1, -2])}, r"token_ids.ids\[1\]"),
        ({"model": "planner", "text": "hi", "stop": [""]}, r"stop\[0\]"),
        ({"model": "planner", "text": "hi", "top_p": 0.0}, "top_p"),
    ],
)
def test_server_validation_names_the_field(served, request_kw, field):
    with grpc.insecure_channel(served[0]) as ch:
        stub = sgrpc.InferenceServiceStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(pb.GenerateRequest(**request_kw), metadata=META, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert re.search(field, err.value.details()), err.value.details()
        stream_req = pb.GenerateStreamRequest(request=pb.GenerateRequest(**request_kw))
        with pytest.raises(grpc.RpcError) as err:
            next(stub.GenerateStream(stream_req, metadata=META, timeout=30))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert re.search(field, err.value.details()), err.value.details()


def test_stream_without_its_request_is_invalid(served):
    with grpc.insecure_channel(served[0]) as ch:
        stub = sgrpc.InferenceServiceStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            next(stub.GenerateStream(pb.GenerateStreamRequest(), metadata=META, timeout=30))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "request is required" in err.value.details()


def test_token_from_the_environment(served, monkeypatch):
    monkeypatch.setenv("MARTI_GATEWAY_TOKEN", TOKEN)
    with InferenceClient(served[0]) as c:
        assert c.models()
    monkeypatch.delenv("MARTI_GATEWAY_TOKEN")
    monkeypatch.setenv("MARTI_TOKEN", TOKEN)
    with marti.InferenceClient(served[0]) as c:
        assert c.models()


def test_health_and_reflection_list_the_service(served):
    with grpc.insecure_channel(served[0]) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        resp = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        (listed,) = refl.ServerReflectionInfo(iter([req]), metadata=META, timeout=10)
        assert SERVICE_NAME in {s.name for s in listed.list_services_response.service}
        req = reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE_NAME)
        (described,) = refl.ServerReflectionInfo(iter([req]), metadata=META, timeout=10)
        assert described.file_descriptor_response.file_descriptor_proto


def test_async_client(served):
    async def main():
        async with marti.aio.InferenceClient(served[0], token=TOKEN) as c:
            models = await c.models()
            one = await c.generate("planner", MSG, max_tokens=4, seed=9, episode_id="aio-1")
            stream = await c.generate_stream("planner", MSG, max_tokens=4, seed=9)
            both = await asyncio.gather(  # concurrent calls of two agents
                c.generate("planner", text="a", max_tokens=2), c.generate("executor", text="b", max_tokens=2)
            )
            deltas = [d async for d in stream]
            receipt = await c.report_reward("aio-1", {"planner": 2.0})
            with pytest.raises(FailedPreconditionError):
                await c.report_reward("aio-1", {"planner": 2.0})
            with pytest.raises(NotFoundError):
                await c.generate_stream("nobody", MSG)
            stats = await c.stats()
            await c.generate(
                "planner", text="c", max_tokens=2, episode_id="aio-2"
            )  # reported by the function
        late = await marti.aio.report_reward(served[0], "aio-2", {}, token=TOKEN, failed=True)
        return models, one, both, deltas, receipt, stats, late

    models, one, both, deltas, receipt, stats, late = asyncio.run(main())
    assert [m.id for m in models][:2] == ["planner", "planner@0"]
    assert [r.agent for r in both] == ["planner", "executor"]
    assert [d.token_id for d in deltas if not d.done] == one.choices[0].token_ids
    assert "".join(d.text for d in deltas) == one.choices[0].text
    assert receipt == RewardReceipt(1, 0) and late == RewardReceipt(0, 1)
    assert stats["released"] >= 1


def test_ids_go_to_the_gateway_unchanged_and_follow_its_rules(served):
    with grpc.insecure_channel(served[0]) as ch:
        stub = sgrpc.InferenceServiceStub(ch)
        req = pb.GenerateRequest(model="planner", text="hi", max_tokens=2, episode_id="a/b")
        with pytest.raises(grpc.RpcError) as err:
            stub.Generate(req, metadata=META, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'/'" in err.value.details()
        long_id = "e" * (GatewayLimits().max_id_chars + 1)
        with pytest.raises(grpc.RpcError) as err:
            stub.ReportReward(pb.ReportRewardRequest(episode_id=long_id), metadata=META, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "gateway.max_id_chars" in err.value.details()


def test_ids_that_are_not_utf8_are_invalid_argument(served):
    """Protobuf refuses a string field that is not UTF-8; the shared interceptor answers INVALID_ARGUMENT (HTTP
    refuses such path ids with 400)."""
    gen = pb.GenerateRequest(model="planner", text="hi", max_tokens=2, episode_id="EE", group_id="GG")
    cases = [
        ("Generate", gen.SerializeToString().replace(b"EE", b"\xff\xfe")),
        ("Generate", gen.SerializeToString().replace(b"GG", b"\xc3(")),
        (
            "GenerateStream",
            pb.GenerateStreamRequest(request=gen).SerializeToString().replace(b"EE", b"\xff\xfe"),
        ),
        (
            "ReportReward",
            pb.ReportRewardRequest(episode_id="EE").SerializeToString().replace(b"EE", b"\xff\xfe"),
        ),
    ]
    with grpc.insecure_channel(served[0]) as ch:
        for method, wire in cases:
            path = f"/{SERVICE_NAME}/{method}"
            if method == "GenerateStream":
                call = ch.unary_stream(path, request_serializer=bytes, response_deserializer=bytes)
                with pytest.raises(grpc.RpcError) as err:
                    next(call(wire, metadata=META, timeout=30))
            else:
                call = ch.unary_unary(path, request_serializer=bytes, response_deserializer=bytes)
                with pytest.raises(grpc.RpcError) as err:
                    call(wire, metadata=META, timeout=30)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err.value.details())
            assert "is not a valid" in err.value.details() and "UTF-8" in err.value.details()
        ok = ch.unary_unary(
            f"/{SERVICE_NAME}/Generate", request_serializer=bytes, response_deserializer=bytes
        )
        assert pb.GenerateResponse.FromString(ok(gen.SerializeToString(), metadata=META, timeout=30)).choices


def test_a_request_over_max_request_bytes_is_refused_by_the_servicer(served):
    """The fixture's server receives up to 64 MiB; the servicer holds the gateway's 8 MiB."""
    limit = GatewayLimits().max_request_bytes
    req = pb.GenerateRequest(model="planner", text="x" * limit, max_tokens=2)
    assert req.ByteSize() > limit
    with grpc.insecure_channel(served[0]) as ch:
        stub = sgrpc.InferenceServiceStub(ch)
        for call in (
            stub.Generate,
            lambda r, **kw: next(stub.GenerateStream(pb.GenerateStreamRequest(request=r), **kw)),
        ):
            with pytest.raises(grpc.RpcError) as err:
                call(req, metadata=META, timeout=30)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "gateway.max_request_bytes" in err.value.details()


class _EchoBackend(OneAgent, InferenceBackend):
    """Agent ``a``: one character is one token; answers ``ok``."""

    def chat_prompt(self, agent, messages) -> list[int]:
        return [1, 2, 3]

    def encode(self, agent: str, text: str) -> list[int]:
        return [ord(c) for c in text]

    def token_texts(self, agent, ids) -> list[str]:
        return [chr(i) for i in ids]

    def decode(self, agent, ids) -> str:
        return "".join(chr(i) for i in ids)

    def vocab_size(self, agent: str) -> int:
        return 0x110000

    def generate(self, agent, prompts, sampling, version) -> list[Generation]:
        return [Generation(list(p), [111, 107], [-0.5, -0.25], "ok", "stop", 0, agent) for p in prompts]


def _sized(size: int) -> pb.GenerateRequest:
    """A valid GenerateRequest of exactly ``size`` bytes."""
    req = pb.GenerateRequest(model="a", text="", max_tokens=2)
    req.text = "x" * (size - req.ByteSize())
    req.text = "x" * (len(req.text) - (req.ByteSize() - size))  # the text's length prefix grew
    assert req.ByteSize() == size
    return req


def test_the_gateway_server_receives_messages_up_to_max_request_bytes():
    """At the edge; the response to a request of the limit is larger than it (its prompt ids) and still arrives."""
    limit = 4096
    server = GatewayServer(Gateway(_EchoBackend(), GatewayLimits(max_wait_ms=1, max_request_bytes=limit)))
    _, address = server.start()
    try:
        with grpc.insecure_channel(address) as ch:
            stub = sgrpc.InferenceServiceStub(ch)
            meta = [("authorization", f"Bearer {server.token}")] if server.token else []
            out = stub.Generate(_sized(limit), metadata=meta, timeout=30)
            assert out.choices[0].text == "ok" and out.ByteSize() > limit
            with pytest.raises(grpc.RpcError) as err:
                stub.Generate(_sized(limit + 1), metadata=meta, timeout=30)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (
                f"{limit + 1} bytes" in err.value.details()
                and "gateway.max_request_bytes" in err.value.details()
            )
            # the transport's limit (64 MiB) refuses what is larger still, with the same status
            with pytest.raises(grpc.RpcError) as err:
                stub.Generate(_sized(64 * 1024 * 1024 + 1), metadata=meta, timeout=60)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        server.stop()


def test_sdk_idempotency_key_answers_a_retry_with_the_first_call(client, served):
    """``generate(..., idempotency_key=...)`` (sync and aio): the retry gets the same call ids; one call recorded."""
    sink = served[1]
    before = len(sink)
    first = client.generate("planner", MSG, max_tokens=4, episode_id="ep-idem", idempotency_key="turn-1")
    again = client.generate("planner", MSG, max_tokens=4, episode_id="ep-idem", idempotency_key="turn-1")

    async def aio_retry():
        async with marti.aio.InferenceClient(served[0], token=TOKEN) as c:
            return await c.generate(
                "planner", MSG, max_tokens=4, episode_id="ep-idem", idempotency_key="turn-1"
            )

    third = asyncio.run(aio_retry())
    assert again.choices[0].call_id == third.choices[0].call_id == first.choices[0].call_id
    assert again.choices[0].token_ids == first.choices[0].token_ids
    client.report_reward("ep-idem", {"planner": 1.0})
    (episode,) = sink[before:]
    assert len(episode["planner"].turns) == 1


@pytest.mark.parametrize("endpoint", ["grpc_port", "http_port"])
def test_the_gateway_refuses_a_port_another_server_listens_on(endpoint):
    """Both of the gateway's listeners bind exclusively: a port a running ``marti broker`` holds is refused with
    "address in use" naming the port (gRPC's default SO_REUSEPORT let the gateway share it), nothing left running."""
    from faults.procs import start

    from marti.errors import UnavailableError

    broker = start("broker")
    try:
        port = int(broker.address.rsplit(":", 1)[1])
        server = GatewayServer(Gateway(_EchoBackend(), GatewayLimits(max_wait_ms=1)), **{endpoint: port})
        with pytest.raises(UnavailableError, match=f"address in use \\(port {port} ") as err:
            server.start()
        what = "InferenceService" if endpoint == "grpc_port" else "the gateway's HTTP endpoint"
        assert what in str(err.value)
        assert not server.running
    finally:
        broker.stop()
