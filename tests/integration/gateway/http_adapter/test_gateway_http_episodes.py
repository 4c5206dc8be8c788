"""Episodes over HTTP: calls traced and released into the sink, groups and rewards, the reward route's
grouping, abandonment, failures and store errors, and reports refused over HTTP and gRPC."""

from __future__ import annotations

import httpx
import openai
import pytest

from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.models.loading import load_tokenizer
from tests.integration.gateway.http_adapter.http_gateway import (
    MSG,
    TOKEN,
    FixedBackend,
    auth,
    error_of,
    wait_for,
)


def test_episodes_are_traced_and_released(served, client):
    sink, base = served.sink, served.base
    before = len(sink)
    calls0 = served.gateway.stats()["calls"]
    # the episode in a header
    r1 = client.chat.completions.create(
        model="planner", messages=MSG, max_tokens=4, extra_headers={"X-Marti-Episode": "ep-header"}
    )
    # the episode and group in the base_url (unchanged client code)
    scoped = openai.OpenAI(base_url=f"{base}/episodes/ep-path/groups/g1/v1", api_key=TOKEN, max_retries=0)
    r2 = scoped.chat.completions.create(model="executor", messages=MSG, max_tokens=4)
    r3 = scoped.completions.create(model="planner", prompt="abc", max_tokens=3)
    stats = httpx.get(base + "/v1/gateway/stats", headers=auth()).json()
    assert stats["calls"] == calls0 + 3 and stats["open_episodes"] >= 2
    call_id = r2.choices[0].model_extra["call_id"]
    rep = httpx.post(
        base + "/v1/episodes/ep-path/reward",
        json={"rewards": {"planner": 1.0}, "call_rewards": {call_id: 0.5}},
        headers=auth(),
    )
    assert rep.status_code == 200 and rep.json() == {"episode_id": "ep-path", "released": 1, "dropped": 0}
    rep = httpx.post(
        base + "/v1/episodes/ep-header/reward", json={"rewards": {"planner": -1.0}}, headers=auth()
    )
    assert rep.json()["released"] == 1
    assert len(sink) == before + 2
    path_ep, header_ep = sink[before], sink[before + 1]
    (turn,) = path_ep["executor"].turns
    assert turn.prompt_token_ids == r2.model_extra["prompt_token_ids"]
    assert turn.response_token_ids == r2.choices[0].model_extra["token_ids"] and turn.reward == 0.5
    assert path_ep["executor"].group_id == "g1" and path_ep["planner"].episode_return == 1.0
    assert path_ep["planner"].turns[0].response_token_ids == r3.choices[0].model_extra["token_ids"]
    assert header_ep["planner"].turns[0].response_token_ids == r1.choices[0].model_extra["token_ids"]
    assert header_ep["planner"].episode_return == -1.0 and header_ep["executor"].turns == []
    # a reported episode is closed: 409 for another call, and for another report
    with pytest.raises(openai.ConflictError):
        scoped.chat.completions.create(model="executor", messages=MSG, max_tokens=2)
    again = httpx.post(base + "/v1/episodes/ep-path/reward", json={"rewards": {}}, headers=auth())
    assert again.status_code == 409 and again.json()["error"]["code"] == "failed_precondition"


def test_an_episode_has_one_group_and_rewards_only_for_agents_that_called(served, client):
    base, h = served.base, auth()
    head = {"X-Marti-Episode": "ep-one-group", "X-Marti-Group": "A"}
    client.completions.create(model="planner", prompt="abc", max_tokens=2, extra_headers=head)
    with pytest.raises(openai.ConflictError) as e:  # a call of the same episode under another group
        client.completions.create(
            model="executor", prompt="abc", max_tokens=2, extra_headers={**head, "X-Marti-Group": "B"}
        )
    assert (
        error_of(e)["code"] == "failed_precondition"
        and "'B'" in error_of(e)["message"]
        and "'A'" in error_of(e)["message"]
    )
    url = base + "/v1/episodes/ep-one-group/reward"
    r = httpx.post(url, json={"rewards": {"planner": 1.0}, "group_id": "C"}, headers=h)
    err = r.json()["error"]
    assert r.status_code == 409 and err["type"] == "conflict_error" and err["code"] == "failed_precondition"
    assert "group 'C'" in err["message"] and "group 'A'" in err["message"]
    r = httpx.post(url, json={"rewards": {"planner": 1.0, "executor": 0.0}, "group_id": "A"}, headers=h)
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "invalid_argument"
    assert "'executor', which made no recorded call" in err["message"] and "['planner']" in err["message"]
    r = httpx.post(url, json={"rewards": {"planner": 1.0}, "group_id": "A"}, headers=h)
    assert r.status_code == 200 and r.json()["released"] == 1
    assert served.sink[-1]["planner"].group_id == "A"


def test_a_report_with_a_group_size_it_can_never_reach_is_refused_over_http_and_grpc():
    """group_size > 1 without a group id (a group of one), or above gateway.max_group_size: 400 /
    INVALID_ARGUMENT naming the values, and the episode stays open (a correct report is then accepted)."""
    from marti.clients.inference import InferenceClient
    from marti.errors import InvalidArgumentError

    server = GatewayServer(Gateway(FixedBackend(load_tokenizer()), GatewayLimits(max_wait_ms=1)), token=TOKEN)
    http_url, grpc_address = server.start()
    try:
        with httpx.Client(base_url=http_url, headers=auth(), timeout=30) as http:
            head = {"X-Marti-Episode": "u1"}
            body = {"model": "a", "prompt": "hi", "max_tokens": 2}
            assert http.post("/completions", json=body, headers=head).status_code == 200
            for fields, text in (
                ({"group_size": 4}, "group_size is 4 but episode 'u1' has no group_id"),
                ({"group_size": 10**9, "group_id": "g"}, "group_size is 1000000000; the limit"),
                ({"group_size": 2**64, "group_id": "g"}, f"group_size is {2**64}; the limit"),
            ):
                r = http.post("/episodes/u1/reward", json={"rewards": {"a": 1.0}, **fields})
                assert r.status_code == 400 and text in r.json()["error"]["message"], r.text
            with InferenceClient(grpc_address, token=TOKEN) as rpc:
                for kw in ({"group_size": 2}, {"group_size": 2**32 - 1, "group_id": "g"}):
                    with pytest.raises(InvalidArgumentError, match="group_size"):
                        rpc.report_reward("u1", {"a": 1.0}, **kw)
            ok = http.post("/episodes/u1/reward", json={"rewards": {"a": 1.0}, "group_size": 1})
            assert ok.status_code == 200 and ok.json()["released"] == 1
    finally:
        server.stop()


def test_reward_route_groups_abandonment_failures_and_store_errors():
    """Over a GatewayServer (HTTP and gRPC on one gateway) whose sink fails for two episodes:

    * ``X-Marti-Group`` groups calls, across protocols: an HTTP episode and a gRPC one of the same group are held
      until both reported (``group_size``) and released together;
    * an episode silent for ``external.episode_timeout_s`` is abandoned by the gateway's sweeper and dropped with
      its group (the member held for it too); its report is then refused with 409;
    * ``"failed": true`` drops the group: the member still open is dropped when it reports;
    * a store that is down, or a store wait that timed out, answers the report 409 ``aborted`` naming the store's
      error and saying the episode is lost to training and must not be reported again; both are counted in
      ``sink_errors`` and the gateway keeps serving.
    """
    from marti.clients.inference import InferenceClient
    from marti.errors import DeadlineExceededError, UnavailableError

    timeout_s = 0.6
    stored: list = []

    def sink(episode: dict) -> None:
        eid = episode["a"].episode_id
        if eid == "down":
            raise UnavailableError("the experience store is unavailable")
        if eid == "slow":
            raise DeadlineExceededError("the experience store did not answer within 2 s")
        stored.append(episode)

    limits = GatewayLimits(max_wait_ms=1, episode_timeout_s=timeout_s)
    server = GatewayServer(Gateway(FixedBackend(load_tokenizer()), limits, sink=sink), token=TOKEN)
    http_url, grpc_address = server.start()
    body = {"model": "a", "prompt": "hi", "max_tokens": 2}
    try:
        with httpx.Client(base_url=http_url, headers=auth(), timeout=30) as http:

            def call(episode: str, group: str = "") -> None:
                head = {"X-Marti-Episode": episode, **({"X-Marti-Group": group} if group else {})}
                assert http.post("/completions", json=body, headers=head).status_code == 200

            def report(episode: str, **fields) -> httpx.Response:
                return http.post(f"/episodes/{episode}/reward", json={"rewards": {"a": 1.0}, **fields})

            # one group over both protocols; the HTTP member names its group only in the header
            call("h1", "g1")
            with InferenceClient(grpc_address, token=TOKEN) as rpc:
                rpc.generate("a", text="hi", max_tokens=2, episode_id="r1", group_id="g1")
                assert report("h1", group_size=2).json() == {"episode_id": "h1", "released": 0, "dropped": 0}
                assert rpc.report_reward("r1", {"a": 0.0}, group_size=2).released == 2
            assert [(e["a"].episode_id, e["a"].group_id) for e in stored] == [("h1", "g1"), ("r1", "g1")]

            # abandonment: a2 goes silent; a1, held for its group, is dropped with it
            call("a1", "g2")
            call("a2", "g2")
            assert report("a1", group_size=2).json()["released"] == 0
            assert http.get("/gateway/stats").json()["abandoned"] == 0
            wait_for(
                lambda: http.get("/gateway/stats").json()["abandoned"] == 1, "a2 was never abandoned", 15
            )
            stats = http.get("/gateway/stats").json()
            assert stats["dropped"] == 2 and stats["held"] == 0 and stats["released"] == 2
            late = report("a2", group_size=2)
            assert late.status_code == 409 and "abandoned" in late.json()["error"]["message"]
            assert late.json()["error"]["code"] == "failed_precondition"
            assert http.post("/completions", json=body, headers={"X-Marti-Episode": "a2"}).status_code == 409

            # a failed episode drops its group: f2, open when f1 failed, is dropped when it reports
            for eid in ("f1", "f2"):
                r = httpx.post(f"{http_url.removesuffix('/v1')}/episodes/{eid}/groups/g3/v1/completions",
                               json=body, headers=auth(), timeout=30)  # fmt: skip
                assert r.status_code == 200
            assert report("f1", failed=True).json() == {"episode_id": "f1", "released": 0, "dropped": 1}
            assert report("f2").json() == {"episode_id": "f2", "released": 0, "dropped": 1}
            assert http.get("/gateway/stats").json()["failed"] == 1

            # the store's errors reach the reporter, which is told the episode is lost (a retry cannot help)
            call("down")
            call("slow")
            down, slow = report("down"), report("slow")
            assert down.status_code == 409 and "retry-after" not in down.headers
            assert down.json()["error"]["code"] == "aborted"
            message = down.json()["error"]["message"]
            assert "experience store is unavailable" in message and "lost to training" in message
            assert slow.status_code == 409 and "did not answer within 2 s" in slow.json()["error"]["message"]
            assert report("down").status_code == 409  # already reported
            stats = http.get("/gateway/stats").json()
            assert stats["sink_errors"] == 2 and stats["released"] == 2
            assert http.post("/completions", json=body).status_code == 200  # still serving
    finally:
        server.stop()
