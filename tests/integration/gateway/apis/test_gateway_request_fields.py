"""Every request field the gateway accepts reaches the engine or the chat template, or is refused with a 400 naming
it (never accepted and dropped), driven by the official ``openai`` and ``anthropic`` clients over a real port:
``seed`` on the Responses route, the sampling ranges of each route, a chat message's ``name``, and a report's
``group_id``.

The policy is :class:`~tests.integration.gateway.apis.scripted_policy.ScriptedToolPolicy` with a chat template that
renders a message's ``name``; it keeps the sampling parameters and the prompt of every call it serves.
"""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

import marti
from marti.errors import NotFoundError
from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from tests.integration.gateway.apis.scripted_policy import REPLY, ScriptedToolPolicy

TOKEN = "request-fields-token"
#: A chat template that renders a message's ``name`` (as some Hugging Face templates do).
NAMED_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}{% if m.name %} ({{ m.name }}){% endif %}: {{ m.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HI = [{"role": "user", "content": "Hi"}]


class _Recording(ScriptedToolPolicy):
    """The scripted policy, keeping ``(sampling, prompt text)`` of every prompt it serves in ``seen``."""

    def __init__(self) -> None:
        super().__init__()
        self.tok.chat_template = NAMED_TEMPLATE
        self.seen: list = []

    def generate(self, agent, prompts, sampling, version):
        self.seen += [(sampling, self.tok.decode(p)) for p in prompts]
        return super().generate(agent, prompts, sampling, version)


@pytest.fixture(scope="module")
def gateway():
    """``(root_url, policy, sink, grpc_address)``: a GatewayServer over the recording policy, with a token."""
    sink: list = []
    policy = _Recording()
    server = GatewayServer(Gateway(policy, GatewayLimits(max_wait_ms=1), sink=sink.append), token=TOKEN)
    http_url, grpc_address = server.start()
    yield http_url.removesuffix("/v1"), policy, sink, grpc_address
    server.stop()


def _openai(root: str, episode: str = "") -> openai.OpenAI:
    base = f"{root}/episodes/{episode}/v1" if episode else f"{root}/v1"
    return openai.OpenAI(base_url=base, api_key=TOKEN, max_retries=0, timeout=30)


def _err(e: pytest.ExceptionInfo) -> dict:
    body = e.value.body
    return body.get("error", body) if isinstance(body, dict) else {}


def test_a_seed_on_the_responses_route_reaches_the_engine_as_on_chat_completions(gateway):
    root, policy, *_ = gateway
    client = _openai(root)
    r = client.responses.create(model="a", input="Hi", extra_body={"seed": 1234})
    assert r.output_text == REPLY and policy.seen[-1][0].seed == 1234
    client.chat.completions.create(model="a", messages=HI, seed=1234)
    assert policy.seen[-1][0].seed == 1234
    for bad in ("7", 1.5, 2**64):  # validated as on chat completions
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="a", input="Hi", extra_body={"seed": bad})
        assert _err(e)["param"] == "seed", _err(e)


@pytest.mark.parametrize(
    ("route", "field", "value"),
    [
        ("chat", "temperature", 2.5),
        ("chat", "temperature", -0.1),
        ("chat", "top_p", 1.5),
        ("completions", "temperature", 3.0),
        ("completions", "top_p", -1.0),
        ("responses", "temperature", 2.01),
        ("responses", "top_p", 1.01),
    ],
)
def test_openai_sampling_fields_outside_openais_ranges_are_refused_naming_field_and_value(
    gateway, route, field, value
):
    root, policy, *_ = gateway
    client, before = _openai(root), len(policy.seen)
    call = {
        "chat": lambda **kw: client.chat.completions.create(model="a", messages=HI, **kw),
        "completions": lambda **kw: client.completions.create(model="a", prompt="Hi", **kw),
        "responses": lambda **kw: client.responses.create(model="a", input="Hi", **kw),
    }[route]
    with pytest.raises(openai.BadRequestError) as e:
        call(**{field: value})
    assert _err(e)["param"] == field and repr(value) in _err(e)["message"], _err(e)
    assert len(policy.seen) == before  # nothing generated
    call(**{field: 2.0 if field == "temperature" else 1.0})  # the bounds themselves are OpenAI's, accepted
    assert getattr(policy.seen[-1][0], field) == (2.0 if field == "temperature" else 1.0)


def test_responses_metadata_over_openais_limits_is_refused_naming_it(gateway):
    """``metadata`` is echoed back: OpenAI's limits (16 pairs, keys of 64 characters, values of 512) hold, so a
    client never stores more than OpenAI's API would take; the limits themselves are accepted."""
    root, *_ = gateway
    client = _openai(root)
    at_limits = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    assert client.responses.create(model="a", input="Hi", metadata=at_limits).metadata == at_limits
    for bad in ({"k" * 65: "v"}, {"k": "v" * 513}, {f"k{i}": "v" for i in range(17)}):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="a", input="Hi", metadata=bad)
        assert _err(e)["param"].startswith("metadata"), _err(e)


def test_anthropic_sampling_fields_outside_anthropics_ranges_are_refused_naming_them(gateway):
    root, policy, *_ = gateway
    client = anthropic.Anthropic(base_url=root, api_key=TOKEN, max_retries=0, timeout=30)
    for field, value in (("temperature", 1.5), ("temperature", -0.5), ("top_p", 1.2), ("top_k", -1)):
        with pytest.raises(anthropic.BadRequestError) as e:  # this client sends them with extra_body only
            client.messages.create(model="a", max_tokens=8, messages=HI, extra_body={field: value})
        assert _err(e)["param"] == field and repr(value) in _err(e)["message"], _err(e)
    client.messages.create(model="a", max_tokens=8, messages=HI, extra_body={"temperature": 1.0, "top_k": 0})
    assert policy.seen[-1][0].temperature == 1.0
    client.messages.create(model="a", max_tokens=8, messages=HI, extra_body={"seed": 99})  # the extension
    assert policy.seen[-1][0].seed == 99
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="a", max_tokens=8, messages=HI, extra_body={"seed": "99"})
    assert _err(e)["param"] == "seed", _err(e)


def test_a_chat_messages_name_reaches_the_chat_template(gateway):
    root, policy, *_ = gateway
    messages = [
        {"role": "system", "content": "Two players.", "name": "referee"},
        {"role": "user", "content": "I bid 3.", "name": "alice"},
        {"role": "user", "content": "I bid 4.", "name": "bob"},
    ]
    _openai(root).chat.completions.create(model="a", messages=messages)
    prompt = policy.seen[-1][1]
    assert "system (referee): Two players." in prompt
    assert "user (alice): I bid 3." in prompt and "user (bob): I bid 4." in prompt


def test_a_report_naming_a_group_no_call_carried_is_refused_naming_it(gateway):
    root, _, sink, grpc_address = gateway
    head = {"Authorization": f"Bearer {TOKEN}"}
    _openai(root, "gr-1").chat.completions.create(
        model="a", messages=HI, extra_headers={"X-Marti-Group": "q-7"}
    )
    _openai(root, "gr-2").chat.completions.create(model="a", messages=HI)  # no group with its calls
    url = f"{root}/v1/episodes/gr-2/reward"
    r = httpx.post(url, json={"rewards": {"a": 1.0}, "group_id": "q7", "group_size": 2}, headers=head)
    err = r.json()["error"]
    assert r.status_code == 404 and err["param"] == "group_id" and "'q7'" in err["message"], r.text
    before = len(sink)
    r = httpx.post(url, json={"rewards": {"a": 1.0}, "group_id": "q-7", "group_size": 2}, headers=head)
    assert r.status_code == 200 and r.json()["released"] == 0, (
        r.text
    )  # held with the group gr-1's calls carried
    r = httpx.post(
        f"{root}/v1/episodes/gr-1/reward", json={"rewards": {"a": 0.0}, "group_size": 2}, headers=head
    )
    assert r.status_code == 200 and r.json()["released"] == 2, r.text
    assert {ep["a"].group_id for ep in sink[before:]} == {"q-7"}
    with marti.InferenceClient(grpc_address, token=TOKEN) as rpc:  # the SDK raises the matching error
        rpc.generate("a", HI, max_tokens=2, episode_id="gr-3")
        with pytest.raises(NotFoundError, match="group_id 'q8' names no group"):
            rpc.report_reward("gr-3", {"a": 1.0}, group_id="q8")
        assert rpc.report_reward("gr-3", {"a": 1.0}, group_id="q-7").released == 1


@pytest.mark.parametrize(
    ("route", "extra", "param"),
    [
        ("chat", {"presence_penalty": 1.5}, "presence_penalty"),
        ("chat", {"frequency_penalty": -1.0}, "frequency_penalty"),
        ("chat", {"logit_bias": {"5": 100}}, "logit_bias"),
        ("chat", {"repetition_penalty": 1.3}, "repetition_penalty"),
        ("chat", {"min_p": 0.2}, "min_p"),
        ("chat", {"reasoning_effort": "high"}, "reasoning_effort"),
        ("chat", {"web_search_options": {}}, "web_search_options"),
        ("chat", {"modalities": ["text", "audio"]}, "modalities"),
        ("chat", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ("completions", {"presence_penalty": 0.5}, "presence_penalty"),
        ("completions", {"logit_bias": {"1": -100}}, "logit_bias"),
        ("responses", {"top_k": 5}, "top_k"),
        ("responses", {"stop": ["\n"]}, "stop"),
        ("responses", {"n": 3}, "n"),
        ("responses", {"frequency_penalty": 0.5}, "frequency_penalty"),
    ],
)
def test_a_field_the_engine_does_not_apply_is_refused_unless_neutral(gateway, route, extra, param):
    root, policy, *_ = gateway
    client, before = _openai(root), len(policy.seen)
    call = {
        "chat": lambda kw: client.chat.completions.create(model="a", messages=HI, extra_body=kw),
        "completions": lambda kw: client.completions.create(model="a", prompt="Hi", extra_body=kw),
        "responses": lambda kw: client.responses.create(model="a", input="Hi", extra_body=kw),
    }[route]
    with pytest.raises(openai.BadRequestError) as e:
        call(extra)
    assert _err(e)["param"] == param and repr(extra[param])[:20] in _err(e)["message"], _err(e)
    assert len(policy.seen) == before
    neutral = {"logit_bias": {}, "repetition_penalty": 1.0, "modalities": ["text"], "stop": [], "n": 1}
    if param not in ("reasoning_effort", "web_search_options", "audio"):
        call({param: neutral.get(param, 0)})  # the value that changes nothing passes
        assert len(policy.seen) == before + 1


def test_message_fields_that_would_vanish_from_the_history_are_refused_or_rendered(gateway):
    root, policy, *_ = gateway
    client, before = _openai(root), len(policy.seen)
    said = {"role": "assistant", "content": None}
    for field, value in (
        ("function_call", {"name": "f", "arguments": "{}"}),
        ("audio", {"id": "audio_1"}),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="a", messages=[*HI, {**said, field: value}, *HI])
        assert _err(e)["param"] == f"messages[1].{field}", _err(e)
    assert len(policy.seen) == before
    refused = {**said, "refusal": "I cannot help with that."}
    client.chat.completions.create(model="a", messages=[*HI, refused, {**refused, "content": "Sorry."}, *HI])
    assert (
        "assistant: I cannot help with that.<|im_end|>" in policy.seen[-1][1]
    )  # rendered as content, not lost
    assert "assistant: Sorry.\nI cannot help with that.<|im_end|>" in policy.seen[-1][1]


def test_anthropic_server_tool_fields_are_refused(gateway):
    root, *_ = gateway
    client = anthropic.Anthropic(base_url=root, api_key=TOKEN, max_retries=0, timeout=30)
    for field, value in (
        ("mcp_servers", [{"type": "url", "url": "https://x", "name": "x"}]),
        ("container", "c1"),
    ):
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model="a", max_tokens=8, messages=HI, extra_body={field: value})
        assert _err(e)["param"] == field, _err(e)


def test_the_reward_route_reads_the_id_headers_a_client_sends_with_its_calls(gateway):
    root, _, sink, _ = gateway
    head = {"Authorization": f"Bearer {TOKEN}"}
    _openai(root, "hd-1").chat.completions.create(
        model="a", messages=HI, extra_headers={"X-Marti-Group": "q-h"}
    )
    _openai(root, "hd-2").chat.completions.create(model="a", messages=HI)
    url = f"{root}/v1/episodes/hd-2/reward"
    for headers, param in (
        ({"X-Marti-Group": "q-other"}, "X-Marti-Group"),
        ({"X-Marti-Episode": "hd-1"}, "X-Marti-Episode"),
    ):
        r = httpx.post(url, json={"rewards": {"a": 1.0}, "group_id": "q-h"}, headers={**head, **headers})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    both = {**head, "X-Marti-Group": "q-h", "X-Marti-Episode": "hd-2"}
    r = httpx.post(url, json={"rewards": {"a": 1.0}, "group_size": 2}, headers=both)  # the header's group
    assert r.status_code == 200 and r.json()["released"] == 0, r.text
    r = httpx.post(
        f"{root}/v1/episodes/hd-1/reward", json={"rewards": {"a": 0.0}, "group_size": 2}, headers=head
    )
    assert r.status_code == 200 and r.json()["released"] == 2, r.text
    assert [ep["a"].group_id for ep in sink[-2:]] == ["q-h", "q-h"]
