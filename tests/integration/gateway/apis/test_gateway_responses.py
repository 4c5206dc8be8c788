"""OpenAI's Responses API on the gateway (``POST /v1/responses``), driven by the official ``openai`` client and by
the OpenAI Agents SDK over a real port.

The policy is :class:`~tests.integration.gateway.apis.scripted_policy.ScriptedToolPolicy` (the tiny model's tokenizer
and chat template, no model): a prompt listing tools gets a Hermes call of ``get_weather``, a prompt holding a
tool's result gets ``ANSWER``, anything else ``REPLY``.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.models.loading import load_tokenizer
from tests.integration.gateway.apis.scripted_policy import ANSWER, REPLY, ScriptedToolPolicy

TOKEN = "responses-test-token"
MAX_STORED = 2
MAX_TOOLS_CHARS = 1000
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def gateway():
    """``(root_url, sink)``: a GatewayServer over the scripted policy, with a token."""
    sink: list = []
    limits = GatewayLimits(max_wait_ms=1, max_stored_responses=MAX_STORED, max_tools_chars=MAX_TOOLS_CHARS)
    server = GatewayServer(Gateway(ScriptedToolPolicy(), limits, sink=sink.append), token=TOKEN)
    http_url, _ = server.start()
    yield http_url.removesuffix("/v1"), sink
    server.stop()


def _client(root: str, episode: str = "") -> openai.OpenAI:
    base = f"{root}/episodes/{episode}/v1" if episode else f"{root}/v1"
    return openai.OpenAI(base_url=base, api_key=TOKEN, max_retries=0, timeout=30)


def _report(root: str, episode: str) -> None:
    r = httpx.post(
        f"{root}/v1/episodes/{episode}/reward",
        json={"rewards": {"a": 1.0}},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text


def test_a_string_input_with_instructions_and_the_gateways_extensions(gateway):
    root, _ = gateway
    r = _client(root).responses.create(
        model="a", input="Hi", instructions="You are terse.", metadata={"k": "v"}
    )
    assert isinstance(r, openai.types.responses.Response) and r.id.startswith("resp_")
    assert (r.object, r.status, r.model, r.output_text, r.metadata) == (
        "response",
        "completed",
        "a",
        REPLY,
        {"k": "v"},
    )
    [item] = r.output
    assert item.type == "message" and item.id.startswith("msg_") and item.content[0].type == "output_text"
    extra = r.model_extra
    assert r.usage.input_tokens == len(extra["prompt_token_ids"]) and r.usage.output_tokens == len(
        extra["token_ids"]
    )
    assert extra["call_ids"] == [extra["call_id"]] and extra["agent"] == "a" and extra["policy_version"] == 0
    prompt = load_tokenizer().decode(extra["prompt_token_ids"])
    assert prompt.index("You are terse.") < prompt.index("Hi")
    cut = _client(root).responses.create(model="a", input="Hi", max_output_tokens=2)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 2


def test_a_function_call_and_its_output_round_trip_is_traced_as_one_sample(gateway):
    root, sink = gateway
    client = _client(root, "ep-resp-tools")
    first = client.responses.create(model="a", input=ASK, tools=[WEATHER])
    [call] = first.output
    assert (call.type, call.name, call.arguments, call.status) == (
        "function_call",
        "get_weather",
        '{"city":"Paris"}',
        "completed",
    )
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    # the Agents SDK's way: the whole conversation again, with the output items and the call's output
    items = [{"role": "user", "content": ASK}, *(o.model_dump(exclude_none=True) for o in first.output)]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"})
    second = client.responses.create(model="a", input=items, tools=[WEATHER])
    assert second.output_text == ANSWER and second.status == "completed"
    _report(root, "ep-resp-tools")
    traj = sink[-1]["a"]
    assert traj.episode_id == "ep-resp-tools" and len(traj.turns) == 1  # the second prompt extends the first
    masked = [
        t
        for t, keep in zip(traj.turns[0].response_token_ids, traj.turns[0].response_mask, strict=True)
        if not keep
    ]
    assert "sunny, 24 C" in load_tokenizer().decode(masked)


def test_a_call_of_a_tool_the_request_lacks_comes_back_as_text_and_is_counted(gateway):
    root, _ = gateway
    stats = f"{root}/v1/gateway/stats"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    before = httpx.get(stats, headers=auth, timeout=30).json()["tool_calls_unparsed"]
    other = {
        **WEATHER,
        "name": "get_time",
    }  # the policy calls get_weather, which this request does not define
    r = _client(root).responses.create(model="a", input=ASK, tools=[other])
    [item] = r.output
    assert item.type == "message" and "get_weather" in r.output_text and r.status == "completed"
    assert httpx.get(stats, headers=auth, timeout=30).json()["tool_calls_unparsed"] == before + 1


def test_previous_response_id_continues_within_its_episode_only(gateway):
    root, sink = gateway
    client = _client(root, "ep-prev")
    first = client.responses.create(model="a", input=ASK, tools=[WEATHER], instructions="Use tools.")
    call = first.output[0]
    second = client.responses.create(
        model="a",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24 C"}],
        tools=[WEATHER],
        instructions="Use tools.",
    )
    assert second.output_text == ANSWER and second.previous_response_id == first.id
    prompt = load_tokenizer().decode(second.model_extra["prompt_token_ids"])
    assert ASK in prompt and "sunny, 24 C" in prompt and prompt.count("Use tools.") == 1
    third = client.responses.create(
        # tools and instructions are the request's own (never carried over): the same again, one sample
        model="a",
        previous_response_id=second.id,
        input="Thanks!",
        tools=[WEATHER],
        instructions="Use tools.",
    )
    assert ASK in load_tokenizer().decode(third.model_extra["prompt_token_ids"])  # the whole chain
    # the episode keeps its last MAX_STORED responses; another episode, or an untraced call, cannot continue them
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="a", previous_response_id=first.id, input="Hi")
    for other in (_client(root, "ep-other"), _client(root)):
        with pytest.raises(openai.BadRequestError) as e:
            other.responses.create(model="a", previous_response_id=second.id, input="Hi")
        assert e.value.body["param"] == "previous_response_id" and "ep-prev" in e.value.body["message"]
    _report(root, "ep-prev")
    assert len(sink[-1]["a"].turns) == 1
    with pytest.raises(openai.NotFoundError) as e:  # freed when the episode closed
        client.responses.create(model="a", previous_response_id=second.id, input="Hi")
    assert e.value.body["param"] == "previous_response_id" and "ended" in e.value.body["message"]


def test_untraced_responses_are_stored_bounded_and_store_false_is_not(gateway):
    root, _ = gateway
    client = _client(root)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="a", previous_response_id="resp_nope", input="Hi")
    assert e.value.body["param"] == "previous_response_id" and "resp_nope" in e.value.body["message"]
    unstored = client.responses.create(model="a", input="Hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="a", previous_response_id=unstored.id, input="Hi")
    first = client.responses.create(model="a", input="one")
    assert client.responses.create(model="a", previous_response_id=first.id, input="two").output_text == REPLY
    for _ in range(MAX_STORED):  # the untraced store keeps the last MAX_STORED: first is forgotten
        client.responses.create(model="a", input="more")
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="a", previous_response_id=first.id, input="three")
    assert "gateway.max_stored_responses" in e.value.body["message"]
    traced = _client(root, "ep-untraced-mix").responses.create(model="a", input="Hi")
    with pytest.raises(openai.BadRequestError) as e:  # a traced response is not an untraced call's
        client.responses.create(model="a", previous_response_id=traced.id, input="Hi")
    assert e.value.body["param"] == "previous_response_id"


def test_streaming_events_of_text_and_function_calls(gateway):
    root, _ = gateway
    client = _client(root)
    with client.responses.stream(model="a", input="Hi") as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == REPLY == final.output_text
    stream = client.responses.create(model="a", input=ASK, tools=[WEATHER], stream=True)
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[-1].response.output[0]
    assert (
        (done.name, done.arguments) == ("get_weather", events[3].delta) == ("get_weather", '{"city":"Paris"}')
    )


def test_a_stream_cut_at_max_output_tokens_ends_with_response_incomplete(gateway):
    """As docs/gateway.md says: the stream's last event is response.incomplete with the cut response, and the
    openai client's stream helper, which wants response.completed, raises on get_final_response()."""
    client = _client(gateway[0])
    with client.responses.stream(model="a", input="Hi", max_output_tokens=1) as s:
        events = list(s)
        with pytest.raises(RuntimeError, match="response.completed"):
            s.get_final_response()
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_bad_requests_name_the_field(gateway):
    root, _ = gateway
    client = _client(root)
    image = {"type": "input_image", "image_url": "https://example.com/a.png"}
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{oops"}
    bad = [
        ({"input": [{"role": "user", "content": [image]}]}, "input[0].content[0].type", "text only"),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]},
            "input[0].call_id",
            "call_9",
        ),
        ({"input": [{"role": "user", "content": "hi"}, call]}, "input[1].arguments", "not JSON"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "item_reference"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type", "hosted"),
        (
            {"input": "hi", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
            "tool_choice",
            "nope",
        ),
        (
            {"input": "hi", "tools": [{**WEATHER, "description": "d" * MAX_TOOLS_CHARS}]},
            "tools",
            "max_tools_chars",
        ),
        ({"input": "hi", "text": {"format": {"type": "json_object"}}}, "text.format", "json_object"),
        ({"input": "hi", "truncation": "auto"}, "truncation", "never drops"),
        ({"input": "hi", "reasoning": {"effort": "high"}}, "reasoning", "reasoning"),
        ({"input": "hi", "include": ["message.output_text.logprobs"]}, "include[0]", "log-prob"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
        ({"input": []}, "input", "non-empty"),
    ]
    for fields, param, says in bad:
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(**{"model": "a", **fields})
        err = e.value.body
        assert (err["type"], err["param"]) == ("invalid_request_error", param), (fields, err)
        assert says in err["message"], err
    # harmless settings the Agents SDK may send are accepted
    ok = client.responses.create(
        model="a",
        input="hi",
        include=["reasoning.encrypted_content"],
        truncation="disabled",
        reasoning={},
        text={"format": {"type": "text"}},
    )
    assert ok.output_text == REPLY
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nobody", input="hi")


def test_a_call_without_input_is_refused_and_records_nothing(gateway):
    root, sink = gateway
    head = {"Authorization": f"Bearer {TOKEN}", "X-Marti-Episode": "no-input"}
    for extra in ({}, {"inputs": "hi"}, {"input": ""}, {"input": []}):  # absent, a typo, empty
        body = {"model": "a", "max_output_tokens": 4, **extra}
        r = httpx.post(f"{root}/v1/responses", json=body, headers=head, timeout=30)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "input" and "non-empty" in err["message"], (
            extra,
            r.text,
        )
    before = len(sink)
    gone = httpx.post(
        f"{root}/v1/episodes/no-input/reward", json={"rewards": {"a": 1.0}}, headers=head, timeout=30
    )
    assert gone.status_code == 404 and len(sink) == before, gone.text  # nothing was recorded


def test_the_agents_sdk_runs_a_function_tool_through_the_gateway(gateway):
    """An Agents SDK agent with a function tool, its default model (the Responses API), run plainly and streamed,
    each run one traced episode of one sample."""
    root, sink = gateway
    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return "sunny, 24 C"

    def agent(episode: str) -> Agent:
        client = openai.AsyncOpenAI(base_url=f"{root}/episodes/{episode}/v1", api_key=TOKEN, max_retries=0)
        model = OpenAIResponsesModel(model="a", openai_client=client)
        return Agent(
            name="weather", instructions="Answer with the weather.", model=model, tools=[get_weather]
        )

    async def runs() -> tuple[str, str, list[str]]:
        plain = await Runner.run(agent("ep-agents"), ASK)
        streamed = Runner.run_streamed(agent("ep-agents-stream"), ASK)
        kinds = [e.type async for e in streamed.stream_events()]
        return plain.final_output, streamed.final_output, kinds

    plain, streamed, kinds = asyncio.run(runs())
    assert plain == streamed == ANSWER and seen == ["Paris", "Paris"] and "raw_response_event" in kinds
    for episode in ("ep-agents", "ep-agents-stream"):
        _report(root, episode)
        traj = sink[-1]["a"]
        assert traj.episode_id == episode and len(traj.turns) == 1
