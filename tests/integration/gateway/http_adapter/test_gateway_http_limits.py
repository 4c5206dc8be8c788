"""The HTTP adapter's limits and byte handling over the scripted backend (the ``fixed`` fixture): an internal
error keeps the connection, bodies over ``max_request_bytes`` get 413, ids follow ``max_id_chars`` and must be
printable, multi-byte characters stream whole with exact logprob bytes."""

from __future__ import annotations

import json
import logging

import httpx

from tests.integration.gateway.http_adapter.http_gateway import (
    EMOJI_TEXT,
    MAX_ID_CHARS,
    MAX_REQUEST_BYTES,
    MSG,
    auth,
)


def test_an_internal_error_keeps_the_connection_and_logs_once(fixed, caplog):
    http_url, _ = fixed
    caplog.set_level(logging.ERROR)
    with httpx.Client(base_url=http_url, headers=auth(), timeout=30) as c:
        boom = c.post("/completions", json={"model": "a", "prompt": "boom", "max_tokens": 2})
        where = boom.extensions["network_stream"].get_extra_info("client_addr")
        assert boom.status_code == 500 and boom.json()["error"]["type"] == "server_error"
        assert "secret" not in boom.text and boom.headers["content-type"] == "application/json"
        ok = c.post("/completions", json={"model": "a", "prompt": "fine", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == EMOJI_TEXT
        # the same keep-alive connection served both (the server did not drop it after the 500)
        assert ok.extensions["network_stream"].get_extra_info("client_addr") == where
    ref = boom.json()["error"]["message"].split("ref ")[1].split(";")[0]
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and ref in logged[0].getMessage(), [r.getMessage() for r in logged]


def _sized(size: int) -> bytes:
    """A valid completions body of exactly ``size`` bytes."""
    body = {"model": "a", "prompt": "", "max_tokens": 2}
    pad = size - len(json.dumps(body).encode())
    body["prompt"] = "x" * pad
    raw = json.dumps(body).encode()
    assert len(raw) == size
    return raw


def test_request_bodies_over_max_request_bytes_get_413(fixed):
    http_url, _ = fixed
    h = {**auth(), "Content-Type": "application/json"}
    with httpx.Client(base_url=http_url, headers=h, timeout=30) as c:
        assert c.post("/completions", content=_sized(MAX_REQUEST_BYTES)).status_code == 200
        r = c.post("/completions", content=_sized(MAX_REQUEST_BYTES + 1))
        err = r.json()["error"]
        assert r.status_code == 413 and err["type"] == "invalid_request_error"
        assert "gateway.max_request_bytes" in err["message"] and str(MAX_REQUEST_BYTES + 1) in err["message"]
    # without Content-Length (chunked): the bytes are counted as they arrive
    raw = _sized(MAX_REQUEST_BYTES)
    r = httpx.post(http_url + "/completions", content=iter([raw[:1000], raw[1000:]]), headers=h, timeout=30)
    assert r.status_code == 200 and "content-length" not in r.request.headers
    raw = _sized(MAX_REQUEST_BYTES + 1)
    r = httpx.post(http_url + "/completions", content=iter([raw[:1000], raw[1000:]]), headers=h, timeout=30)
    assert r.status_code == 413 and "gateway.max_request_bytes" in r.json()["error"]["message"]
    assert httpx.get(http_url + "/models", headers=auth()).status_code == 200


def test_ids_follow_max_id_chars_on_every_route(fixed):
    http_url, _ = fixed
    base = http_url.removesuffix("/v1")
    body = {"model": "a", "prompt": "hi", "max_tokens": 2}
    ok_id, long_id = "e" * MAX_ID_CHARS, "e" * (MAX_ID_CHARS + 1)

    def post(path: str, headers: dict | None = None, json_body: dict | None = None) -> httpx.Response:
        return httpx.post(
            base + path, json=json_body or body, headers={**auth(), **(headers or {})}, timeout=30
        )

    assert post("/v1/completions", {"X-Marti-Episode": ok_id}).status_code == 200
    assert post(f"/episodes/{ok_id[:-1]}p/groups/{ok_id}/v1/completions").status_code == 200
    for path, headers, param in [
        ("/v1/completions", {"X-Marti-Episode": long_id}, "X-Marti-Episode"),  # the header that carried it
        ("/v1/completions", {"X-Marti-Episode": "e1", "X-Marti-Group": long_id}, "X-Marti-Group"),
        (f"/episodes/{long_id}/v1/completions", None, "episode_id"),
        (f"/episodes/e2/groups/{long_id}/v1/chat/completions", None, "group_id"),
        ("/v1/completions", {"X-Marti-Episode": "a/b"}, "X-Marti-Episode"),  # refused by the core
    ]:
        jb = {"model": "a", "messages": MSG, "max_tokens": 2} if "chat" in path else None
        r = post(path, headers, jb)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (path, r.text)
    r = post(f"/v1/episodes/{long_id}/reward", json_body={"rewards": {}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "episode_id"
    assert "gateway.max_id_chars" in r.json()["error"]["message"]
    r = post("/v1/episodes/e3/reward", json_body={"rewards": {}, "group_id": "g/1"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "group_id"
    r = post(f"/v1/episodes/{ok_id}/reward", json_body={"rewards": {"a": 1.0}})
    assert r.status_code == 200 and r.json()["released"] == 1


def test_header_ids_must_be_printable_ascii_and_path_ids_valid_utf8(fixed):
    http_url, _ = fixed
    base = http_url.removesuffix("/v1")
    body = {"model": "a", "prompt": "hi", "max_tokens": 2}
    h = auth()
    for name in ("X-Marti-Episode", "X-Marti-Group", "Idempotency-Key"):
        for value in ("épisode".encode(), b"ep\tx", b"caf\xe9"):  # UTF-8, a tab, Latin-1
            head = {**h, "X-Marti-Episode": "e-ascii", name: value}
            r = httpx.post(base + "/v1/completions", json=body, headers=head, timeout=30)
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == name, (name, value, r.text)
            assert "printable ASCII" in err["message"] and err["type"] == "invalid_request_error"
    # invalid UTF-8 in a path id is refused (it would decode to U+FFFD: %FF and %FE would be one id)
    for path, param in [
        ("/episodes/%FF/v1/completions", "episode_id"),
        ("/episodes/ok/groups/g%FE/v1/completions", "group_id"),
        ("/v1/episodes/x%C3/reward", "episode_id"),
    ]:
        jb = {"rewards": {}} if path.endswith("reward") else body
        r = httpx.post(base + path, json=jb, headers=h, timeout=30)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param and "not valid UTF-8" in err["message"], r.text
    assert httpx.get(base + "/v1/models/a%FF", headers=h, timeout=30).status_code == 400
    # a non-ASCII id goes in the path as percent-encoded UTF-8, and the report names it the same way
    assert (
        httpx.post(base + "/episodes/%C3%A9p/v1/completions", json=body, headers=h, timeout=30).status_code
        == 200
    )
    r = httpx.post(base + "/v1/episodes/%C3%A9p/reward", json={"rewards": {"a": 1.0}}, headers=h, timeout=30)
    assert r.status_code == 200 and r.json() == {"episode_id": "ép", "released": 1, "dropped": 0}


def test_multibyte_characters_stream_whole_and_logprob_bytes_are_exact(fixed):
    http_url, backend = fixed
    tok = backend.tok
    h = auth()
    prompt = tok("Tell me", add_special_tokens=False)["input_ids"]
    body = {"model": "a", "prompt": prompt, "max_tokens": 16, "stream": True}
    with httpx.stream("POST", http_url + "/completions", json=body, headers=h, timeout=30) as r:
        events = [e for e in r.read().decode().split("\n\n") if e]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    pieces = [
        c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is None
    ]
    assert "".join(pieces) == EMOJI_TEXT and "\ufffd" not in EMOJI_TEXT
    assert pieces == [
        "Hi",
        " 😀",
        " 猫",
        " and",
        " 🎉",
        "!",
    ]  # each character whole, with the token ending it
    # completions logprobs: every token, the offsets where its piece starts
    plain = httpx.post(
        http_url + "/completions", json={**body, "stream": False, "logprobs": 1}, headers=h
    ).json()
    lp = plain["choices"][0]["logprobs"]
    n = len(backend.response)
    assert len(lp["tokens"]) == len(lp["text_offset"]) == n and lp["text_offset"][-1] == len(EMOJI_TEXT)
    assert [EMOJI_TEXT[o] for o in lp["text_offset"][:3]] == ["H", " ", " "]
    # chat logprobs: each token's exact bytes; they join to the text (and the eos token's own text)
    chat = {"model": "a", "messages": MSG, "max_tokens": 16, "logprobs": True}
    content = httpx.post(http_url + "/chat/completions", json=chat, headers=h).json()["choices"][0][
        "logprobs"
    ]
    content = content["content"]
    raw = [bytes(e["bytes"]) for e in content]
    assert b"".join(raw) == EMOJI_TEXT.encode() + tok.eos_token.encode()
    assert (
        raw[1] == " 😀".encode()[:4] and raw[2] == "😀".encode()[3:]
    )  # 'ĠðŁĺ' and 'Ģ': parts of one character
    partial = [e for e in content if "\ufffd" in e["token"]]
    assert len(partial) >= 6 and all(bytes(e["bytes"]) != e["token"].encode() for e in partial)
    # streamed chat with logprobs: a chunk per token, the same bytes
    with httpx.stream("POST", http_url + "/chat/completions", json={**chat, "stream": True}, headers=h) as r:
        chunks = [json.loads(e.removeprefix("data: ")) for e in r.read().decode().split("\n\n")[:-2]]
    streamed = [
        e
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert [bytes(e["bytes"]) for e in streamed] == raw
    assert (
        "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == EMOJI_TEXT
    )
