"""The gateway under load and alone, over real HTTP on a model-free engine (so only the gateway is exercised):
a lone call does not wait for company, 400 requests in flight are all answered, and the event loop's lag is
reported in ``/v1/gateway/stats``."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import openai
import pytest

from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.models.loading import load_tokenizer
from services.trainer.rollout.engines.instant import InstantRolloutEngine
from services.trainer.rollout.serving.gateway_backend import EngineBackend

TOKEN = "load-token"
AGENTS = ("a", "b")
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def _server(tokenizer, limits: GatewayLimits) -> GatewayServer:
    engine = InstantRolloutEngine(dict.fromkeys(AGENTS, tokenizer))
    gateway = Gateway(EngineBackend(engine, dict.fromkeys(AGENTS, tokenizer)), limits)
    return GatewayServer(gateway, token=TOKEN)


def test_a_lone_call_does_not_wait_max_wait_ms(tokenizer):
    """An agent's calls, one after another, each run as soon as it arrives: with ``max_wait_ms`` a minute, the
    old batcher held every lone call that minute (the client's 20 s timeout would fail it)."""
    with _server(tokenizer, GatewayLimits(max_wait_ms=60_000)) as server:
        client = openai.OpenAI(base_url=server.http_url, api_key=TOKEN, max_retries=0, timeout=20)
        for _ in range(3):
            t0 = time.monotonic()
            r = client.chat.completions.create(model="a", messages=MESSAGES, max_tokens=8)
            assert r.choices[0].message.content and time.monotonic() - t0 < 15
        stats = httpx.get(server.http_url + "/gateway/stats", headers=AUTH).json()
        assert stats["lone_batches"] == 3 and stats["batches"] == 3


async def _post(port: int, body: bytes) -> tuple[int, dict]:
    """One HTTP/1.1 POST of a chat completion on its own connection; (status, JSON body). A plain socket client:
    the test's 400 requests would cost the ``httpx`` client in this process several seconds of CPU."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    raw = await reader.read()  # the server closes the connection after its answer
    writer.close()
    status_line, _, rest = raw.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def test_400_requests_in_flight_are_all_answered_and_the_loop_lag_is_reported(tokenizer):
    """400 concurrent chat completions (one connection each) over HTTP: every one 200 with its tokens; the probe's
    samples show in the stats, and a loop blocked for 0.3 s shows as that much lag."""
    with _server(tokenizer, GatewayLimits()) as server:
        port = int(server.http_url.rsplit(":", 1)[1].split("/")[0])

        async def load() -> list[tuple[int, dict]]:
            bodies = [
                json.dumps({"model": AGENTS[i % 2], "messages": MESSAGES, "max_tokens": 4}).encode()
                for i in range(400)
            ]
            return await asyncio.gather(*[_post(port, b) for b in bodies])

        answers = asyncio.run(load())
        assert [status for status, _ in answers] == [200] * 400
        assert all(body["usage"]["completion_tokens"] == 4 for _, body in answers)

        async def block() -> None:
            time.sleep(0.3)  # blocking code on the gateway's loop

        server.run(block())
        time.sleep(0.2)  # the probe wakes up late, then samples again
        stats = httpx.get(server.http_url + "/gateway/stats", headers=AUTH).json()
        assert stats["loop_lag_samples"] >= 2
        assert 250 <= stats["loop_lag_ms_max"] < 5000, stats
        assert stats["batched_prompts"] == 400


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length from ``sock``: (status, body); status 0 if the server closed."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, b""
        raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    length = next(
        int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return int(head.split()[1]), body


def test_an_idle_keep_alive_connection_outlives_the_clients_own_idle_limit(tokenizer):
    """The server keeps an idle connection longer than ``httpx`` (the ``openai`` client) keeps it in its pool
    (5 s), so a client reusing it is never refused by a close racing its request (uvicorn's default closed it at
    5 s: a connection error under load). Waits 5.5 s: the length of the client's limit is what is tested."""
    with _server(tokenizer, GatewayLimits()) as server:
        port = int(server.http_url.rsplit(":", 1)[1].split("/")[0])
        body = json.dumps({"model": "a", "messages": MESSAGES, "max_tokens": 2}).encode()
        request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(request)
            assert _read_response(sock)[0] == 200
            time.sleep(5.5)  # idle past httpx's keep-alive expiry
            sock.sendall(request)
            assert _read_response(sock)[0] == 200
