"""The gateway facade over a real tiny-model engine: model names, limits, traces into the sink."""

from __future__ import annotations

import asyncio

import pytest

from marti.errors import AbortedError, InvalidArgumentError, NotFoundError, UnavailableError
from marti.types.inference import Generation, SamplingParams
from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.trainer.models.loading import build_tiny_model, load_tokenizer
from services.trainer.rollout.engines.hf import AgentModel, HFRolloutEngine
from services.trainer.rollout.serving.gateway_backend import EngineBackend

S = SamplingParams(max_new_tokens=4, seed=1)
GREEDY = SamplingParams(max_new_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def backend():
    tok = load_tokenizer()
    eng = HFRolloutEngine(
        {a: AgentModel(build_tiny_model(tok, seed=i), tok) for i, a in enumerate(["planner", "coder"])},
        max_model_len=64,
    )
    return EngineBackend(eng, {"planner": tok, "coder": tok})


async def test_names_resolve_to_agents_and_resident_versions(backend):
    gw = Gateway(backend)
    assert [m.id for m in gw.models()] == ["planner", "planner@0", "coder", "coder@0"]
    assert gw.resolve("coder") == ("coder", None) and gw.resolve("coder@0") == ("coder", 0)
    for bad in ("nobody", "coder@1", "coder@x", "coder@"):
        with pytest.raises(NotFoundError, match="coder|nobody"):
            gw.resolve(bad)


async def test_limits_are_checked_before_serving(backend):
    gw = Gateway(backend, GatewayLimits(max_n=2))
    with pytest.raises(InvalidArgumentError, match="max_n"):
        await gw.generate("planner", "hi", S, n=3)
    with pytest.raises(InvalidArgumentError, match="exceeds model 'planner'"):
        await gw.generate("planner", [5] * 61, S)
    with pytest.raises(InvalidArgumentError, match="empty"):
        await gw.generate("planner", [], S)
    out = await gw.generate("planner", [5] * 60, S, n=2)  # exactly the context: 60 + 4 = 64
    assert len(out.generations) == 2 and len(set(out.call_ids)) == 2
    await gw.close()


async def test_reported_episode_reaches_the_sink_with_the_served_tokens(backend):
    got = []
    gw = Gateway(backend, sink=got.append, trainable=["planner", "coder"])
    await gw.start()
    a = await gw.generate("planner", [{"role": "user", "content": "plan"}], S, episode_id="e1", group_id="q1")
    b = await gw.generate("coder", "code", S, episode_id="e1")
    await gw.generate("coder", "untraced", S)
    released = await gw.report("e1", {"planner": 1.0, "coder": 0.0})
    assert len(released.episodes) == 1 and len(got) == 1
    (pt,), (ct,) = got[0]["planner"].turns, got[0]["coder"].turns
    ga, gb = a.generations[0], b.generations[0]
    assert pt.prompt_token_ids == ga.prompt_token_ids and pt.response_token_ids == ga.response_token_ids
    assert pt.response_logprobs == pytest.approx(ga.response_logprobs)
    assert ct.response_token_ids == gb.response_token_ids and got[0]["coder"].group_id == "q1"
    stats = gw.stats()
    assert stats["calls"] == 2 and stats["untraced_calls"] == 1 and stats["released"] == 1
    await gw.close()


async def test_a_sink_failure_reaches_the_caller_and_is_counted(backend):
    def sink(_episode):
        raise UnavailableError("store down")

    gw = Gateway(backend, sink=sink)
    await gw.generate("planner", "x", S, episode_id="e9")
    with pytest.raises(AbortedError, match="store down.*lost to training"):
        await gw.report("e9", {"planner": 1.0})
    assert gw.stats()["sink_errors"] == 1
    await gw.close()


async def test_a_bad_token_id_fails_only_its_own_request_not_its_batch(backend):
    import asyncio

    gw = Gateway(backend, GatewayLimits(max_wait_ms=50))
    bad, good = await asyncio.gather(
        gw.generate("planner", [1, 10**7], S), gw.generate("planner", [1, 2], S), return_exceptions=True
    )
    assert isinstance(bad, InvalidArgumentError) and "10000000" in str(bad) and "vocabulary" in str(bad)
    assert len(good.generations[0].response_token_ids) == 4
    with pytest.raises(InvalidArgumentError, match="-1"):
        await gw.generate("planner", [-1], S)
    await gw.close()


class _CurrentOnlyEngine:
    """An engine that cannot load another version for one call (no ``pinned``), as the vLLM engine and the
    engine pool: it samples with its current weights only."""

    agent_ids = ["planner"]
    max_model_len = 64

    def __init__(self) -> None:
        self.version = 0
        self.calls = 0

    def policy_version(self, agent_id: str) -> int:
        return self.version

    def generate(self, agent_id, prompts, sampling):
        self.calls += 1
        return [Generation(list(p), [7], [-1.0], "x", "stop", self.version, agent_id) for p in prompts]


def test_an_engine_without_pinned_versions_serves_only_its_current_version():
    """docs/gateway.md: the vLLM engine serves only the current version (its weights live in vLLM; there is no
    per-call swap), even when older versions are remembered."""
    import torch

    from services.trainer.rollout.engines.generation import ResidentWeights
    from services.trainer.rollout.engines.pool import EnginePool
    from services.trainer.rollout.engines.vllm_engine import VLLMRolloutEngine

    assert not hasattr(VLLMRolloutEngine, "pinned") and not hasattr(EnginePool, "pinned")
    engine, resident = _CurrentOnlyEngine(), ResidentWeights(3)
    resident.remember(["planner"], 0, {"w": torch.zeros(1)})
    engine.version = 1
    resident.remember(["planner"], 1, {"w": torch.ones(1)})
    backend = EngineBackend(engine, {"planner": load_tokenizer()}, resident=resident)  # type: ignore[arg-type]
    assert backend.resident_versions("planner") == [1]
    assert [m.id for m in Gateway(backend).models()] == ["planner", "planner@1"]
    assert backend.generate("planner", [[1, 2]], S, 1)[0].policy_version == 1
    with pytest.raises(NotFoundError, match="version 0 of agent 'planner' is not resident"):
        backend.generate("planner", [[1, 2]], S, 0)
    assert engine.calls == 1


def _own_planner() -> tuple[EngineBackend, Gateway, dict]:
    """A one-agent engine of its own (its weights change), its backend, a gateway over it, and a version 1 of its
    weights (one tensor moved)."""
    tok = load_tokenizer()
    model = build_tiny_model(tok, seed=0)
    backend = EngineBackend(
        HFRolloutEngine({"planner": AgentModel(model, tok)}, max_model_len=64), {"planner": tok}
    )
    name, weight = next(iter(model.state_dict().items()))
    return backend, Gateway(backend, trainable=["planner"]), {name: weight + 1.0}


async def test_a_weight_sync_that_skips_the_engine_lock_fails_the_call_instead_of_mislabelling_it():
    """docs/gateway.md (Models): an EngineBackend owner must sync under ``backend.lock``. One that does not, and
    lands in the middle of a call, gets the call refused (its tokens came from two versions), not recorded as the
    newer version; the retry samples with one version."""
    backend, gw, moved = _own_planner()
    engine, model = backend.engine, backend.engine._agents["planner"].model
    forwards = [0]

    def sync_without_the_lock(module, args):
        forwards[0] += 1
        if forwards[0] == 3:  # tokens were sampled by version 0
            engine.update_weights("planner", moved, 1)

    hook = model.get_input_embeddings().register_forward_pre_hook(sync_without_the_lock)
    try:
        with pytest.raises(
            AbortedError, match="'planner' changed while the call sampled: it started on version 0"
        ):
            await gw.generate("planner", [5] * 8, GREEDY, episode_id="e1")
        assert gw.stats()["calls"] == 0  # nothing of it was recorded
        again = await gw.generate("planner", [5] * 8, GREEDY, episode_id="e1")
        assert again.generations[0].policy_version == 1 and gw.stats()["calls"] == 1
    finally:
        hook.remove()
        await gw.close()


async def test_a_sync_that_lands_while_a_call_waits_for_the_engine_is_the_version_the_call_gets():
    """docs/gateway.md (Models): a call's version is fixed when its batch starts on the engine. A call queued
    behind a weight sync (its owner holds ``backend.lock``) starts on, samples with and records the new version."""
    backend, gw, moved = _own_planner()
    engine = backend.engine
    try:
        before = (await gw.generate("planner", [5] * 8, GREEDY)).generations[0]
        with backend.lock:  # the owner's weight sync
            queued = asyncio.ensure_future(gw.generate("planner", [5] * 8, GREEDY, episode_id="e1"))
            await asyncio.sleep(0.3)  # dispatched, waiting for the engine
            assert not queued.done()
            engine.update_weights("planner", moved, 1)
        got = (await queued).generations[0]
        after = (await gw.generate("planner", [5] * 8, GREEDY)).generations[0]
        assert (before.policy_version, got.policy_version) == (0, 1)
        assert gw.tracker.turn_versions("e1") == {"planner": [1]}
        assert got.response_token_ids == after.response_token_ids  # sampled by version 1's weights
        assert got.response_logprobs == pytest.approx(after.response_logprobs, abs=1e-5)
        assert got.response_logprobs != pytest.approx(before.response_logprobs, abs=1e-4), (
            "versions look alike"
        )
    finally:
        await gw.close()
