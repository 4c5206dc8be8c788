"""Stopping a GatewayServer: running requests finish within the grace, queued ones and those still running
after it get 503 JSON."""

from __future__ import annotations

import threading
import time

import httpx

from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.models.loading import load_tokenizer
from tests.integration.gateway.http_adapter.http_gateway import (
    TOKEN,
    FixedBackend,
    auth,
)


def _stopping_server(grace_s: float) -> tuple[GatewayServer, FixedBackend, str]:
    """A GatewayServer whose engine calls wait for ``backend.gate``; a request with n = 2 fills a batch (runs at
    once), one with n = 1 waits a minute for company (stays queued)."""
    backend = FixedBackend(load_tokenizer())
    backend.gate = threading.Event()
    limits = GatewayLimits(max_batch=2, max_wait_ms=60_000)
    server = GatewayServer(Gateway(backend, limits), token=TOKEN, grace_s=grace_s)
    http_url, _ = server.start()
    return server, backend, http_url


def _in_flight(
    http_url: str, backend: FixedBackend, server: GatewayServer
) -> tuple[dict, list[threading.Thread]]:
    """Start a running request (n = 2, held in the engine) and a queued one (n = 1); returns their responses
    (filled in as they come) and threads."""
    out: dict[str, httpx.Response] = {}

    def call(name: str, n: int) -> None:
        body = {"model": "a", "prompt": "hello", "max_tokens": 2, "n": n}
        out[name] = httpx.post(http_url + "/completions", json=body, headers=auth(), timeout=60)

    running = threading.Thread(target=call, args=("running", 2))
    running.start()
    assert backend.entered.wait(30)
    queued = threading.Thread(target=call, args=("queued", 1))
    queued.start()
    deadline = time.monotonic() + 30
    while server.gateway.batcher.load("a") < 3:
        assert time.monotonic() < deadline, "the queued request did not arrive"
        time.sleep(0.01)
    return out, [running, queued]


def test_stop_lets_running_requests_finish_in_the_grace_and_fails_queued_ones_with_503():
    server, backend, http_url = _stopping_server(grace_s=2.0)
    out, threads = _in_flight(http_url, backend, server)
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    time.sleep(0.3)
    backend.gate.set()  # the running batch ends within the grace
    for t in [*threads, stopper]:
        t.join(60)
    assert not stopper.is_alive() and not server.running
    assert out["running"].status_code == 200 and len(out["running"].json()["choices"]) == 2
    queued = out["queued"]
    assert queued.status_code == 503 and queued.headers["content-type"] == "application/json"
    assert queued.json()["error"] == {
        "message": "the gateway is shutting down",
        "type": "service_unavailable_error",
        "param": None,
        "code": "unavailable",
    }


def test_stop_answers_requests_still_running_after_the_grace_with_503_json():
    server, backend, http_url = _stopping_server(grace_s=0.5)
    out, threads = _in_flight(http_url, backend, server)
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    for t in threads:
        t.join(30)
    backend.gate.set()  # only now: the engine thread can end
    stopper.join(60)
    assert not stopper.is_alive()
    for name in ("running", "queued"):
        r = out[name]
        assert r.status_code == 503 and r.headers["content-type"] == "application/json", (name, r.text)
        assert r.json()["error"]["code"] == "unavailable" and "shutting down" in r.json()["error"]["message"]
