"""The gateway's tool calling pieces: the parsers (Hermes, Mistral), the registry and its config keys, rendering
(template support, the fallback format), the reply a generation becomes, and the streamed tool-call deltas."""

from __future__ import annotations

import json

import pytest

from marti.config import config_from_dict
from marti.errors import InvalidArgumentError
from marti.types.inference import Generation
from marti.types.tools import TOOL_PARSER_NAMES, ToolCall
from services.gateway.core.gateway import Gateway
from services.gateway.core.tools import (
    TOOL_PARSERS,
    HermesParser,
    MistralParser,
    fallback_messages,
    has_tool_turns,
    template_supports_tools,
    tool_parser,
    unmatched_tool_result,
)
from services.gateway.http.completions.chat_tools import ARGUMENT_PIECE_CHARS, tool_call_deltas
from tests.unit.gateway.test_gateway_core import FakeBackend

NAMES = {"get_weather", "get_time"}
HERMES = HermesParser()
MISTRAL = MistralParser()
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def _calls(parsed) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed.calls]


def test_hermes_reads_parallel_calls_and_the_text_around_them():
    text = (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}</tool_call> done'
    )
    parsed = HERMES.parse(text, NAMES)
    assert _calls(parsed) == [("get_weather", {"city": "Paris"}), ("get_time", {"tz": "UTC"})]
    assert parsed.content == "Let me look.\n\n done".strip() and not parsed.unparsed
    assert parsed.calls[0].arguments == '{"city":"Paris"}'  # compact JSON
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in parsed.calls)
    assert parsed.calls[0].id != parsed.calls[1].id
    # only calls: no content; the last call may lack its end (generation stopped at it)
    only = HERMES.parse('<tool_call>{"name": "get_time", "arguments": {}}', NAMES)
    assert only.content is None and _calls(only) == [("get_time", {})]
    assert HERMES.parse("just text", NAMES).content == "just text"


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "get_time", "arguments": {</tool_call>',  # malformed JSON
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # unknown tool
        '<tool_call>{"name": "get_time", "arguments": [1]}</tool_call>',  # arguments not an object
        '<tool_call>["get_time"]</tool_call>',  # not an object
        '<tool_call>{"name": ["get_time"], "arguments": {}}</tool_call>',  # a name that is not a string
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call><tool_call>oops</tool_call>',  # one bad
        '<tool_call>{"name": "get_time", "arguments": {"x": NaN}}</tool_call>',  # JSON has no NaN
        '<tool_call>{"name": "get_time", "arguments": "{\\"x\\": -Infinity}"}</tool_call>',  # nor in text
        '<tool_call>{"name": "get_time", "arguments": {"x": 1e999}}</tool_call>',  # beyond the float range
    ],
)
def test_a_call_that_does_not_parse_leaves_the_whole_text(text):
    for parser, t in ((HERMES, text), (MISTRAL, text.replace("<tool_call>", "[TOOL_CALLS]"))):
        parsed = parser.parse(t, NAMES)
        assert parsed.unparsed and parsed.calls == () and parsed.content == t


def test_mistral_reads_an_array_of_calls_and_the_text_before():
    parsed = MISTRAL.parse(
        'Sure.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
        '{"name": "get_time", "arguments": {}}]',
        NAMES,
    )
    assert parsed.content == "Sure." and _calls(parsed) == [
        ("get_weather", {"city": "Oslo"}),
        ("get_time", {}),
    ]
    single = MISTRAL.parse('[TOOL_CALLS]{"name": "get_time", "arguments": {}}', NAMES)
    assert single.content is None and _calls(single) == [("get_time", {})]
    assert MISTRAL.parse("[TOOL_CALLS][]", NAMES).unparsed


@pytest.mark.parametrize("parser", [HERMES, MISTRAL])
def test_calls_written_by_a_parser_and_a_forced_start_read_back(parser):
    calls = [("get_weather", {"city": "Zürich"}), ("get_time", {})]
    assert _calls(parser.parse(parser.render_calls(calls), NAMES)) == calls
    # a forced call: the prefilled start plus the model's continuation is one call
    named = parser.forced_prefix("get_weather")
    rest = '{"city": "Rome"}}' + ("]" if parser is MISTRAL else "\n</tool_call>")
    assert _calls(parser.parse(named + rest, NAMES)) == [("get_weather", {"city": "Rome"})]
    anyone = parser.forced_prefix(None)
    rest = '{"name": "get_time", "arguments": {}}' + ("]" if parser is MISTRAL else "</tool_call>")
    assert _calls(parser.parse(anyone + rest, NAMES)) == [("get_time", {})]
    block = parser.tools_block(TOOLS)
    assert json.dumps(TOOLS[0]) in block or json.dumps(TOOLS) in block


def test_the_registry_is_what_the_config_checks_and_unknown_names_are_named():
    assert tuple(TOOL_PARSERS) == TOOL_PARSER_NAMES
    assert isinstance(tool_parser("mistral"), MistralParser)
    with pytest.raises(InvalidArgumentError, match=r"unknown tool parser 'qwen'.*'hermes', 'mistral'"):
        tool_parser("qwen")
    agents = [{"name": "a", "pretrain_model": "m", "role": "planner"}]
    cfg = config_from_dict(
        {"training_name": "t", "agents": agents, "gateway": {"tool_parsers": {"a": "mistral"}}}
    )
    assert cfg.gateway.tool_parser == "hermes" and cfg.gateway.tool_parsers == {"a": "mistral"}
    for gateway, words in (
        ({"tool_parser": "qwen"}, "gateway.tool_parser.*unknown tool parser 'qwen'.*'hermes', 'mistral'"),
        ({"tool_parsers": {"a": "llama"}}, "agent 'a': unknown tool parser 'llama'"),
        ({"tool_parsers": {"zed": "hermes"}}, r"gateway.tool_parsers names agents \['zed'\]"),
    ):
        with pytest.raises(InvalidArgumentError, match=words):
            config_from_dict({"training_name": "t", "agents": agents, "gateway": gateway})


def test_a_template_renders_tools_when_it_reads_the_tools_variable():
    assert template_supports_tools("{% if tools %}{{ tools | tojson }}{% endif %}{{ messages }}")
    assert not template_supports_tools("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert not template_supports_tools("{% set tools = [] %}{{ tools }}")  # its own variable
    assert not template_supports_tools(None) and not template_supports_tools("{% if %}")


def test_the_fallback_writes_tools_calls_and_results_in_the_parsers_format():
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call, {**call, "id": "c2"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        {"role": "tool", "tool_call_id": "c2", "content": "19C"},
    ]
    assert has_tool_turns(messages) and not has_tool_turns(messages[:2])
    assert unmatched_tool_result(messages) is None
    assert unmatched_tool_result([messages[1], messages[3]]) == 1
    out = fallback_messages(messages, TOOLS, HERMES)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"] == "Be brief.\n\n" + HERMES.tools_block(TOOLS)
    assert out[2]["content"] == HERMES.render_calls([("get_weather", {"city": "Paris"})] * 2)
    assert (
        out[3]["content"] == "<tool_response>\n18C\n</tool_response>\n<tool_response>\n19C\n</tool_response>"
    )
    assert all(set(m) == {"role", "content"} for m in out)
    # no system message: the tools block is one, first; no tools: none
    assert fallback_messages(messages[1:], TOOLS, MISTRAL)[0] == {
        "role": "system",
        "content": MISTRAL.tools_block(TOOLS),
    }
    assert fallback_messages(messages[1:2], None, HERMES) == [{"role": "user", "content": "Weather?"}]


def _gen(text: str) -> Generation:
    return Generation([1], [2, 3], [-0.1, -0.1], text, "stop", 0, "a")


def test_a_generation_becomes_a_reply_and_unparsable_calls_are_counted():
    gateway = Gateway(FakeBackend(), tool_parsers={"a": "mistral"})
    calls = '[TOOL_CALLS][{"name": "get_weather", "arguments": {}}, {"name": "get_weather", "arguments": {}}]'
    reply = gateway.parse_reply("a", _gen(calls), TOOLS)
    assert reply.finish_reason == "tool_calls" and len(reply.tool_calls) == 2 and reply.content is None
    # at most one call: two are returned as text (the Mistral format has no end of one call to stop at)
    one = gateway.parse_reply("a", _gen(calls), TOOLS, one_call=True)
    assert one.unparsed and one.content == calls and one.finish_reason == "stop" and not one.tool_calls
    assert gateway.stats()["tool_calls_unparsed"] == 1
    # no tools (or tool_choice none): the text as it is, nothing counted
    assert gateway.parse_reply("a", _gen(calls), None).content == calls
    assert gateway.stats()["tool_calls_unparsed"] == 1
    with pytest.raises(InvalidArgumentError, match="unknown tool parser 'x'"):
        Gateway(FakeBackend(), tool_parser="x")


def test_a_streamed_call_is_its_head_then_its_arguments_in_pieces():
    call = ToolCall("call_" + "0" * 24, "get_weather", json.dumps({"city": "x" * 40}))
    deltas = tool_call_deltas(3, call)
    assert deltas[0] == {
        "index": 3,
        "id": call.id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    pieces = [d["function"]["arguments"] for d in deltas[1:]]
    assert "".join(pieces) == call.arguments and all(
        d == {"index": 3, "function": d["function"]} for d in deltas[1:]
    )
    assert max(len(p) for p in pieces) == ARGUMENT_PIECE_CHARS and len(pieces) > 1
