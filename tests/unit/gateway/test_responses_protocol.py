"""The Responses API's translation into a chat call (services/gateway/http/responses/protocol.py) and the store of
responses ``previous_response_id`` continues (responses_store.py)."""

from __future__ import annotations

import pytest

from marti.errors import InvalidArgumentError, NotFoundError
from marti.types.tools import ChatReply, ToolCall
from services.gateway.core.traces import EpisodeTracker
from services.gateway.http.responses.protocol import ResponsesRequest, chat_call
from services.gateway.http.responses.serving import output_items, reply_message
from services.gateway.http.responses.store import ResponseStore, StoredResponse

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}


def _call(**fields):
    return chat_call(ResponsesRequest(model="a", **fields))


def test_items_become_chat_template_messages_with_one_assistant_turn_per_reply():
    said = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Let me see."}],
    }
    call = _call(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Use tools."},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Weather"},
                    {"type": "input_text", "text": "in Paris?"},
                ],
            },
            said,
            CALL,
            {**CALL, "call_id": "call_2", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_2", "output": "rain"},
            {
                "type": "function_call_output",
                "call_id": "call_1",
                "output": [{"type": "input_text", "text": "sun"}],
            },
        ],
        tools=[TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=7,
        temperature=0.5,
    )
    calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
        },
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {}}},
    ]
    assert call.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather\nin Paris?"},
        {"role": "assistant", "content": "Let me see.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain", "name": "get_weather"},
        {"role": "tool", "tool_call_id": "call_1", "content": "sun", "name": "get_weather"},
    ]
    assert call.tools == [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    assert (call.tool_choice, call.parallel_tool_calls, call.max_tokens) == (
        {"name": "get_weather"},
        False,
        7,
    )
    assert (call.max_tokens_param, call.messages_param, call.body.temperature) == (
        "max_output_tokens",
        "input",
        0.5,
    )
    assert _call(input="hi").messages == [{"role": "user", "content": "hi"}]


def test_a_reply_comes_back_as_the_message_its_output_items_translate_to():
    reply = ChatReply("Checking.", (ToolCall("call_9", "get_weather", '{"city":"Oslo"}'),), "tool_calls")
    items = output_items(reply)
    assert [i["type"] for i in items] == ["message", "function_call"] and items[1]["call_id"] == "call_9"
    sent_back = _call(input=[{"role": "user", "content": "hi"}, *items]).messages[1]
    assert sent_back == reply_message(reply)
    only_calls = ChatReply(None, reply.tool_calls, "tool_calls")
    assert _call(input=output_items(only_calls)).messages == [reply_message(only_calls)]
    assert output_items(ChatReply("", (), "length"))[0]["status"] == "incomplete"


def test_a_previous_conversation_supplies_the_calls_an_output_answers():
    previous = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {}}}],
        },
    ]
    body = ResponsesRequest(
        model="a", input=[{"type": "function_call_output", "call_id": "call_1", "output": "x"}]
    )
    assert chat_call(body, previous).messages[2] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "x",
        "name": "f",
    }
    with pytest.raises(InvalidArgumentError) as e:
        chat_call(body)
    assert e.value.param == "input[0].call_id"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": 3}, "input"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        (
            {"input": [{"role": "user", "content": "a"}, {"type": "reasoning", "summary": []}]},
            "input[1].type",
        ),
        ({"input": [{"role": "tool", "content": "a"}]}, "input[0].role"),
        ({"input": [{"role": "critic", "content": "a"}]}, "input[0].role"),
        ({"input": [{**CALL, "arguments": "[1]"}]}, "input[0].arguments"),
        ({"input": [{**CALL, "name": 5}]}, "input[0].name"),
        (
            {"input": [CALL, {"type": "function_call_output", "call_id": "call_1", "output": 1}]},
            "input[1].output",
        ),
        ({"input": "a", "tools": [{"type": "file_search"}]}, "tools[0].type"),
        ({"input": "a", "tools": [{**TOOL, "parameters": "x"}]}, "tools[0].parameters"),
        ({"input": "a", "tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"input": "a", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format"),
        ({"input": "a", "text": {"verbosity": "low"}}, "text.verbosity"),
        ({"input": "a", "truncation": "auto"}, "truncation"),
        ({"input": "a", "reasoning": {"effort": "low"}}, "reasoning"),
        ({"input": "a", "include": ["message.output_text.logprobs"]}, "include[0]"),
        ({"input": "a", "top_logprobs": 2}, "top_logprobs"),
        ({"input": "a", "conversation": "conv_1"}, "conversation"),
        ({"input": "a", "background": True}, "background"),
        ({"input": "a", "max_tool_calls": 3}, "max_tool_calls"),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_field(fields, param):
    with pytest.raises(InvalidArgumentError) as e:
        _call(**fields)
    assert e.value.param == param, e.value.message


def _stored(rid: str, episode: str, previous: StoredResponse | None = None) -> StoredResponse:
    return StoredResponse(rid, episode, ({"role": "user", "content": rid},), previous)


def test_the_store_is_per_episode_bounded_and_freed_when_the_episode_closes():
    tracker = EpisodeTracker(["a"], episode_timeout_s=60, max_open_episodes=10, max_calls_per_episode=10)
    store = ResponseStore(tracker.on_close, max_per_scope=2)
    assert not store.put(_stored("resp_closed", "ep-never-opened")) and len(store) == 0
    tracker.begin_call("ep", "a", 1)  # open, with a call running
    first = _stored("resp_1", "ep")
    assert store.put(first) and store.put(_stored("resp_2", "ep", first))
    store.put(_stored("resp_3", "ep", store.get("resp_2", "ep")))
    with pytest.raises(NotFoundError):  # the oldest is forgotten beyond the bound ...
        store.get("resp_1", "ep")
    third = store.get("resp_3", "ep")  # ... but its chain is still read through the responses after it
    assert [m["content"] for m in third.conversation()] == ["resp_1", "resp_2", "resp_3"]
    with pytest.raises(InvalidArgumentError) as e:
        store.get("resp_3", "other")
    assert e.value.param == "previous_response_id"
    store.put(_stored("resp_u", ""))  # untraced: its own bounded scope, never closed
    with pytest.raises(InvalidArgumentError):
        store.get("resp_u", "ep")
    tracker.end_call("ep", "a", 1)  # nothing recorded: the episode closes unused
    with pytest.raises(NotFoundError) as e:
        store.get("resp_3", "ep")
    assert e.value.param == "previous_response_id" and len(store) == 1
