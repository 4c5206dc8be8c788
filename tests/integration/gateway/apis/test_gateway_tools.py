"""Tool calling on ``/v1/chat/completions`` over a real port, driven by the official ``openai`` client.

One :class:`~services.gateway.server.GatewayServer` serves two agents over a scripted backend (the tiny model's
tokenizer, no model): ``a`` keeps the tiny model's chat template, which knows nothing of tools (the gateway renders
them in its fallback format), and ``q`` has a Qwen-style template that renders tools, calls and results itself.
Every completion is :attr:`_ScriptedBackend.reply` (cut at a stop string as the engine cuts it); every prompt the
engine got is kept, so the tests read what the model saw.
"""

from __future__ import annotations

import copy
import json

import httpx
import openai
import pytest

from marti.types.inference import Generation
from services.gateway.core.backend import InferenceBackend
from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.models.loading import load_tokenizer
from services.trainer.rollout.engines.base import chat_to_ids
from services.trainer.rollout.serving.gateway_backend import _Tokenizers

TOKEN = "tools-token"
MAX_TOOLS_CHARS = 1000

#: A Qwen 2.5-style template: tools in the system turn, calls as <tool_call> JSON, results as <tool_response>.
QWEN_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools><|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and tools %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n{{ message.content }}"
    "{%- for tc in message.tool_calls %}<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _call(name: str, args: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


class _ScriptedBackend(_Tokenizers, InferenceBackend):
    """Agents ``a`` (the tiny model's template, no tools) and ``q`` (:data:`QWEN_TEMPLATE`), no model: every
    completion is ``reply`` then eos, cut before the first stop string it holds; ``prompts`` and ``stops`` record
    each engine call's prompts and stop strings."""

    def __init__(self) -> None:
        tok = load_tokenizer()
        qwen = copy.deepcopy(tok)
        qwen.chat_template = QWEN_TEMPLATE
        self.tokenizers = {"a": tok, "q": qwen}
        self.reply = ""
        self.prompts: list[list[int]] = []
        self.stops: list[tuple[str, ...]] = []

    def agents(self) -> list[str]:
        return ["a", "q"]

    def versions(self) -> dict[str, int]:
        return {"a": 0, "q": 0}

    def resident_versions(self, agent: str) -> list[int]:
        return [0]

    def max_model_len(self, agent: str) -> int:
        return 100_000

    def generate(self, agent, prompts, sampling, version) -> list[Generation]:
        self.prompts.extend(list(p) for p in prompts)
        self.stops.append(tuple(sampling.stop))
        text, reason = self.reply, "stop"
        cut = [text.index(s) for s in sampling.stop if s in text]
        ids = self.encode(agent, text) + [self.tokenizers[agent].eos_token_id]
        if cut:
            text = text[: min(cut)]
            ids = self.encode(agent, text) + self.encode(agent, self.reply[min(cut) :])[:1]
        return [Generation(list(p), list(ids), [-0.5] * len(ids), text, reason, 0, agent) for p in prompts]


@pytest.fixture(scope="module")
def gw():
    """``(client, backend, http_url)`` of a GatewayServer over :class:`_ScriptedBackend`."""
    backend = _ScriptedBackend()
    gateway = Gateway(backend, GatewayLimits(max_wait_ms=1, max_tools_chars=MAX_TOOLS_CHARS))
    server = GatewayServer(gateway, token=TOKEN)
    http_url, _ = server.start()
    client = openai.OpenAI(base_url=http_url, api_key=TOKEN, max_retries=0, timeout=30)
    yield client, backend, http_url
    server.stop()


def _seen(backend: _ScriptedBackend, agent: str = "a") -> str:
    """The last prompt the engine got, as text (special tokens kept)."""
    return backend.tokenizers[agent].decode(backend.prompts[-1])


def test_tools_reach_the_prompt_and_a_call_comes_back_as_tool_calls(gw):
    client, backend, _ = gw
    backend.reply = _call("get_weather", {"city": "Paris"})
    r = client.chat.completions.create(model="a", messages=ASK, tools=[WEATHER, TIME], max_tokens=50)
    (choice,) = r.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and len(call.id) == len("call_") + 24 and call.type == "function"
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    # the fallback format: the tools in a system block, how to call them, then the conversation
    seen = _seen(backend)
    assert "<tools>\n" + json.dumps(WEATHER) in seen and "<tool_call></tool_call> XML tags" in seen
    assert seen.index("<tools>") < seen.index("What is the weather in Paris?")
    # the template that renders tools gets them through apply_chat_template(tools=...)
    client.chat.completions.create(model="q", messages=ASK, tools=[WEATHER], max_tokens=50)
    assert backend.prompts[-1] == chat_to_ids(backend.tokenizers["q"], ASK, [WEATHER])
    assert "# Tools\n<tools>" in _seen(backend, "q")


def test_parallel_calls_with_text_and_the_tool_results_round_trip(gw):
    client, backend, _ = gw
    backend.reply = (
        "Checking both.\n" + _call("get_weather", {"city": "Paris"}) + "\n" + _call("get_time", {})
    )
    r = client.chat.completions.create(model="a", messages=ASK, tools=[WEATHER, TIME], max_tokens=50)
    msg = r.choices[0].message
    assert msg.content == "Checking both." and r.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in msg.tool_calls] == ["get_weather", "get_time"]
    assert [c.function.arguments for c in msg.tool_calls] == ['{"city":"Paris"}', "{}"]
    assert len({c.id for c in msg.tool_calls}) == 2
    history = [
        *ASK,
        msg.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}),
        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "18C and sunny"},
        {"role": "tool", "tool_call_id": msg.tool_calls[1].id, "content": "noon"},
    ]
    backend.reply = "It is 18C and sunny."
    for agent in ("a", "q"):
        r2 = client.chat.completions.create(
            model=agent, messages=history, tools=[WEATHER, TIME], max_tokens=50
        )
        assert (
            r2.choices[0].message.content == "It is 18C and sunny." and not r2.choices[0].message.tool_calls
        )
        assert r2.choices[0].finish_reason == "stop"
        seen = _seen(backend, agent)
        assert (
            seen.count('<tool_call>\n{"name": "get_') == 2
            and '"name": "get_weather"' in seen
            and '"city": "Paris"' in seen
        )
        assert "<tool_response>\n18C and sunny\n</tool_response>" in seen and "noon" in seen
        assert seen.index("Checking both.") < seen.index("18C and sunny") < seen.rindex("assistant")


def test_a_forced_call_is_prefilled_into_the_prompt_and_parsed_from_prefix_and_reply(gw):
    client, backend, http_url = gw
    backend.reply = '{"city": "Rome"}}\n</tool_call>'  # the model continues the prefilled start of the call
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model="a", messages=ASK, tools=[WEATHER, TIME], tool_choice=named, max_tokens=50
    )
    (call,) = r.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city":"Rome"}')
    prefix = backend.encode("a", '<tool_call>\n{"name": "get_weather", "arguments": ')
    prompt = r.model_extra["prompt_token_ids"]
    assert prompt[-len(prefix) :] == prefix and backend.prompts[-1] == prompt  # prompt, not generated
    assert r.choices[0].model_extra["token_ids"] == backend.encode("a", backend.reply) + [
        backend.tokenizers["a"].eos_token_id
    ]
    backend.reply = '{"name": "get_time", "arguments": {}}\n</tool_call>'
    r = client.chat.completions.create(
        model="a", messages=ASK, tools=[WEATHER, TIME], tool_choice="required", max_tokens=50
    )
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_time"]
    assert _seen(backend).endswith("assistant\n<tool_call>\n")
    # none: the tools are rendered, the reply is text even when it looks like a call
    backend.reply = _call("get_time", {})
    r = client.chat.completions.create(
        model="a", messages=ASK, tools=[WEATHER, TIME], tool_choice="none", max_tokens=50
    )
    assert r.choices[0].message.content == backend.reply and r.choices[0].message.tool_calls is None
    assert "<tools>" in _seen(backend)


def test_parallel_tool_calls_false_stops_generation_after_the_first_call(gw):
    client, backend, _ = gw
    backend.reply = _call("get_weather", {"city": "Paris"}) + "\n" + _call("get_time", {})
    r = client.chat.completions.create(
        model="a", messages=ASK, tools=[WEATHER, TIME], parallel_tool_calls=False, max_tokens=50
    )
    assert backend.stops[-1] == ("</tool_call>",)
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]


def test_streamed_tool_calls_assemble_into_the_same_calls(gw):
    client, backend, _ = gw
    backend.reply = "Sure.\n" + _call("get_weather", {"city": "São Paulo"}) + _call("get_time", {})
    stream = client.chat.completions.create(
        model="a", messages=ASK, tools=[WEATHER, TIME], max_tokens=50, stream=True, logprobs=True
    )
    content, calls, finish, logprobs = "", {}, None, 0
    for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            logprobs += len(choice.logprobs.content) if choice.logprobs and choice.logprobs.content else 0
            for d in delta.tool_calls or ():
                entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = d.id or entry["id"]
                entry["name"] += (d.function.name or "") if d.function else ""
                entry["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = choice.finish_reason or finish
    assert content == "Sure." and finish == "tool_calls"
    assert [c["name"] for c in calls.values()] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"]) == {"city": "São Paulo"} and calls[1]["arguments"] == "{}"
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert logprobs == len(backend.encode("a", backend.reply)) + 1  # every token's, once


@pytest.mark.parametrize(
    "reply",
    [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>',  # malformed JSON
        _call("launch_rockets", {"count": 3}),  # a tool the request does not define
        '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>',  # arguments not an object
    ],
)
def test_a_call_that_cannot_be_parsed_is_returned_as_text_and_counted(gw, reply):
    client, backend, http_url = gw
    backend.reply = reply

    def unparsed() -> float:
        stats = httpx.get(http_url + "/gateway/stats", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        return stats["tool_calls_unparsed"]

    before = unparsed()
    r = client.chat.completions.create(model="a", messages=ASK, tools=[WEATHER], max_tokens=50)
    assert r.choices[0].message.content == reply and r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "stop" and unparsed() == before + 1


def _bad(client, **kw) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="a", max_tokens=5, **kw)
    return e.value.body


def test_bad_tool_requests_get_400s_naming_the_field(gw):
    client, backend, _ = gw
    backend.reply = "ok"
    err = _bad(
        client, messages=ASK, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "fly"}}
    )
    assert err["param"] == "tool_choice" and "'fly'" in err["message"] and "get_weather" in err["message"]
    assert _bad(client, messages=ASK, tool_choice="required")["param"] == "tool_choice"
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{city"}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]
    err = _bad(client, messages=history, tools=[WEATHER])
    assert err["param"] == "messages[1].tool_calls[0].function.arguments" and "not JSON" in err["message"]
    call["function"]["arguments"] = "[1]"
    assert (
        _bad(client, messages=history, tools=[WEATHER])["param"]
        == "messages[1].tool_calls[0].function.arguments"
    )
    call["function"]["arguments"] = "{}"
    orphan = [*history, {"role": "tool", "tool_call_id": "call_2", "content": "x"}]
    err = _bad(client, messages=orphan, tools=[WEATHER])
    assert err["param"] == "messages[2].tool_call_id" and "'call_2'" in err["message"]
    assert (
        _bad(client, messages=[*ASK, {"role": "tool", "content": "x"}])["param"] == "messages[1].tool_call_id"
    )
    assert _bad(client, messages=ASK, tools=[WEATHER, WEATHER])["param"] == "tools"


def test_tools_longer_than_max_tools_chars_are_refused_at_the_limit(gw):
    client, backend, _ = gw
    backend.reply = "ok"

    def tool(chars: int) -> dict:
        base = {"type": "function", "function": {"name": "f", "description": ""}}
        pad = chars - len(json.dumps([base]))
        return {"type": "function", "function": {"name": "f", "description": "d" * pad}}

    assert len(json.dumps([tool(MAX_TOOLS_CHARS)])) == MAX_TOOLS_CHARS
    r = client.chat.completions.create(model="a", messages=ASK, tools=[tool(MAX_TOOLS_CHARS)], max_tokens=5)
    assert r.choices[0].message.content == "ok"
    err = _bad(client, messages=ASK, tools=[tool(MAX_TOOLS_CHARS + 1)])
    assert err["param"] == "tools" and "gateway.max_tools_chars" in err["message"]


def test_a_forced_call_that_does_not_parse_streams_its_prefilled_start_first(gw):
    client, backend, http_url = gw
    backend.reply = "not json at all"
    stream = client.chat.completions.create(
        model="a", messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=50, stream=True
    )
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert pieces[0] == "<tool_call>\n" and "".join(pieces) == "<tool_call>\nnot json at all"


def test_a_retry_answered_from_its_idempotency_key_has_the_same_tool_call_ids(gw):
    client, backend, _ = gw
    backend.reply = _call("get_weather", {"city": "Paris"}) + _call("get_time", {})
    headers = {"X-Marti-Episode": "ep-ids", "Idempotency-Key": "k1"}

    def ids(**kw) -> list[str]:
        r = client.chat.completions.create(
            model="a", messages=ASK, tools=[WEATHER, TIME], max_tokens=50, **kw
        )
        return [c.id for c in r.choices[0].message.tool_calls]

    first = ids(extra_headers=headers)
    assert ids(extra_headers=headers) == first and len(set(first)) == 2
    assert ids() != first  # another call: other ids


def test_stop_strings_over_the_limit_with_the_added_end_of_call_say_the_gateway_added_it(gw):
    client, backend, _ = gw
    backend.reply = "ok"
    limit = GatewayLimits().max_stop
    stops = [f"s{i}" for i in range(limit)]
    err = _bad(client, messages=ASK, tools=[WEATHER], parallel_tool_calls=False, stop=stops)
    assert err["param"] == "stop" and "'</tool_call>'" in err["message"], err
    assert (
        "parallel_tool_calls false" in err["message"]
        and f"at most {limit - 1} stop strings" in err["message"]
    )
    r = client.chat.completions.create(
        model="a", messages=ASK, tools=[WEATHER], parallel_tool_calls=False, stop=stops[:-1], max_tokens=5
    )
    assert r.choices[0].message.content == "ok"
    assert "gateway added" not in _bad(client, messages=ASK, stop=[*stops, "x"])["message"]
