"""The inference SDK refuses arguments the request cannot carry before sending, with marti's own error."""

from __future__ import annotations

import asyncio

import pytest

import marti
from marti.errors import InvalidArgumentError

MSG = [{"role": "user", "content": "hi"}]
# nothing listens there: every case must be refused before anything is sent
ADDRESS = "127.0.0.1:1"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": 2**40}, r"max_tokens is 1099511627776, above"),
        ({"n": 2**32}, r"n is 4294967296, above"),
        ({"top_k": 2**33}, r"top_k is 8589934592, above"),
        ({"messages": [{"role": "user", "content": "a\ud800b"}]}, r"messages\[0\]\.content .*character 1"),
        ({"messages": None, "text": "x\udcff"}, r"\btext must be .*valid Unicode that UTF-8 can carry"),
        (
            {"messages": [{"role": "user", "content": None}]},
            r"^messages\[0\]\.content is None; content is required",
        ),
        # never rendered with str() nor dropped: the model would see (and the job train on) another prompt
        (
            {"messages": [{"role": "user", "content": 5}]},
            r"^messages\[0\]\.content must be a string .*got int 5",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            r"^messages\[0\]\.content\[0\] must be a text part",
        ),
        (
            {"messages": [*MSG, {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]}]},
            r"^messages\[1\]\.tool_calls: the gRPC Generate call carries only 'role' and 'content'",
        ),
        (
            {"messages": [*MSG, {"role": "tool", "content": "18C", "tool_call_id": "c1"}]},
            r"^messages\[1\]\.tool_call_id: ",
        ),
        ({"messages": [{"role": 3, "content": "x"}]}, r"^messages\[0\]\.role must be a string"),
        ({"stop": ["ok", "\ud83d"]}, r"\bstop must be .*valid Unicode that UTF-8 can carry"),
        ({"episode_id": "e\ud800"}, r"\bepisode_id must be .*valid Unicode that UTF-8 can carry"),
        ({"idempotency_key": "\udc00"}, r"\bidempotency_key must be .*valid Unicode that UTF-8 can carry"),
    ],
)
def test_generate_refuses_what_the_request_cannot_carry(kwargs, match):
    args = {"messages": MSG, **kwargs}
    messages = args.pop("messages")
    with marti.InferenceClient(ADDRESS, token="t", timeout_s=1) as client:
        with pytest.raises(InvalidArgumentError, match=match):
            client.generate("planner", messages, **args)

    async def aio() -> None:
        async with marti.aio.InferenceClient(ADDRESS, token="t", timeout_s=1) as c:
            with pytest.raises(InvalidArgumentError, match=match):
                await c.generate("planner", messages, **args)

    asyncio.run(aio())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"group_size": 2**32}, r"group_size is 4294967296, above"),
        ({"group_id": "g\ud800"}, r"\bgroup_id must be .*valid Unicode that UTF-8 can carry"),
        ({"call_rewards": {"c\udc80": 1.0}}, r"\bcall_rewards must be .*valid Unicode that UTF-8 can carry"),
    ],
)
def test_report_reward_refuses_what_the_request_cannot_carry(kwargs, match):
    with marti.InferenceClient(ADDRESS, token="t", timeout_s=1) as client:
        with pytest.raises(InvalidArgumentError, match=match):
            client.report_reward("e1", {"a": 1.0}, **kwargs)
