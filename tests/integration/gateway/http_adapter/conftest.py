"""Fixtures of the HTTP adapter tests (``test_gateway_http_*.py``), each started once per module that uses it;
a module that defines a fixture of the same name (``served`` in test_gateway_grpc.py) uses its own."""

from __future__ import annotations

import openai
import pytest

from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.models.loading import load_tokenizer
from tests.integration.gateway.http_adapter.http_gateway import (
    MAX_ID_CHARS,
    MAX_REQUEST_BYTES,
    TOKEN,
    FixedBackend,
    Server,
)
from tests.integration.gateway.tiny_gateway import tiny_gateway


@pytest.fixture(scope="module")
def served():
    sink: list = []
    gateway, _ = tiny_gateway(sink)
    server = Server(gateway, TOKEN)
    server.sink = sink  # type: ignore[attr-defined]
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.base + "/v1", api_key=TOKEN, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def fixed():
    """``(http_url, backend)``: a GatewayServer over :class:`FixedBackend` with small size and id limits."""
    backend = FixedBackend(load_tokenizer())
    limits = GatewayLimits(max_wait_ms=1, max_request_bytes=MAX_REQUEST_BYTES, max_id_chars=MAX_ID_CHARS)
    server = GatewayServer(Gateway(backend, limits), token=TOKEN)
    http_url, _ = server.start()
    yield http_url, backend
    server.stop()
