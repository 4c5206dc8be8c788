"""Unit tests of the remembered replies (services/gateway/core/transcript.py)."""

from __future__ import annotations

from services.gateway.core.transcript import Spoken, Transcripts, message_key

SYSTEM = {"role": "system", "content": "be brief"}
USER = {"role": "user", "content": "add 2 and 3"}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    ],
}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


def test_a_reply_carried_back_is_found_at_its_index():
    t = Transcripts(max_per_episode=8)
    t.remember("e", "alice", [SYSTEM, USER], TOOLS, CALL, Spoken((1, 2, 3, 9)))
    result = {"role": "tool", "tool_call_id": "call_1", "content": "5"}
    assert t.lookup("e", "alice", [SYSTEM, USER, CALL, result], TOOLS) == (2, Spoken((1, 2, 3, 9)))


def test_call_ids_whitespace_key_order_and_null_content_do_not_matter():
    sent_back = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "other", "type": "function", "function": {"name": "add", "arguments": '{"b":3,"a":2}'}}
        ],
    }
    assert message_key(sent_back) == message_key(CALL)


def test_a_different_prefix_agent_episode_tools_or_reply_is_not_found():
    t = Transcripts(max_per_episode=8)
    t.remember("e", "alice", [SYSTEM, USER], TOOLS, CALL, Spoken((1,)))
    assert t.lookup("e", "bob", [SYSTEM, USER, CALL], TOOLS) is None
    assert t.lookup("f", "alice", [SYSTEM, USER, CALL], TOOLS) is None
    assert t.lookup("e", "alice", [USER, CALL], TOOLS) is None
    assert t.lookup("e", "alice", [SYSTEM, USER, CALL], None) is None
    edited = {**CALL, "tool_calls": [{"function": {"name": "add", "arguments": '{"a": 2, "b": 4}'}}]}
    assert t.lookup("e", "alice", [SYSTEM, USER, edited], TOOLS) is None


def test_the_latest_remembered_reply_wins():
    t = Transcripts(max_per_episode=8)
    first = {"role": "assistant", "content": "hi"}
    second = {"role": "assistant", "content": "bye"}
    t.remember("e", "a", [USER], None, first, Spoken((1, 2)))
    t.remember("e", "a", [USER, first, USER], None, second, Spoken((1, 2, 3, 4)))
    assert t.lookup("e", "a", [USER, first, USER, second, USER], None) == (3, Spoken((1, 2, 3, 4)))


def test_at_most_max_per_episode_replies_are_kept_and_forget_drops_the_episode():
    t = Transcripts(max_per_episode=2)
    for i in range(3):
        t.remember("e", "a", [USER], None, {"role": "assistant", "content": str(i)}, Spoken((i,)))
    assert len(t) == 2
    assert t.lookup("e", "a", [USER, {"role": "assistant", "content": "0"}], None) is None
    assert t.lookup("e", "a", [USER, {"role": "assistant", "content": "2"}], None) is not None
    t.forget("e")
    assert "e" not in t and len(t) == 0
