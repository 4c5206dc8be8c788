"""A reply the gateway generated is never re-tokenised: the next prompt that carries it back starts from its exact
ids, so a multi-turn (tool-calling) conversation stays one training sample (services/gateway/core/chat.py).

The backend's model is scripted and spells every reply one character per token, as a sampled reply may be
spelled: re-tokenising the reply's text would merge those characters into other tokens, the next prompt would not
extend the last call's prompt and response, and the trace would split into two samples.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from marti.types.inference import Generation
from services.gateway.core.backend import InferenceBackend
from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.models.loading import load_tokenizer
from services.trainer.rollout.serving.gateway_backend import _Tokenizers
from tests.integration.gateway.one_agent import OneAgent

ADD = {
    "type": "function",
    "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {}, "b": {}}}},
}
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


class _CharBackend(OneAgent, _Tokenizers, InferenceBackend):
    """Agent ``a`` on the tiny model's tokenizer; each reply is ``replies[i]`` spelled one token per character,
    then eos (or no eos with finish ``length`` when ``cut``)."""

    def __init__(self) -> None:
        self.tokenizers = {"a": load_tokenizer()}
        self.replies: list[str] = []
        self.cut = False
        self.prompts: list[list[int]] = []

    def generate(self, agent, prompts, sampling, version) -> list[Generation]:
        tok = self.tokenizers[agent]
        text = self.replies.pop(0)
        ids = [t for c in text for t in tok(c, add_special_tokens=False)["input_ids"]]
        ids += [] if self.cut else [tok.eos_token_id]
        self.prompts.extend(list(p) for p in prompts)
        reason = "length" if self.cut else "stop"
        return [Generation(list(p), ids, [-0.5] * len(ids), text, reason, 0, agent) for p in prompts]


@pytest.fixture
def gw():
    """``(client factory, backend, gateway, root url, released episodes)`` over :class:`_CharBackend`."""
    backend = _CharBackend()
    released: list[dict] = []
    gateway = Gateway(backend, GatewayLimits(max_wait_ms=1), sink=released.append)
    server = GatewayServer(gateway)
    http_url, _ = server.start()
    root = http_url.removesuffix("/v1")

    def client(episode: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{root}/episodes/{episode}/v1", api_key="x", max_retries=0, timeout=30)

    yield client, backend, gateway, root, released
    server.stop()


def _report(root: str, episode: str) -> None:
    r = httpx.post(f"{root}/v1/episodes/{episode}/reward", json={"rewards": {"a": 1.0}}, timeout=30)
    assert r.status_code == 200, r.text


def test_a_tool_calling_conversation_is_one_sample_with_the_generated_ids(gw):
    client, backend, gateway, root, released = gw
    backend.replies = [CALL, "five"]
    tools = [ADD]
    messages = [{"role": "user", "content": "add 2 and 3"}]
    first = client("e1").chat.completions.create(model="a", messages=messages, tools=tools)
    call = first.choices[0].message
    assert call.tool_calls and call.tool_calls[0].function.name == "add"
    messages += [
        call.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "5"},
    ]
    second = client("e1").chat.completions.create(model="a", messages=messages, tools=tools)
    spoken = first.prompt_token_ids + first.choices[0].token_ids
    assert backend.prompts[1][: len(spoken)] == spoken  # the reply's exact ids, not its text re-tokenised
    _report(root, "e1")
    (turn,) = released[0]["a"].turns  # one sample
    generated = [t for t, m in zip(turn.response_token_ids, turn.response_mask, strict=True) if m]
    assert generated == first.choices[0].token_ids + second.choices[0].token_ids  # only the model's tokens
    assert len(generated) == len(CALL) + 1 + len("five") + 1  # both replies as sampled, char by char + eos
    assert gateway.stats()["prompts_spliced"] == 1.0


def test_a_plain_follow_up_user_turn_extends_the_reply_ids_and_the_tool_result_is_masked(gw):
    client, backend, gateway, root, released = gw
    backend.replies = ["helloworld", "ok"]
    messages = [{"role": "user", "content": "hi"}]
    first = client("e2").chat.completions.create(model="a", messages=messages)
    messages += [{"role": "assistant", "content": "helloworld"}, {"role": "user", "content": "again"}]
    client("e2").chat.completions.create(model="a", messages=messages)
    _report(root, "e2")
    (turn,) = released[0]["a"].turns
    n = len(first.choices[0].token_ids)
    assert turn.response_token_ids[:n] == first.choices[0].token_ids
    gap = turn.response_mask[n:-3]  # between the two replies ("o", "k", eos): the user's turn, mask 0
    assert gap and not any(gap)
    tok = backend.tokenizers["a"]
    assert "again" in tok.decode(turn.response_token_ids[n:-3])


def test_a_reply_carried_back_with_a_name_keeps_its_ids_when_the_template_renders_no_names(gw):
    """LangGraph names an agent's messages (``AIMessage.name``) and sends the name back; the SmolLM2 template
    renders no names, so the named reply is the remembered one and the follow-up is spliced, not re-tokenised."""
    client, backend, gateway, root, released = gw
    backend.replies = ["helloworld", "ok"]
    messages = [{"role": "user", "content": "hi", "name": "user_1"}]
    first = client("e4").chat.completions.create(model="a", messages=messages)
    messages += [
        {"role": "assistant", "content": "helloworld", "name": "a"},
        {"role": "user", "content": "again"},
    ]
    client("e4").chat.completions.create(model="a", messages=messages)
    spoken = first.prompt_token_ids + first.choices[0].token_ids
    assert backend.prompts[1][: len(spoken)] == spoken
    assert gateway.stats()["prompts_spliced"] == 1.0 and not gateway.chats.reads_names("a")
    _report(root, "e4")
    (turn,) = released[0]["a"].turns  # one sample


def test_a_reply_cut_by_max_tokens_is_rendered_whole_and_counted(gw):
    client, backend, gateway, root, _ = gw
    backend.cut = True  # finish "length": no end-of-turn token to cut after
    backend.replies = ["helloworld", "ok"]
    messages = [{"role": "user", "content": "hi"}]
    first = client("e3").chat.completions.create(model="a", messages=messages)
    messages += [{"role": "assistant", "content": "helloworld"}, {"role": "user", "content": "again"}]
    client("e3").chat.completions.create(model="a", messages=messages)
    spoken = first.prompt_token_ids + first.choices[0].token_ids
    assert backend.prompts[1][: len(spoken)] != spoken
    stats = gateway.stats()
    assert (stats["prompts_spliced"], stats["prompts_retokenized"]) == (0.0, 1.0)
    _report(root, "e3")
    assert len(gateway.chats.transcripts) == 0 and "e3" not in gateway.chats.transcripts  # forgotten at close
