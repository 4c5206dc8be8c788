"""What the tests of the gateway's OpenAI-compatible HTTP adapter share (``test_gateway_http_*.py`` and their
conftest.py): a uvicorn :class:`Server` in a thread, a scripted backend (:class:`FixedBackend`: the tiny model's
tokenizer, no model, every completion :data:`EMOJI_TEXT`), the token and request helpers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import uvicorn

from marti.types.inference import Generation
from services.gateway.core.backend import InferenceBackend
from services.gateway.core.gateway import Gateway
from services.gateway.http.app import build_app
from tests.integration.gateway.one_agent import OneAgent
from tests.integration.gateway.tiny_gateway import AGENTS, MAX_MODEL_LEN, MAX_QUEUE  # noqa: F401 (the tests import them from here)

TOKEN = "test-token-123"
MSG = [{"role": "user", "content": "hello there"}]


class Server:
    """A uvicorn server in a thread; ``base`` is its root URL."""

    def __init__(self, gateway: Gateway, token: str | None) -> None:
        config = uvicorn.Config(build_app(gateway, token), host="127.0.0.1", port=0, log_level="warning")
        self.server = uvicorn.Server(config)
        self.gateway = gateway

        async def main() -> None:
            await gateway.start()
            try:
                await self.server.serve()
            finally:
                await gateway.close()

        self.thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        """Stop serving and wait for the thread (the gateway is closed on its loop)."""
        self.server.should_exit = True
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}


def error_of(exc_info) -> dict:
    return exc_info.value.body


EMOJI_TEXT = "Hi 😀 猫 and 🎉!"  # byte-level BPE splits each of the three characters over 2 or 3 tokens


class FixedBackend(OneAgent, InferenceBackend):
    """Agent ``a`` with the tiny model's tokenizer and no model: every completion is :data:`EMOJI_TEXT` then eos;
    the prompt ``"boom"`` makes the engine raise RuntimeError; ``gate``, when set, holds every engine call until
    it opens (``entered`` tells that one has started)."""

    def __init__(self, tok) -> None:
        self.tokenizers = {"a": tok}  # what the trainer's backends have: exact bytes of byte-level tokens
        self.tok = tok
        self.response = tok(EMOJI_TEXT, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def chat_prompt(self, agent, messages) -> list[int]:
        return self.encode(agent, " ".join(m["content"] for m in messages))

    def encode(self, agent: str, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def token_texts(self, agent: str, ids: Sequence[int]) -> list[str]:
        return list(self.tok.batch_decode([[i] for i in ids]))

    def decode(self, agent: str, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def vocab_size(self, agent: str) -> int:
        return len(self.tok)

    def generate(self, agent, prompts, sampling, version) -> list[Generation]:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(60)
        if any(p == self.encode(agent, "boom") for p in prompts):
            raise RuntimeError("secret engine failure")
        text = self.decode(agent, self.response)
        logps = [-0.5] * len(self.response)
        return [Generation(list(p), list(self.response), logps, text, "stop", 0, agent) for p in prompts]


MAX_REQUEST_BYTES = 4096
MAX_ID_CHARS = 32


def wait_for(predicate, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)
