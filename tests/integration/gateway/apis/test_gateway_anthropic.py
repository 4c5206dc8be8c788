"""Anthropic's Messages API on the gateway (``POST /v1/messages``), driven by the official ``anthropic`` client over
a real port.

The policy is scripted (the tiny model's tokenizer and its real SmolLM2 chat template, no model; that template does
not render tools, so the gateway's Hermes fallback format puts them in the prompt): it answers a prompt that lists
tools with a Hermes call of ``get_weather`` (or the rest of one, when the prompt was prefilled with its start), a
prompt holding a tool's result with :data:`ANSWER`, anything else with :data:`REPLY`; with stop strings it goes on
with ``" STOP now"`` and is cut as the engine cuts it.
"""

from __future__ import annotations

import anthropic
import httpx
import pytest

from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.models.loading import load_tokenizer
from tests.integration.gateway.apis.scripted_policy import ANSWER, REPLY, ScriptedToolPolicy

TOKEN = "anthropic-test-token"
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_REQUEST_BYTES = 8192
MAX_TOOLS_CHARS = 1000


@pytest.fixture(scope="module")
def gateway():
    """``(root_url, sink)``: a GatewayServer over the scripted backend, with a token."""
    sink: list = []
    limits = GatewayLimits(
        max_wait_ms=1, max_request_bytes=MAX_REQUEST_BYTES, max_tools_chars=MAX_TOOLS_CHARS
    )
    server = GatewayServer(Gateway(ScriptedToolPolicy(), limits, sink=sink.append), token=TOKEN)
    http_url, _ = server.start()
    yield http_url.removesuffix("/v1"), sink
    server.stop()


def _client(base: str, key: str = TOKEN, **auth) -> anthropic.Anthropic:
    """The client sending ``x-api-key: key`` alone (as Anthropic's clients and Claude Code do; this version of the
    Python client sends its own ``api_key`` as ``Authorization: Bearer``), or ``auth`` instead when given."""
    headers = {} if auth else {"x-api-key": key}
    return anthropic.Anthropic(base_url=base, max_retries=0, timeout=30, default_headers=headers, **auth)


def test_a_plain_message_with_a_system_prompt_and_the_gateways_extensions(gateway):
    root, _ = gateway
    m = _client(root).messages.create(
        model="a", max_tokens=64, system="You are terse.", messages=[{"role": "user", "content": "Hi"}]
    )
    assert isinstance(m, anthropic.types.Message) and m.id.startswith("msg_") and m.type == "message"
    assert (m.role, m.model, m.stop_reason, m.stop_sequence) == ("assistant", "a", "end_turn", None)
    assert [(b.type, b.text) for b in m.content] == [("text", REPLY)]
    extra = m.model_extra
    assert m.usage.input_tokens == len(extra["prompt_token_ids"]) and m.usage.output_tokens == len(
        extra["token_ids"]
    )
    assert extra["call_ids"] == [extra["call_id"]] and extra["agent"] == "a" and extra["policy_version"] == 0
    prompt = load_tokenizer().decode(extra["prompt_token_ids"])
    assert "You are terse." in prompt and "Hi" in prompt
    # text blocks, and the stop sequence that ended the text
    s = _client(root).messages.create(
        model="a",
        max_tokens=64,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        stop_sequences=["never", "STOP"],
    )
    assert (s.content[0].text, s.stop_reason, s.stop_sequence) == (REPLY + " ", "stop_sequence", "STOP")
    short = _client(root).messages.create(
        model="a", max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
    )
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 2


def test_a_tool_use_and_tool_result_round_trip_is_traced_under_the_episode_prefix(gateway):
    root, sink = gateway
    client = _client(f"{root}/episodes/ep-tools")  # posts to {base}/v1/messages
    first = client.messages.create(model="a", max_tokens=64, tools=[WEATHER], messages=ASK)
    assert first.stop_reason == "tool_use" and [b.type for b in first.content] == ["tool_use"]
    (use,) = first.content
    assert use.name == "get_weather" and use.input == {"city": "Paris"} and use.id.startswith("toolu_")
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 24 C"}
    second = client.messages.create(
        model="a",
        max_tokens=64,
        tools=[WEATHER],
        messages=[
            *ASK,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result]},
        ],
    )
    assert (second.stop_reason, second.content[0].text) == ("end_turn", ANSWER)
    prompt = load_tokenizer().decode(second.model_extra["prompt_token_ids"])
    assert "<tool_response>\nsunny, 24 C\n</tool_response>" in prompt and '"city": "Paris"' in prompt
    report = httpx.post(
        f"{root}/v1/episodes/ep-tools/reward", json={"rewards": {"a": 1.0}}, headers={"x-api-key": TOKEN}
    )
    assert report.status_code == 401  # x-api-key is the token on the Messages route only
    report = httpx.post(
        f"{root}/v1/episodes/ep-tools/reward",
        json={"rewards": {"a": 1.0}},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert report.status_code == 200, report.text
    traj = sink[-1]["a"]
    assert len(traj.turns) == 1  # the tool's result is in the one sample's response, with mask 0
    assert "sunny, 24 C" in load_tokenizer().decode(
        [
            t
            for t, keep in zip(traj.turns[0].response_token_ids, traj.turns[0].response_mask, strict=True)
            if not keep
        ]
    )
    assert traj.episode_id == "ep-tools" and traj.episode_return == 1.0
    sampled = [
        t
        for turn in traj.turns
        for t, keep in zip(turn.response_token_ids, turn.response_mask, strict=True)
        if keep
    ]
    assert sampled == first.model_extra["token_ids"] + second.model_extra["token_ids"]


@pytest.mark.parametrize(
    ("choice", "parallel"), [({"type": "any"}, True), ({"type": "tool", "name": "get_weather"}, False)]
)
def test_tool_choice_any_and_a_named_tool_force_a_call(gateway, choice, parallel):
    root, _ = gateway
    if not parallel:
        choice = {**choice, "disable_parallel_tool_use": True}
    m = _client(root).messages.create(
        model="a",
        max_tokens=64,
        tools=[WEATHER],
        tool_choice=choice,
        messages=[{"role": "user", "content": "Hi"}],
    )
    assert m.stop_reason == "tool_use" and m.content[-1].input == {"city": "Paris"}


def test_streaming_text_and_tool_use_with_the_clients_stream_helper(gateway):
    root, _ = gateway
    client = _client(root, api_key=TOKEN)  # sent as Authorization: Bearer, which this route takes too
    with client.messages.stream(model="a", max_tokens=64, messages=[{"role": "user", "content": "Hi"}]) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == REPLY == final.content[0].text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == len(
        final.model_extra["token_ids"]
    )
    assert final.id.startswith("msg_") and final.model_extra["call_ids"]
    with client.messages.stream(model="a", max_tokens=64, tools=[WEATHER], messages=ASK) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert final.stop_reason == "tool_use" and final.content[0].input == {"city": "Paris"}


def _refusal(exc_info) -> dict:
    body = exc_info.value.body
    assert body["type"] == "error", body
    return body["error"]


def test_bad_requests_get_anthropics_error_shape_and_the_clients_typed_errors(gateway):
    root, _ = gateway
    client = _client(root)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    bad = [
        ({"messages": [{"role": "user", "content": [image]}]}, "messages[0].content[0].type", "text only"),
        ({"messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking", "thinking"),
        (
            {"messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
            "tool_choice",
            "nope",
        ),
        ({"messages": ASK, "max_tokens": 0}, "max_tokens", "max_tokens"),
        (
            {"messages": ASK, "tools": [{**WEATHER, "description": "d" * MAX_TOOLS_CHARS}]},
            "tools",
            "max_tools_chars",
        ),
        ({"messages": ASK, "stop_sequences": ["x"] * 100}, "stop_sequences", "gateway.max_stop"),
    ]
    for fields, param, says in bad:
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(**{"model": "a", "max_tokens": 16, **fields})
        err = _refusal(e)
        assert (err["type"], err["param"]) == ("invalid_request_error", param), err
        assert says in err["message"] and e.value.status_code == 400
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nobody", max_tokens=16, messages=ASK)
    assert _refusal(e)["type"] == "not_found_error" and "nobody" in _refusal(e)["message"]
    with pytest.raises(anthropic.AuthenticationError) as e:
        _client(root, key="wrong").messages.create(model="a", max_tokens=16, messages=ASK)
    assert _refusal(e)["type"] == "authentication_error" and "x-api-key" in _refusal(e)["message"]
    missing = httpx.post(
        f"{root}/v1/messages", json={"model": "a", "messages": ASK}, headers={"x-api-key": TOKEN}
    )
    assert missing.status_code == 400 and missing.json()["error"]["message"] == "max_tokens is required"
    big = httpx.post(
        f"{root}/v1/messages", content=b"x" * (MAX_REQUEST_BYTES + 1), headers={"x-api-key": TOKEN}
    )
    assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
    unknown = httpx.post(f"{root}/v1/messages/count_tokens", json={}, headers={"x-api-key": TOKEN})
    assert unknown.status_code == 404 and unknown.json()["type"] == "error"
    # the OpenAI routes keep OpenAI's shape
    chat = httpx.post(
        f"{root}/v1/chat/completions",
        json={"model": "nobody", "messages": ASK},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert (
        chat.status_code == 404 and "type" not in chat.json() and chat.json()["error"]["code"] == "not_found"
    )
