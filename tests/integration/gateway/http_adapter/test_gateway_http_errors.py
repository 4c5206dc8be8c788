"""OpenAI-shaped errors of the HTTP adapter over the tiny models: bad requests get JSON 400s naming the field,
the server survives malformed bodies, unexpected errors are 500s without details, and an empty token is refused."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from services.gateway.http.app import build_app
from tests.integration.gateway.http_adapter.http_gateway import (
    MAX_QUEUE,
    MSG,
    auth,
    error_of,
)


def test_openai_errors(client, served):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nobody", messages=MSG, max_tokens=2)
    assert "nobody" in error_of(e)["message"] and error_of(e)["type"] == "not_found_error"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="planner@7", messages=MSG, max_tokens=2)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="planner", prompt="word " * 200, max_tokens=4)
    assert "exceeds" in error_of(e)["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="planner", messages=[{"role": "user", "content": "x " * 200}])
    assert error_of(e)["param"] == "messages"
    wrong = openai.OpenAI(base_url=served.base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    with pytest.raises(openai.BadRequestError) as e:  # it can never fit: not 429, which clients retry
        client.chat.completions.create(model="planner", messages=MSG, max_tokens=2, n=MAX_QUEUE + 1)
    assert f"n is {MAX_QUEUE + 1}, more than gateway.max_queue ({MAX_QUEUE})" in error_of(e)["message"]
    assert error_of(e)["param"] == "n" and "retry-after" not in e.value.response.headers
    for kw, param in [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": None, "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"top_logprobs": 2, "logprobs": True}, "top_logprobs"),
        ({"stop": [""]}, "stop"),
        ({"extra_body": {"top_k": -2}}, "top_k"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="planner", messages=MSG, **{"max_tokens": 2, **kw})
        assert error_of(e)["param"] == param and param in error_of(e)["message"], (kw, error_of(e))
    with pytest.raises(openai.BadRequestError) as e:  # one would win silently over the other
        client.chat.completions.create(model="planner", messages=MSG, max_tokens=2, max_completion_tokens=6)
    assert "max_tokens (2) and max_completion_tokens (6) disagree" in error_of(e)["message"]
    assert error_of(e)["param"] == "max_completion_tokens"
    same = client.chat.completions.create(
        model="planner", messages=MSG, max_tokens=2, max_completion_tokens=2
    )
    assert same.usage.completion_tokens <= 2
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="planner", messages=MSG, max_tokens=2, n=99)
    assert "n must be" in error_of(e)["message"] and error_of(e)["param"] == "n"
    # errors of the gateway core name the request field too
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="planner", prompt="word " * 60, max_tokens=100)
    assert "exceeds" in error_of(e)["message"] and error_of(e)["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="planner", messages=MSG, max_completion_tokens=200)
    assert error_of(e)["param"] == "max_completion_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="planner", prompt=[10**7], max_tokens=2)
    assert "vocabulary" in error_of(e)["message"] and error_of(e)["param"] == "prompt"
    limits = served.gateway.limits
    for stop in ([f"s{i}" for i in range(limits.max_stop + 1)], ["z" * (limits.max_stop_chars + 1)]):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="planner", messages=MSG, max_tokens=2, stop=stop)
        assert "gateway.max_stop" in error_of(e)["message"] and error_of(e)["param"] == "stop", error_of(e)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="planner", prompt="hi", max_tokens=2, logprobs=3)
    assert error_of(e)["param"] == "logprobs"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="planner", prompt=["a", "b"], max_tokens=2)
    assert error_of(e)["param"] == "prompt"


def test_hints_and_neutral_penalties_change_nothing_and_echo_is_refused(client):
    """OpenAI clients send a user, neutral penalties and the like: accepted, the same seeded answer (a penalty
    that would change the sampling is refused: test_gateway_request_fields.py); ``echo`` is refused. (Tools are
    rendered and parsed: tests/integration/gateway/apis/test_gateway_tools.py.)"""
    kw = {"model": "planner", "messages": MSG, "max_tokens": 6, "seed": 4}
    plain = client.chat.completions.create(**kw)
    extra = client.chat.completions.create(
        **kw, presence_penalty=0, frequency_penalty=0.0, logit_bias={}, user="u-1", service_tier="auto",
        response_format={"type": "text"},
    )  # fmt: skip
    assert extra.choices[0].model_extra["token_ids"] == plain.choices[0].model_extra["token_ids"]
    assert extra.model_extra["prompt_token_ids"] == plain.model_extra["prompt_token_ids"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="planner", prompt="hi", max_tokens=2, echo=True)
    assert error_of(e)["param"] == "echo"


def test_malformed_requests_get_json_400s_and_the_server_survives(served, client):
    url = served.base + "/v1/chat/completions"
    h = {**auth(), "Content-Type": "application/json"}

    def post(content: bytes | str) -> httpx.Response:
        return httpx.post(url, content=content, headers=h)

    bad = post(b"{not json")
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    r = post(json.dumps({"model": "planner", "messages": MSG, "temperature": "hot"}))
    assert (
        r.status_code == 400
        and r.json()["error"]["param"] == "temperature"
        and "hot" in r.json()["error"]["message"]
    )
    r = post(json.dumps({"model": "planner"}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    parts = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    r = post(json.dumps({"model": "planner", "messages": parts}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0].type"
    assert "image_url" in r.json()["error"]["message"]
    # roles are OpenAI's; content may be null (or absent) only in an assistant message
    for messages, param, text in [
        ([{"role": "robot", "content": "hi"}], "messages[0].role", "must be one of"),
        ([{"role": "function", "content": "hi"}], "messages[0].role", "must be one of"),
        ([*MSG, {"role": "user", "content": None}], "messages[1].content", "content is required in a 'user'"),
        ([{"role": "system"}, *MSG], "messages[0].content", "content is required in a 'system'"),
        ([*MSG, {"role": "assistant", "content": "x"}, {"role": "tool", "content": None}], "messages[2].content",
         "'tool'"),
    ]:  # fmt: skip
        r = post(json.dumps({"model": "planner", "messages": messages, "max_tokens": 1}))
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param and text in err["message"], (messages, err)
        assert err["type"] == "invalid_request_error"
    tool_call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    null_assistant = [*MSG, {"role": "assistant", "content": None, "tool_calls": [tool_call]},
                      {"role": "tool", "content": "42", "tool_call_id": "c1"}]  # fmt: skip
    assert (
        post(json.dumps({"model": "planner", "messages": null_assistant, "max_tokens": 1})).status_code == 200
    )
    # developer (OpenAI's successor of system) is rendered as system
    dev, sys_ = (
        post(
            json.dumps(
                {"model": "planner", "messages": [{"role": r, "content": "be brief"}, *MSG], "max_tokens": 1}
            )
        )
        for r in ("developer", "system")
    )
    assert dev.status_code == 200 and dev.json()["prompt_token_ids"] == sys_.json()["prompt_token_ids"]
    r = post(json.dumps([1, 2]))
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(url, json={"model": "planner", "messages": MSG}, headers={"X-Marti-Episode": "e"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.get(served.base + "/v1/nope", headers=auth())
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.post(
        served.base + "/episodes/a/v1/chat/completions",
        json={"model": "planner", "messages": MSG, "max_tokens": 2},
        headers={**auth(), "X-Marti-Episode": "b"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "episode_id"
    r = httpx.post(served.base + "/v1/episodes/x/reward", json={"rewards": {"nobody": 1.0}}, headers=auth())
    assert r.status_code == 400 and "nobody" in r.json()["error"]["message"]
    # a lone surrogate escape (not UTF-8) anywhere in the strings is refused, naming the field
    lone = "x\\ud800y"  # JSON text: the escape itself
    for path, raw, param in [
        ("/v1/chat/completions", f'{{"model": "planner", "messages": [{{"role": "user", "content": "{lone}"}}]}}',
         "messages[0].content"),
        ("/v1/chat/completions",
         f'{{"model": "planner", "messages": [{{"role": "user", "content": [{{"type": "text", "text": "{lone}"}}]}}]}}',
         "messages[0].content"),
        ("/v1/chat/completions", f'{{"model": "planner", "messages": [{{"role": "{lone}", "content": "hi"}}]}}',
         "messages[0].role"),
        ("/v1/chat/completions", f'{{"model": "{lone}", "messages": [{{"role": "user", "content": "hi"}}]}}', "model"),
        ("/v1/completions", f'{{"model": "planner", "prompt": "{lone}"}}', "prompt"),
        ("/v1/completions", f'{{"model": "planner", "prompt": "hi", "stop": ["ok", "{lone}"]}}', "stop"),
        ("/v1/episodes/x/reward", f'{{"rewards": {{}}, "group_id": "{lone}"}}', "group_id"),
    ]:  # fmt: skip
        r = httpx.post(served.base + path, content=raw.encode(), headers=h)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param and "lone surrogate" in err["message"], (
            raw,
            err,
        )
    r = httpx.post(
        served.base + "/v1/episodes/x/reward", content=f'{{"rewards": {{"{lone}": 1}}}}', headers=h
    )
    assert r.status_code == 400 and "lone surrogate" in r.json()["error"]["message"]  # the param is escaped
    ok = client.chat.completions.create(model="planner", messages=MSG, max_tokens=2)
    assert ok.choices[0].model_extra["token_ids"]


def test_unexpected_errors_are_500_without_details(served, client, monkeypatch):
    def boom() -> dict:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(served.gateway, "stats", boom)
    r = httpx.get(served.base + "/v1/gateway/stats", headers=auth())
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "secret" not in r.text and "Traceback" not in r.text and "ref " in r.json()["error"]["message"]
    monkeypatch.undo()
    assert client.chat.completions.create(model="planner", messages=MSG, max_tokens=2).choices


def test_build_app_refuses_an_empty_token(served):
    from marti.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        build_app(served.gateway, "")
