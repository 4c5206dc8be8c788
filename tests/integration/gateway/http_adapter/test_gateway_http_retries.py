"""Retries and disconnects: a call whose client timed out or disconnected is not recorded, idempotency keys
answer a retry with the first call (recorded once) and refuse a key reused for another request, over HTTP and
gRPC."""

from __future__ import annotations

import threading

import grpc
import httpx
import openai
import pytest

from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.gateway.server import GatewayServer
from services.trainer.models.loading import load_tokenizer
from tests.integration.gateway.http_adapter.http_gateway import (
    EMOJI_TEXT,
    MSG,
    TOKEN,
    FixedBackend,
    auth,
    wait_for,
)


def _held_server() -> tuple[GatewayServer, FixedBackend, str]:
    """A GatewayServer whose engine calls wait for ``backend.gate`` (closed), one request per batch."""
    backend = FixedBackend(load_tokenizer())
    backend.gate = threading.Event()
    server = GatewayServer(Gateway(backend, GatewayLimits(max_batch=1, max_wait_ms=0)), token=TOKEN)
    http_url, _ = server.start()
    return server, backend, http_url


def test_a_call_whose_client_timed_out_is_not_recorded_and_its_retry_is():
    server, backend, http_url = _held_server()
    try:
        impatient = openai.OpenAI(base_url=http_url, api_key=TOKEN, max_retries=0, timeout=0.5)
        with pytest.raises(openai.APITimeoutError):
            impatient.completions.create(
                model="a", prompt="hi", max_tokens=2, extra_headers={"X-Marti-Episode": "e1"}
            )
        backend.gate.set()  # the abandoned call finishes now; nobody receives it
        wait_for(lambda: server.gateway.stats()["unrecorded_disconnected"] == 1, "the call was not dropped")
        assert server.gateway.stats()["calls"] == 0
        patient = openai.OpenAI(base_url=http_url, api_key=TOKEN, max_retries=0, timeout=30)
        patient.completions.create(
            model="a", prompt="hi", max_tokens=2, extra_headers={"X-Marti-Episode": "e1"}
        )
        stats = server.gateway.stats()
        assert stats["calls"] == 1 and stats["unrecorded_disconnected"] == 1
    finally:
        backend.gate.set()
        server.stop()


def test_an_http_client_that_disconnects_while_queued_cancels_its_call_unless_it_has_a_key():
    """Like a gRPC cancel: queued prompts of a disconnected client never reach the engine (untraced, or traced
    without an idempotency key); a keyed call keeps its place for a retry; a running call runs to the end."""
    server, backend, http_url = _held_server()
    gw = server.gateway
    try:
        running = threading.Thread(
            target=lambda: httpx.post(
                http_url + "/completions", json={"model": "a", "prompt": "hi", "max_tokens": 2}, headers=auth(),
                timeout=60,
            )
        )  # fmt: skip
        running.start()
        assert backend.entered.wait(30)  # in the engine, held by the gate
        impatient = openai.OpenAI(base_url=http_url, api_key=TOKEN, max_retries=0, timeout=0.5)
        for n, head in [
            (2, {}),  # untraced
            (3, {"X-Marti-Episode": "gone-1"}),  # traced, no key
            (4, {"X-Marti-Episode": "gone-2", "Idempotency-Key": "k"}),  # keyed: stays queued
        ]:
            with pytest.raises(openai.APITimeoutError):
                impatient.completions.create(model="a", prompt="hi", max_tokens=2, n=n, extra_headers=head)
        wait_for(lambda: gw.batcher.load("a") == 1 + 4, "the disconnected calls were not cancelled")
        backend.gate.set()
        running.join(30)
        wait_for(lambda: gw.batcher.load("a") == 0, "the keyed call did not run")
        assert gw.batcher.prompts == 1 + 4  # the running call and the keyed one only (one prompt per batch)
        stats = gw.stats()
        assert gw.batcher.dropped_prompts == 2 + 3 and stats["cancelled_calls"] == 2
        assert (
            stats["calls"] == 0 and stats["unrecorded_disconnected"] == 2
        )  # the keyed one also went unrecorded
    finally:
        backend.gate.set()
        server.stop()


def test_an_idempotency_key_answers_a_retry_with_the_first_call_recorded_once():
    server, backend, http_url = _held_server()
    backend.gate.set()
    try:
        client = openai.OpenAI(base_url=http_url, api_key=TOKEN, max_retries=0, timeout=30)
        head = {"X-Marti-Episode": "e2", "Idempotency-Key": "turn-1"}
        first = client.completions.create(model="a", prompt="hi", max_tokens=2, extra_headers=head)
        again = client.completions.create(model="a", prompt="hi", max_tokens=2, extra_headers=head)
        other = client.completions.create(
            model="a", prompt="hi", max_tokens=2, extra_headers={**head, "Idempotency-Key": "turn-2"}
        )
        assert again.model_extra["call_ids"] == first.model_extra["call_ids"]
        assert other.model_extra["call_ids"] != first.model_extra["call_ids"]
        stats = server.gateway.stats()
        assert stats["calls"] == 2 and stats["replayed_calls"] == 1
        # the key lives as long as its episode: after the report, the episode is closed
        httpx.post(http_url + "/episodes/e2/reward", json={"rewards": {"a": 1.0}}, headers=auth(), timeout=30)
        with pytest.raises(openai.ConflictError, match="already reported"):
            client.completions.create(model="a", prompt="hi", max_tokens=2, extra_headers=head)
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(
                model="a",
                prompt="hi",
                max_tokens=2,
                extra_headers={"X-Marti-Episode": "e4", "Idempotency-Key": "k" * 257},
            )
        assert bad.value.body["param"] == "Idempotency-Key" and "max_id_chars" in bad.value.body["message"]
    finally:
        server.stop()


def test_an_idempotency_key_reused_for_a_different_request_is_refused_and_nothing_is_recorded():
    """Keys can only be reused with the same request: another prompt, n, sampling parameter or route (a chat
    prompt's ids differ) is 409 naming the key over HTTP, FAILED_PRECONDITION over gRPC; the true retry is
    still answered from the first call."""
    from marti.api.inference.v1 import inference_pb2 as ipb
    from marti.api.inference.v1 import inference_service_pb2_grpc as isgrpc

    server, backend, http_url = _held_server()
    backend.gate.set()
    try:
        client = openai.OpenAI(base_url=http_url, api_key=TOKEN, max_retries=0, timeout=30)
        head = {"X-Marti-Episode": "e5", "Idempotency-Key": "turn-1"}
        first = client.completions.create(model="a", prompt="hi", max_tokens=2, extra_headers=head)
        for change in ({"prompt": "bye"}, {"n": 2}, {"max_tokens": 3}, {"temperature": 0.5}):
            args = {"model": "a", "prompt": "hi", "max_tokens": 2, **change}
            with pytest.raises(openai.ConflictError) as err:
                client.completions.create(**args, extra_headers=head)
            assert (
                "'turn-1'" in err.value.body["message"] and "different request" in err.value.body["message"]
            )
            assert err.value.body["code"] == "failed_precondition"
        with pytest.raises(openai.ConflictError, match="turn-1"):
            client.chat.completions.create(
                model="a", messages=MSG, max_tokens=2, stream=True, extra_headers=head
            )
        again = client.completions.create(model="a", prompt="hi", max_tokens=2, extra_headers=head)
        assert again.model_extra["call_ids"] == first.model_extra["call_ids"]
        with pytest.raises(openai.ConflictError, match="turn-1"):  # the same request in another group
            client.completions.create(
                model="a", prompt="hi", max_tokens=2, extra_headers={**head, "X-Marti-Group": "g2"}
            )
        ids = server.gateway.backend.encode("a", "hi")  # the prompt is compared as its token ids
        same = client.completions.create(model="a", prompt=ids, max_tokens=2, extra_headers=head)
        assert same.model_extra["call_ids"] == first.model_extra["call_ids"]
        with grpc.insecure_channel(server.grpc_address) as channel:
            stub = isgrpc.InferenceServiceStub(channel)
            req = ipb.GenerateRequest(
                model="a", text="other", max_tokens=2, episode_id="e5", idempotency_key="turn-1"
            )
            with pytest.raises(grpc.RpcError) as late:
                stub.Generate(req, metadata=(("authorization", f"Bearer {TOKEN}"),), timeout=30)
            assert late.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "turn-1" in late.value.details()
        stats = server.gateway.stats()
        assert stats["calls"] == 1 and stats["replayed_calls"] == 2
    finally:
        server.stop()


def test_a_retry_sent_while_the_first_call_runs_waits_for_it_and_the_call_is_recorded_once():
    server, backend, http_url = _held_server()
    try:
        head = {"X-Marti-Episode": "e3", "Idempotency-Key": "turn-1"}
        impatient = openai.OpenAI(base_url=http_url, api_key=TOKEN, max_retries=0, timeout=0.5)
        with pytest.raises(openai.APITimeoutError):
            impatient.completions.create(model="a", prompt="hi", max_tokens=2, extra_headers=head)
        out = {}

        def retry() -> None:
            client = openai.OpenAI(base_url=http_url, api_key=TOKEN, max_retries=0, timeout=30)
            out["r"] = client.completions.create(model="a", prompt="hi", max_tokens=2, extra_headers=head)

        t = threading.Thread(target=retry)
        t.start()
        replays = server.gateway._replays
        wait_for(lambda: any(c.waiters for c in replays.values()), "the retry waiting on the first call")
        backend.gate.set()
        t.join(30)
        stats = server.gateway.stats()
        assert out["r"].choices[0].text == EMOJI_TEXT
        assert stats["calls"] == 1 and stats["replayed_calls"] == 1 and stats["unrecorded_disconnected"] == 0
        assert server.gateway.batcher.batches == 1  # one engine call served both
    finally:
        backend.gate.set()
        server.stop()


def test_grpc_a_call_past_its_deadline_is_not_recorded_and_a_keyed_retry_is_answered_once():
    """The same rules over gRPC: a deadline cancels the call (not recorded); ``idempotency_key`` replays."""
    from marti.api.inference.v1 import inference_pb2 as ipb
    from marti.api.inference.v1 import inference_service_pb2_grpc as isgrpc

    server, backend, _ = _held_server()
    meta = (("authorization", f"Bearer {TOKEN}"),)
    try:
        with grpc.insecure_channel(server.grpc_address) as channel:
            stub = isgrpc.InferenceServiceStub(channel)
            req = ipb.GenerateRequest(model="a", text="hi", max_tokens=2, episode_id="g1")
            with pytest.raises(grpc.RpcError) as late:
                stub.Generate(req, metadata=meta, timeout=0.5)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            # the server's deadline ends a little after the client's: the engine answers only once it has
            wait_for(
                lambda: server.gateway.stats()["cancelled_calls"] == 1, "the server did not cancel the call"
            )
            backend.gate.set()
            wait_for(
                lambda: server.gateway.stats()["unrecorded_disconnected"] == 1, "the call was not dropped"
            )
            keyed = ipb.GenerateRequest(
                model="a", text="hi", max_tokens=2, episode_id="g1", idempotency_key="t1"
            )
            first = stub.Generate(keyed, metadata=meta, timeout=30)
            again = stub.Generate(keyed, metadata=meta, timeout=30)
        assert [c.call_id for c in again.choices] == [c.call_id for c in first.choices]
        stats = server.gateway.stats()
        assert stats["calls"] == 1 and stats["replayed_calls"] == 1 and stats["unrecorded_disconnected"] == 1
    finally:
        backend.gate.set()
        server.stop()
