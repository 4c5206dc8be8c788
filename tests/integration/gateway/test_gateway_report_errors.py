"""Reward reports and errors that name the mistake, over a real port (issue 29 items 6, 8, 14 and 15).

One GatewayServer over a scripted one-agent backend whose policy version the test moves (as a trainer's update
does), with a staleness bound of 0, driven by the official ``openai`` client, by plain HTTP and by the SDK's
gRPC client: a report of calls sampled before an update says they are stale (the HTTP answer's ``stale``, the
gRPC ``RewardReceipt.stale``); a typo in a report's keys is refused naming it; an empty
``X-Marti-Episode`` header is refused; errors about a field name it in ``param``; unknown routes (``/v1/responses``)
say what exists; a report posted under a traced base URL is taken there; ``response_format`` is refused.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from marti.clients.inference import InferenceClient
from marti.types.inference import Generation, RewardReceipt, StaleCalls
from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from tests.unit.gateway.test_gateway_core import FakeBackend

TOKEN = "report-errors-token"
MSG = [{"role": "user", "content": "hi"}]


class _Versioned(FakeBackend):
    """:class:`FakeBackend` whose agent ``a`` is at policy version :attr:`version` (moved by the test)."""

    version = 0

    def versions(self):
        return {"a": self.version}

    def resident_versions(self, agent):
        return [self.version]

    def generate(self, agent, prompts, sampling, version):
        return [Generation(p, [p[-1] + 1], [-1.0], "t", "stop", self.version, agent) for p in prompts]


@pytest.fixture(scope="module")
def served():
    """``(server, backend, sink)``: a started gateway (HTTP and gRPC) with a staleness bound of 0 for agent ``a``."""
    backend, sink = _Versioned(), []
    gateway = Gateway(backend, GatewayLimits(max_wait_ms=1), sink=sink.append, max_staleness={"a": 0})
    server = GatewayServer(gateway, token=TOKEN)
    server.start()
    yield server, backend, sink
    server.stop()


@pytest.fixture(scope="module")
def gw(served):
    """``(root_url, backend, sink)``: the HTTP root of :func:`served`."""
    server, backend, sink = served
    return server.http_url.removesuffix("/v1"), backend, sink


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key=TOKEN, max_retries=0, timeout=30)


def _post(url: str, body: dict) -> httpx.Response:
    return httpx.post(url, json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)


def _play(root: str, episode: str, group: str = "") -> None:
    base = f"{root}/episodes/{episode}" + (f"/groups/{group}" if group else "") + "/v1"
    _client(base).chat.completions.create(model="a", messages=MSG, max_tokens=1)


def test_a_report_of_calls_sampled_before_an_update_says_they_are_stale(gw):
    root, backend, _ = gw
    backend.version = 3
    _play(root, "st-old")
    _play(root, "st-new")
    backend.version = 4  # an update landed: st-old's calls (v3) are past the bound of 0
    r = _post(f"{root}/v1/episodes/st-old/reward", {"rewards": {"a": 1.0}})
    assert r.status_code == 200, r.text
    assert r.json()["stale"] == [
        {"episode_id": "st-old", "agent": "a", "policy_version": 3, "current_version": 4,
         "max_staleness": 0, "stale_calls": 1},
    ]  # fmt: skip
    _play(root, "st-fresh")
    fresh = _post(f"{root}/v1/episodes/st-fresh/reward", {"rewards": {"a": 1.0}})
    assert fresh.status_code == 200 and "stale" not in fresh.json(), fresh.text
    stats = httpx.get(f"{root}/v1/gateway/stats", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert stats["stale_reported"] == 1
    _post(f"{root}/v1/episodes/st-new/reward", {"rewards": {"a": 1.0}})


def test_a_grpc_report_of_calls_sampled_before_an_update_says_they_are_stale(served):
    server, backend, _ = served
    with InferenceClient(server.grpc_address, token=TOKEN) as client:
        backend.version = 7
        for ep in ("gs-old", "gs-held"):
            client.generate("a", MSG, max_tokens=1, episode_id=ep, group_id=ep)
        backend.version = 8  # an update landed: the calls sampled by v7 are past the bound of 0
        receipt = client.report_reward("gs-old", {"a": 1.0})
        assert receipt.released == 1
        assert receipt.stale == (StaleCalls("gs-old", "a", 7, 8, 0, 1),)
        held = client.report_reward("gs-held", {"a": 1.0}, group_size=2)  # waits for its group, already stale
        assert held.released == 0 and held.stale == (StaleCalls("gs-held", "a", 7, 8, 0, 1),)
        client.generate("a", MSG, max_tokens=1, episode_id="gs-fresh")
        assert client.report_reward("gs-fresh", {"a": 1.0}) == RewardReceipt(1, 0)  # no stale entry


def test_a_report_with_an_unknown_key_is_refused_naming_it_and_changes_nothing(gw):
    root, _, sink = gw
    _play(root, "typo", "q1")
    url = f"{root}/v1/episodes/typo/reward"
    r = _post(url, {"reward": {"a": 1.0}})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "reward", r.text
    assert "'reward' (did you mean 'rewards'?)" in err["message"]
    r = _post(url, {"rewards": {"a": 1.0}, "groupsize": 2, "group": "q1"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "groupsize", r.text
    assert (
        "'groupsize' (did you mean 'group_size'?)" in err["message"]
        and "'group' (did you mean" in err["message"]
    )
    before = len(sink)
    ok = _post(url, {"rewards": {"a": 1.0}, "group_id": "q1"})  # the episode stayed open
    assert ok.status_code == 200 and ok.json()["released"] == 1 and len(sink) == before + 1, ok.text
    assert sink[-1]["a"].episode_return == 1.0


def test_an_empty_episode_header_is_refused_naming_it(gw):
    root, _, _ = gw
    client = _client(f"{root}/v1")
    for header in ("X-Marti-Episode", "X-Marti-Group", "Idempotency-Key"):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="a", messages=MSG, max_tokens=1, extra_headers={header: ""})
        err = e.value.body
        assert err["param"] == header and f"header {header} is empty" in err["message"], err


def test_errors_about_a_field_name_it_in_param(gw):
    root, _, _ = gw
    client = _client(f"{root}/v1")
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nobody", messages=MSG, max_tokens=1)
    assert e.value.body["param"] == "model", e.value.body
    _play(root, "params")
    url = f"{root}/v1/episodes/params/reward"
    bad = _post(url, {"rewards": {"a": 1.0}, "call_rewards": {"no-such-call": 1.0}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "call_rewards", bad.text
    bad = _post(url, {"rewards": {"zed": 1.0}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "rewards", bad.text
    gone = _post(f"{root}/v1/episodes/never-played/reward", {"rewards": {"a": 1.0}})
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "episode_id", gone.text
    assert _post(url, {"rewards": {"a": 1.0}}).status_code == 200


def test_unknown_routes_say_what_exists(gw):
    root, _, _ = gw
    r = httpx.post(f"{root}/v1/embeddings", json={}, headers={"Authorization": f"Bearer {TOKEN}"})
    msg = r.json()["error"]["message"]
    assert r.status_code == 404 and "no route POST /v1/embeddings" in msg, msg
    assert "POST /v1/episodes/{episode_id}/reward" in msg and "GET /v1/models" in msg
    assert "POST /v1/responses" in msg and "POST /v1/chat/completions" in msg


def test_a_reward_posted_under_the_traced_base_url_is_taken_with_its_group(gw):
    root, _, sink = gw
    base = f"{root}/episodes/ep-b/groups/q-b/v1"
    _client(base).chat.completions.create(model="a", messages=MSG, max_tokens=1)
    wrong = _post(f"{base}/episodes/other/reward", {"rewards": {"a": 1.0}})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "episode_id", wrong.text
    clash = _post(f"{base}/episodes/ep-b/reward", {"rewards": {"a": 1.0}, "group_id": "q-x"})
    assert clash.status_code == 400 and clash.json()["error"]["param"] == "group_id", clash.text
    r = _post(f"{base}/episodes/ep-b/reward", {"rewards": {"a": 0.5}, "group_size": 1})
    assert r.status_code == 200 and r.json()["released"] == 1, r.text
    assert (sink[-1]["a"].episode_id, sink[-1]["a"].group_id) == ("ep-b", "q-b")
    assert sink[-1]["a"].group_size == 1


def test_response_format_other_than_text_is_refused(gw):
    root, _, _ = gw
    client = _client(f"{root}/v1")
    for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="a", messages=MSG, max_tokens=1, response_format=fmt)
        assert e.value.body["param"] == "response_format" and "not supported" in e.value.body["message"]
    ok = client.chat.completions.create(
        model="a", messages=MSG, max_tokens=1, response_format={"type": "text"}
    )
    assert ok.choices[0].message.content == "t"


def _headers(**extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}", **extra}


def _error(r: httpx.Response) -> dict:
    body = r.json()
    return body["error"]


def test_a_group_conflict_names_where_the_group_came_from(gw):
    root, _, _ = gw
    _play(root, "gc-body", "g1")
    r = _post(f"{root}/v1/episodes/gc-body/reward", {"rewards": {"a": 1.0}, "group_id": "other"})
    assert r.status_code == 409 and _error(r)["param"] == "group_id", r.text
    client = _client(f"{root}/v1")
    client.chat.completions.create(
        model="a",
        messages=MSG,
        max_tokens=1,
        extra_headers={"X-Marti-Episode": "gc-head", "X-Marti-Group": "gA"},
    )
    with pytest.raises(openai.ConflictError) as e:
        client.chat.completions.create(
            model="a",
            messages=MSG,
            max_tokens=1,
            extra_headers={"X-Marti-Episode": "gc-head", "X-Marti-Group": "gB"},
        )
    assert e.value.body["param"] == "X-Marti-Group", e.value.body
    _play(root, "gc-path", "gA")
    with pytest.raises(openai.ConflictError) as e:
        _play(root, "gc-path", "gB")
    assert e.value.body["param"] == "group_id", e.value.body
    for ep, group in (("gc-body", "g1"), ("gc-head", "gA"), ("gc-path", "gA")):
        assert (
            _post(f"{root}/v1/episodes/{ep}/reward", {"rewards": {"a": 1.0}, "group_id": group}).status_code
            == 200
        )


def test_an_idempotency_key_reused_for_another_request_names_the_key(gw):
    root, _, _ = gw
    client = _client(f"{root}/v1")
    headers = {"X-Marti-Episode": "idem", "Idempotency-Key": "k1"}
    for _ in range(2):
        client.chat.completions.create(model="a", messages=MSG, max_tokens=1, extra_headers=headers)
    with pytest.raises(openai.ConflictError) as e:
        client.chat.completions.create(model="a", messages=MSG, max_tokens=2, extra_headers=headers)
    assert e.value.body["param"] == "Idempotency-Key", e.value.body
    assert _post(f"{root}/v1/episodes/idem/reward", {"rewards": {"a": 1.0}}).status_code == 200


#: One request per inference route (the Anthropic route takes the same Bearer token).
ROUTES = {
    "/v1/chat/completions": {"model": "a", "messages": MSG, "max_tokens": 1},
    "/v1/completions": {"model": "a", "prompt": "hi", "max_tokens": 1},
    "/v1/responses": {"model": "a", "input": "hi", "max_output_tokens": 1},
    "/v1/messages": {"model": "a", "messages": MSG, "max_tokens": 1},
}


def test_a_group_without_an_episode_is_refused_on_every_route(gw):
    root, _, _ = gw
    for route, body in ROUTES.items():
        r = httpx.post(
            f"{root}{route}", json=body, headers=_headers(**{"X-Marti-Group": "lonely"}), timeout=30
        )
        err = _error(r)
        assert r.status_code == 400 and err["param"] == "X-Marti-Group", (route, r.text)
        assert "X-Marti-Episode" in err["message"]
        ok = httpx.post(f"{root}{route}", json=body, headers=_headers(), timeout=30)
        assert ok.status_code == 200, (route, ok.text)


def test_openai_fields_that_would_change_the_answer_are_refused_naming_them(gw):
    root, _, _ = gw
    client = _client(f"{root}/v1")
    fn = {"name": "f", "parameters": {"type": "object", "properties": {}}}
    for extra, param, hint in (
        ({"functions": [fn]}, "functions", "tools"),
        ({"function_call": {"name": "f"}}, "function_call", "tool_choice"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="a", messages=MSG, max_tokens=1, extra_body=extra)
        assert e.value.body["param"] == param and hint in e.value.body["message"], e.value.body
    for extra, param, hint in (
        ({"suffix": "end"}, "suffix", "fill-in-the-middle"),
        ({"best_of": 2}, "best_of", "n"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="a", prompt="hi", max_tokens=1, extra_body=extra)
        assert e.value.body["param"] == param and hint in e.value.body["message"], e.value.body
    harmless = client.chat.completions.create(
        model="a", messages=MSG, max_tokens=1, extra_body={"function_call": "auto", "user": "u"}
    )
    assert harmless.choices[0].message.content == "t"
    assert (
        client.completions.create(model="a", prompt="hi", max_tokens=1, best_of=1, suffix="").choices[0].text
        == "t"
    )


def test_a_text_part_without_string_text_names_the_part(gw):
    root, _, _ = gw
    client = _client(f"{root}/v1")
    for part, said in (
        ({"type": "text"}, "has no text"),
        ({"type": "text", "text": 5}, "has text 5, of type int"),
    ):
        content = [{"type": "text", "text": "a"}, part]
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(
                model="a", messages=[{"role": "user", "content": content}], max_tokens=1
            )
        assert e.value.body["param"] == "messages[0].content[1].text" and said in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="a", messages=[{"role": "user", "content": [{"type": "image_url"}]}], max_tokens=1
        )
    assert e.value.body["param"] == "messages[0].content[0].type", e.value.body


def test_an_encoded_slash_in_a_path_id_is_refused_naming_the_id(gw):
    root, _, _ = gw
    body = ROUTES["/v1/chat/completions"]
    for path, param in (
        ("/episodes/a%2Fb/v1/chat/completions", "episode_id"),
        ("/episodes/ok/groups/g%2f1/v1/chat/completions", "group_id"),
        ("/v1/episodes/a%2Fb/reward", "episode_id"),
    ):
        r = httpx.post(f"{root}{path}", json=body, headers=_headers(), timeout=30)
        err = _error(r)
        assert r.status_code == 400 and err["param"] == param and "'/'" in err["message"], (path, r.text)


def test_a_tool_in_another_apis_shape_is_refused_showing_the_routes_shape(gw):
    root, _, _ = gw
    params = {"type": "object", "properties": {}}
    chat_tool = {"type": "function", "function": {"name": "f", "parameters": params}}
    flat_tool = {"type": "function", "name": "f", "parameters": params}
    claude_tool = {"name": "f", "input_schema": params}
    cases = [  # route, body, param, what the message shows
        (
            "/v1/responses",
            {"input": "hi", "tools": [chat_tool]},
            "tools[0]",
            '{"type": "function", "name": ...',
        ),
        (
            "/v1/responses",
            {"input": "hi", "tools": [claude_tool]},
            "tools[0]",
            '{"type": "function", "name": ...',
        ),
        (
            "/v1/responses",
            {
                "input": "hi",
                "tools": [flat_tool],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
            "tool_choice",
            '{"type": "function", "name": ...}',
        ),
        ("/v1/messages", {"messages": MSG, "tools": [chat_tool]}, "tools[0]", '"input_schema": {...}'),
        ("/v1/messages", {"messages": MSG, "tools": [flat_tool]}, "tools[0]", '"input_schema": {...}'),
        (
            "/v1/messages",
            {"messages": MSG, "tools": [claude_tool], "tool_choice": {"type": "function", "name": "f"}},
            "tool_choice",
            '{"type": "tool", "name": ...}',
        ),
        (
            "/v1/chat/completions",
            {"messages": MSG, "tools": [flat_tool]},
            "tools[0]",
            '"function": {"name": ...',
        ),
        (
            "/v1/chat/completions",
            {"messages": MSG, "tools": [claude_tool]},
            "tools[0]",
            '"function": {"name": ...',
        ),
        (
            "/v1/chat/completions",
            {"messages": MSG, "tools": [chat_tool], "tool_choice": {"type": "function", "name": "f"}},
            "tool_choice",
            '{"type": "function", "function": {"name": ...}}',
        ),
    ]
    for route, body, param, shape in cases:
        r = httpx.post(
            f"{root}{route}", json={"model": "a", "max_tokens": 1, **body}, headers=_headers(), timeout=30
        )
        err = _error(r)
        assert r.status_code == 400 and err["param"] == param, (route, body, r.text)
        assert shape in err["message"] and "looks like" in err["message"], (route, err["message"])


def _raw(url: str, text: str) -> httpx.Response:
    """POST ``text`` as a JSON body as written (clients cannot write NaN)."""
    return httpx.post(url, content=text, headers=_headers(**{"Content-Type": "application/json"}), timeout=30)


def test_a_non_finite_number_in_a_body_is_refused_naming_where_before_anything_is_recorded(gw):
    root, _, _ = gw
    prefix = f"{root}/episodes/nan1/groups/NG"
    tool = '{"type":"function","name":"f","parameters":{"type":"object","x":NaN}}'
    call = '{"id":"c1","type":"function","function":{"name":"f","arguments":"{\\"x\\": Infinity}"}}'
    cases = [
        ("/v1/responses", f'{{"model":"a","input":"x","max_output_tokens":2,"tools":[{tool}]}}',
         "tools[0].parameters.x", "NaN"),
        ("/v1/responses", f'{{"model":"a","input":"x","stream":true,"tools":[{tool}]}}', "tools[0].parameters.x",
         "NaN"),
        ("/v1/chat/completions", '{"model":"a","messages":[{"role":"user","content":"hi"}],"temperature":1e999}',
         "temperature", "1e999"),
        ("/v1/chat/completions", '{"model":"a","messages":[{"role":"user","content":"hi"},'
         f'{{"role":"assistant","content":null,"tool_calls":[{call}]}},'
         '{"role":"tool","tool_call_id":"c1","content":"1"}]}',
         "messages[1].tool_calls[0].function.arguments", "Infinity"),
        ("/v1/responses", '{"model":"a","input":[{"type":"function_call","call_id":"c1","name":"f",'
         '"arguments":"{\\"x\\": NaN}"},{"type":"function_call_output","call_id":"c1","output":"1"}]}',
         "input[0].arguments", "NaN"),
        ("/v1/completions", '{"model":"a","prompt":"hi","max_tokens":1,"top_p":-Infinity}', "top_p", "-Infinity"),
        ("/v1/messages", '{"model":"a","max_tokens":1,"messages":[{"role":"user","content":"hi"},'
         '{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"x":[NaN]}}]},'
         '{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"1"}]}]}',
         "messages[1].content[0].input.x[0]", "NaN"),
        ("/v1/episodes/nan1/reward", '{"rewards":{"a":NaN}}', "rewards.a", "NaN"),
    ]  # fmt: skip
    for route, text, param, token in cases:
        r = _raw(prefix + route, text)
        body = r.json()
        assert r.status_code == 400 and body["error"]["param"] == param, (route, r.text)
        assert f"{token} is not a finite number" in body["error"]["message"], (route, r.text)
        assert ("type" in body) == (route == "/v1/messages"), r.text  # Anthropic's shape on its route
    top = _raw(f"{root}/v1/episodes/nan1/reward", "NaN")
    assert top.status_code == 400 and "the request body: NaN" in _error(top)["message"], top.text
    # nothing was generated or recorded for the episode; malformed and mistyped bodies keep their errors
    r = _post(f"{root}/v1/episodes/nan1/reward", {"rewards": {"a": 1.0}})
    assert r.status_code == 404 and "no recorded calls" in _error(r)["message"], r.text
    r = _raw(f"{root}/v1/episodes/nan1/reward", '{"rewards":{"a":"x"}}')
    assert r.status_code == 400 and _error(r)["param"] == "rewards.a", r.text
    r = _raw(f"{root}/v1/episodes/nan1/reward", "{not json")
    assert r.status_code == 400 and "not valid JSON" in _error(r)["message"], r.text


def test_an_empty_group_id_in_a_report_is_refused_naming_it_as_an_empty_header_is(gw):
    root, _, _ = gw
    _play(root, "eg1")
    for url in (f"{root}/v1/episodes/eg1/reward", f"{root}/episodes/eg1/groups/EG/v1/episodes/eg1/reward"):
        r = _post(url, {"rewards": {"a": 1.0}, "group_id": ""})
        assert r.status_code == 400 and _error(r)["param"] == "group_id", r.text
        assert "group_id is empty" in _error(r)["message"], r.text
    ok = _post(f"{root}/v1/episodes/eg1/reward", {"rewards": {"a": 1.0}, "group_id": None})
    assert ok.status_code == 200 and ok.json()["released"] == 1, ok.text  # the refusals changed nothing


def test_an_episode_id_in_a_report_body_is_said_to_belong_in_the_path(gw):
    root, _, _ = gw
    _play(root, "pg1")
    r = _post(f"{root}/v1/episodes/pg1/reward", {"rewards": {"a": 1}, "episode_id": "pg1", "model": "a"})
    err = _error(r)
    assert r.status_code == 400 and err["param"] == "episode_id", r.text
    assert "'episode_id' (it belongs in the path: /v1/episodes/{episode_id}/reward)" in err["message"], r.text
    assert "did you mean 'episode_id'" not in err["message"] and "did you mean 'model'" not in err["message"]
    assert _post(f"{root}/v1/episodes/pg1/reward", {"rewards": {"a": 1}}).status_code == 200


def test_a_group_size_other_than_a_member_reported_while_it_was_open_is_refused_in_either_order(gw):
    root, _, _ = gw
    for ep in ("k1", "k2", "h1", "h2"):
        _play(root, ep, "KG" if ep.startswith("k") else "HG")
    assert _post(f"{root}/v1/episodes/k1/reward", {"rewards": {"a": 1}}).json()["released"] == 1
    r = _post(f"{root}/v1/episodes/k2/reward", {"rewards": {"a": 1}, "group_size": 2})
    assert r.status_code == 400 and _error(r)["param"] == "group_size", r.text
    assert (
        "group 'KG': episode 'k1' of it was reported with no group_size while episode 'k2' was open, and this "
        "report of 'k2' gives group_size 2" in _error(r)["message"]
    ), r.text
    assert (
        _post(f"{root}/v1/episodes/h1/reward", {"rewards": {"a": 1}, "group_size": 2}).json()["released"] == 0
    )
    r = _post(f"{root}/v1/episodes/h2/reward", {"rewards": {"a": 1}})
    assert r.status_code == 400 and "group 'HG' was opened with group_size 2" in _error(r)["message"], r.text
    assert _error(r)["message"].endswith("gives no group_size"), r.text
    for ep, size in (("k2", 0), ("h2", 2)):  # the refusals changed nothing
        assert _post(f"{root}/v1/episodes/{ep}/reward", {"rewards": {"a": 1}, "group_size": size}).json()[
            "released"
        ] == (1 if ep == "k2" else 2)
