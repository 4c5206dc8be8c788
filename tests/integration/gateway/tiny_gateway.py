"""The two-agent gateway over tiny random models that both the HTTP adapter's tests
(``http_adapter/conftest.py``) and the gRPC tests (``test_gateway_grpc.py``) serve."""

from __future__ import annotations

from typing import Any

from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.trainer.models.loading import build_tiny_model, load_tokenizer
from services.trainer.rollout.engines.hf import AgentModel, HFRolloutEngine
from services.trainer.rollout.serving.gateway_backend import EngineBackend

AGENTS = ("planner", "executor")
MAX_MODEL_LEN = 128
#: A request with n = 4 can never fit: refused as invalid (HTTP 400, gRPC INVALID_ARGUMENT), not as overloaded.
MAX_QUEUE = 3


def tiny_gateway(sink: list) -> tuple[Gateway, Any]:
    """A gateway serving :data:`AGENTS`, each a tiny random Llama (seed = its index) of :data:`MAX_MODEL_LEN`
    tokens, batching within 2 ms, :data:`MAX_QUEUE` queued samples and ``n`` <= 8; released episodes are
    appended to ``sink``. Returns ``(gateway, tokenizer)``."""
    tok = load_tokenizer()
    engine = HFRolloutEngine(
        {a: AgentModel(build_tiny_model(tok, seed=i), tok) for i, a in enumerate(AGENTS)},
        max_model_len=MAX_MODEL_LEN,
    )
    limits = GatewayLimits(max_wait_ms=2, max_queue=MAX_QUEUE, max_n=8)
    return Gateway(EngineBackend(engine, {a: tok for a in AGENTS}), limits, sink=sink.append), tok
