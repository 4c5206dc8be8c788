"""Fixtures of the HTTP adapter tests (``test_gateway_http_*.py``), each started once per module that uses it;
a module that defines a fixture of the same name (``served`` in test_gateway_grpc.py) uses its own."""

from __future__ import annotations

import openai
import pytest

from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.models.loading import build_tiny_model, load_tokenizer
from services.trainer.rollout.engines.hf import AgentModel, HFRolloutEngine
from services.trainer.rollout.serving.gateway_backend import EngineBackend
from tests.integration.gateway.http_adapter.http_gateway import (
    AGENTS,
    MAX_ID_CHARS,
    MAX_MODEL_LEN,
    MAX_QUEUE,
    MAX_REQUEST_BYTES,
    TOKEN,
    FixedBackend,
    Server,
)


@pytest.fixture(scope="module")
def served():
    tok = load_tokenizer()
    engine = HFRolloutEngine(
        {a: AgentModel(build_tiny_model(tok, seed=i), tok) for i, a in enumerate(AGENTS)},
        max_model_len=MAX_MODEL_LEN,
    )
    sink: list = []
    limits = GatewayLimits(max_wait_ms=2, max_queue=MAX_QUEUE, max_n=8)
    gateway = Gateway(EngineBackend(engine, {a: tok for a in AGENTS}), limits, sink=sink.append)
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
