"""The gateway facade over a real tiny-model engine: model names, limits, traces into the sink."""

from __future__ import annotations

import pytest

from marti.errors import InvalidArgumentError, NotFoundError, UnavailableError
from marti.inference import SamplingParams
from services.gateway.core.gateway import Gateway
from services.gateway.core.limits import GatewayLimits
from services.trainer.gateway_backend import EngineBackend
from services.trainer.models import build_tiny_model, load_tokenizer
from services.trainer.rollout.hf import AgentModel, HFRolloutEngine

S = SamplingParams(max_new_tokens=4, seed=1)


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
    with pytest.raises(UnavailableError, match="store down"):
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
