"""Reward reports while training does not keep up, over a real GatewayServer (HTTP and gRPC on free ports): a
report whose insert blocks (a sink held by a ``threading.Event``, as an insert into a full table is) is answered
202 / ``queued`` within ``gateway.report_wait_s``; once ``gateway.max_backlog_episodes`` wait, a report is refused
with 429 + ``Retry-After`` (gRPC RESOURCE_EXHAUSTED) and the episode stays open, so the same report succeeds once
the backlog drained. (What close does with a backlog is tested in tests/unit/gateway/test_gateway_core.py.)"""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from marti.clients.inference import InferenceClient
from marti.errors import ResourceExhaustedError
from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from tests.unit.gateway.test_gateway_core import FakeBackend

TOKEN = "backlog-token"


def _wait_until(predicate, what: str, timeout_s: float = 8.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def blocked():
    """``(http_url, grpc_address, gateway, room, inserted)``: a server whose sink waits for ``room``."""
    room = threading.Event()
    inserted: list[str] = []

    def sink(episode: dict) -> None:
        if not room.wait(20):
            raise TimeoutError("the test never made room")
        inserted.append(episode["a"].episode_id)

    limits = GatewayLimits(max_wait_ms=1, max_backlog_episodes=1, report_wait_s=0.3)
    gateway = Gateway(FakeBackend(), limits, sink=sink)
    server = GatewayServer(gateway, token=TOKEN)
    http_url, grpc_address = server.start()
    try:
        yield http_url, grpc_address, gateway, room, inserted
    finally:
        room.set()
        server.stop()


def test_a_full_backlog_answers_429_with_retry_after_and_the_report_succeeds_later(blocked):
    http_url, grpc_address, gateway, room, inserted = blocked
    client = openai.OpenAI(base_url=http_url, api_key=TOKEN, max_retries=0, timeout=30)
    for eid in ("e1", "e2", "e3"):
        client.completions.create(
            model="a", prompt="hi", max_tokens=1, extra_headers={"X-Marti-Episode": eid}
        )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=http_url, headers=auth, timeout=30) as http:
        first = http.post("/episodes/e1/reward", json={"rewards": {"a": 1.0}})
        assert first.status_code == 202, first.text  # answered although its insert is still blocked
        assert first.json() == {"episode_id": "e1", "released": 1, "dropped": 0, "queued": 1}
        refused = http.post("/episodes/e2/reward", json={"rewards": {"a": 1.0}})
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        err = refused.json()["error"]
        assert err["type"] == "rate_limit_error" and "gateway.max_backlog_episodes" in err["message"]
        with InferenceClient(grpc_address, token=TOKEN) as rpc:
            with pytest.raises(ResourceExhaustedError, match=r"gateway\.max_backlog_episodes\) is 1"):
                rpc.report_reward("e3", {"a": 1.0})
            stats = http.get("/gateway/stats").json()
            assert (stats["backlog"], stats["backlog_refused"], stats["open_episodes"]) == (1, 2, 2)
            room.set()  # the learner consumes: the backlog drains, the refused reports go through
            _wait_until(lambda: gateway.stats()["backlog"] == 0, "the backlog to drain")
            again = http.post("/episodes/e2/reward", json={"rewards": {"a": 1.0}})
            assert again.status_code == 200 and again.json() == {
                "episode_id": "e2",
                "released": 1,
                "dropped": 0,
            }
            receipt = rpc.report_reward("e3", {"a": 1.0})
            assert (receipt.released, receipt.dropped, receipt.queued) == (1, 0, 0)
    assert inserted == ["e1", "e2", "e3"]


def test_a_queued_grpc_report_says_so_in_its_receipt(blocked):
    http_url, grpc_address, gateway, room, inserted = blocked
    with InferenceClient(grpc_address, token=TOKEN) as rpc:
        rpc.generate("a", token_ids=[1, 2], max_tokens=1, episode_id="g1")
        receipt = rpc.report_reward("g1", {"a": 1.0})
        assert (receipt.released, receipt.queued) == (1, 1)
    assert gateway.stats()["queued_reports"] == 1
