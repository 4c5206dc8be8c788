"""Anthropic's Messages request translated into the chat service's call, and the reply into Anthropic's blocks
and stream events (pure; the route itself is tested with the ``anthropic`` client in
tests/integration/gateway/apis/test_gateway_anthropic.py)."""

from __future__ import annotations

import json

import anthropic
import pydantic
import pytest

from marti import errors
from marti.errors import InvalidArgumentError
from marti.types.tools import ChatReply, ToolCall
from services.gateway.http.anthropic.protocol import MessagesRequest, chat_call
from services.gateway.http.anthropic.serving import content_blocks, stream_events
from services.gateway.http.common.errors import error_response, exception_response

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _call(**body):
    return chat_call(MessagesRequest.model_validate({"model": "a", "max_tokens": 16, **body}))


def _refused(param: str, **body) -> str:
    with pytest.raises(InvalidArgumentError) as e:
        _call(**body)
    assert e.value.param == param, e.value.message
    return e.value.message


def test_system_blocks_tool_round_trip_and_sampling_become_the_chat_call():
    call = _call(
        system=[
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Use tools."},
        ],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Lyon"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "no"}, {"type": "text", "text": "data"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
        tools=[WEATHER],
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        stop_sequences=["END"],
        metadata={"user_id": "u-1"},
        thinking={"type": "disabled"},
    )
    assert call.messages == [
        {"role": "system", "content": "Be brief.\nUse tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Lyon"}},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "name": "get_weather", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "name": "get_weather", "content": "Error: no\ndata"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert call.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER["input_schema"],
                "description": WEATHER["description"],
            },
        }
    ]
    assert (call.tool_choice, call.parallel_tool_calls, call.max_tokens) == ("auto", True, 16)
    sampling = call.body.sampling(16, "max_tokens")
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.stop) == (0.5, 0.9, 40, ("END",))
    assert call.body.model == "a" and call.body.n is None


def test_a_string_system_and_an_assistant_turn_of_only_tool_calls():
    call = _call(
        system="S",
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "go"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        ],
    )
    assert call.messages[0] == {"role": "system", "content": "S"}
    assert (
        call.messages[2]["content"] is None and call.messages[2]["tool_calls"][0]["function"]["name"] == "f"
    )
    assert call.messages[3] == {"role": "tool", "tool_call_id": "t", "name": "f", "content": ""}


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, ("auto", True)),
        ({"type": "any"}, ("required", True)),
        ({"type": "none"}, ("none", True)),
        ({"type": "tool", "name": "get_weather"}, ({"name": "get_weather"}, True)),
        ({"type": "any", "disable_parallel_tool_use": True}, ("required", False)),
    ],
)
def test_tool_choice_maps_onto_the_chat_service(choice, expected):
    call = _call(messages=[{"role": "user", "content": "hi"}], tools=[WEATHER], tool_choice=choice)
    assert (call.tool_choice, call.parallel_tool_calls) == expected


USER = {"role": "user", "content": "hi"}
ASKED = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]}


@pytest.mark.parametrize(
    ("param", "body", "says"),
    [
        (
            "messages[0].content[1].type",
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "x"}, {"type": "image", "source": {}}],
                    }
                ]
            },
            "text only",
        ),
        (
            "messages[0].content[0].type",
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "text only",
        ),
        (
            "messages[1].content[0].type",
            {
                "messages": [
                    USER,
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]},
                    USER,
                ]
            },
            "thinking",
        ),
        (
            "messages[0].content[0].type",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}]}
                ]
            },
            "user message",
        ),
        (
            "messages[1].content[0].type",
            {
                "messages": [
                    USER,
                    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "x"}]},
                    USER,
                ]
            },
            "assistant message",
        ),
        (
            "messages[2].content[0].tool_use_id",
            {
                "messages": [
                    USER,
                    ASKED,
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9"}]},
                ]
            },
            "'t9' matches no tool_use",
        ),
        (
            "messages[2].content[0].content[0].type",
            {
                "messages": [
                    USER,
                    ASKED,
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t1",
                                "content": [{"type": "image", "source": {}}],
                            }
                        ],
                    },
                ]
            },
            "text only",
        ),
        (
            "messages[2].content[0].is_error",
            {
                "messages": [
                    USER,
                    ASKED,
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": "yes"}],
                    },
                ]
            },
            "boolean",
        ),
        (
            "messages[1].content[0].input",
            {
                "messages": [
                    USER,
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "x", "name": "f", "input": "[1]"}],
                    },
                    USER,
                ]
            },
            "object",
        ),
        (
            "messages[1].content[2]",
            {
                "messages": [
                    USER,
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "text", "text": "Let me look."},
                            {"type": "tool_use", "id": "x", "name": "f", "input": {}},
                            {"type": "text", "text": "Done."},
                        ],
                    },
                    USER,
                ]
            },
            "after a tool_use",
        ),
        ("messages[0].content", {"messages": [{"role": "user", "content": []}]}, "non-empty"),
        ("messages[0].content[0]", {"messages": [{"role": "user", "content": ["hi"]}]}, "content block"),
        (
            "messages[0].content[0].text",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
            "surrogate",
        ),
        (
            "messages[1].role",
            {"messages": [USER, {"role": "assistant", "content": "The answer is"}]},
            "prefill",
        ),
        ("system[0].type", {"system": [{"type": "image"}], "messages": [USER]}, "text only"),
        (
            "tools[0].type",
            {"messages": [USER], "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "server tools",
        ),
        ("tools[0].input_schema", {"messages": [USER], "tools": [{"name": "f"}]}, "JSON schema"),
        ("tools[0].name", {"messages": [USER], "tools": [{"input_schema": {"type": "object"}}]}, "string"),
        (
            "tool_choice",
            {"messages": [USER], "tools": [WEATHER], "tool_choice": {"type": "required"}},
            "'any'",
        ),
        ("tool_choice", {"messages": [USER], "tool_choice": {"type": "any"}}, "needs tools"),
        (
            "tool_choice.name",
            {"messages": [USER], "tools": [WEATHER], "tool_choice": {"type": "tool"}},
            "string",
        ),
        (
            "tool_choice.disable_parallel_tool_use",
            {"messages": [USER], "tool_choice": {"type": "auto", "disable_parallel_tool_use": 1}},
            "boolean",
        ),
    ],
)
def test_what_the_engine_cannot_read_or_a_malformed_block_is_refused_naming_the_field(param, body, says):
    assert says in _refused(param, **body)


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"messages": [USER], "thinking": {"type": "enabled", "budget_tokens": 1024}}, ("thinking",)),
        ({"messages": [USER]}, None),  # max_tokens is required: dropped below
        ({"messages": [{"role": "system", "content": "x"}]}, ("messages", 0, "role")),
        ({"messages": [USER], "stop_sequences": [""]}, ("stop_sequences",)),
        (
            {"messages": [USER], "output_config": {"format": {"type": "json_schema", "schema": {}}}},
            ("output_config",),
        ),
        ({"messages": []}, ("messages",)),
    ],
)
def test_fields_refused_by_the_request_model(body, loc):
    full = {"model": "a", **body} if loc is None else {"model": "a", "max_tokens": 4, **body}
    with pytest.raises(pydantic.ValidationError) as e:
        MessagesRequest.model_validate(full)
    assert e.value.errors()[0]["loc"] == (loc or ("max_tokens",))


def test_reply_blocks_and_stream_events_have_anthropics_shapes():
    call = ToolCall("call_" + "ab" * 12, "get_weather", '{"city":"Paris"}')
    reply = ChatReply("Checking.", (call,), "tool_calls")
    blocks = content_blocks(reply)
    assert blocks == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_" + "ab" * 12, "name": "get_weather", "input": {"city": "Paris"}},
    ]
    assert content_blocks(ChatReply(None, (call,), "tool_calls"))[0]["type"] == "tool_use"
    assert content_blocks(ChatReply("", (), "stop")) == [{"type": "text", "text": ""}]
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "a",
        "content": blocks,
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 5},
        "token_ids": [1, 2, 3, 4, 5],
    }
    events = stream_events(message, reply, None)
    names = [name for name, _ in events]
    assert names == ["message_start"] + [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ] * 2 + [
        "message_delta",
        "message_stop",
    ]
    parsed = [
        pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent).validate_python(d) for _, d in events
    ]
    assert [p.type for p in parsed] == names
    assert parsed[0].message.content == [] and parsed[0].message.model_extra["token_ids"] == [1, 2, 3, 4, 5]
    assert (
        json.loads(parsed[5].delta.partial_json) == {"city": "Paris"} and parsed[4].content_block.input == {}
    )
    assert parsed[-2].delta.stop_reason == "tool_use" and parsed[-2].usage.output_tokens == 5
    # a plain reply streams one delta per piece that adds text
    plain = {**message, "content": [{"type": "text", "text": "Hi there"}], "stop_reason": "end_turn"}
    deltas = [
        d["delta"]["text"]
        for n, d in stream_events(plain, ChatReply("Hi there", (), "stop"), ["Hi", "", " there"])
        if n == "content_block_delta"
    ]
    assert deltas == ["Hi", " there"]


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (errors.InvalidArgumentError("bad"), 400, "invalid_request_error"),
        (errors.UnauthenticatedError("who"), 401, "authentication_error"),
        (errors.PermissionDeniedError("no"), 403, "permission_error"),
        (errors.NotFoundError("none"), 404, "not_found_error"),
        (errors.FailedPreconditionError("done"), 409, "conflict_error"),
        (errors.ResourceExhaustedError("full"), 429, "rate_limit_error"),
        (errors.CancelledError("gone"), 499, "api_error"),
        (RuntimeError("secret"), 500, "api_error"),
        (errors.UnavailableError("closing"), 503, "api_error"),
        (errors.DeadlineExceededError("late"), 504, "timeout_error"),
    ],
)
def test_errors_on_the_messages_route_have_anthropics_shape_with_the_same_status(exc, status, kind):
    for path in ("/v1/messages", "/episodes/e-1/groups/g/v1/messages", "/v1/messages/count_tokens"):
        response = exception_response(exc, path=path)
        body = json.loads(response.body)
        assert response.status_code == status and body["type"] == "error" and body["error"]["type"] == kind
        assert "secret" not in body["error"]["message"]
    openai_body = json.loads(exception_response(exc, path="/episodes/v1/v1/chat/completions").body)
    assert set(openai_body) == {"error"} and response.status_code == status


def test_a_body_over_the_limit_on_the_messages_route_is_request_too_large():
    body = json.loads(error_response(413, "too big", "invalid_request_error", path="/v1/messages").body)
    assert body["error"]["type"] == "request_too_large" and body["error"]["message"] == "too big"
