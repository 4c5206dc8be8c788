"""StaticCacheRolloutEngine against HFRolloutEngine on the tiny model: same Generations, same contract.

Greedy responses must be the HF engine's token for token with log-probabilities within 1e-4 (they are computed
from logits of the same model through a different cache, so they differ by float rounding only); sampled responses
are checked by invariants (raw log-probabilities, top-k, reproducible seeds) since their draws may differ once rows
leave the batch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from marti.errors import FailedPreconditionError, InvalidArgumentError
from services.trainer.models.loading import build_tiny_model, load_tokenizer
from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout
from services.trainer.rollout import AgentModel, HFRolloutEngine, SamplingParams
from services.trainer.rollout.engines.static import (
    StaticCacheRolloutEngine,
    _PreallocatedLayer,
    draw,
    sample_tokens,
)

LOGPROB_ATOL = 1e-4
ROOT = Path(__file__).resolve().parents[5]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture()
def pair(tok):
    """(hf, static) engines over the same two models (agents a and b)."""
    agents = {
        "a": AgentModel(build_tiny_model(tok, seed=0), tok),
        "b": AgentModel(build_tiny_model(tok, seed=1), tok),
    }
    return HFRolloutEngine(agents), StaticCacheRolloutEngine(agents)


def _chat(tok, content="Tell me a story"):
    return list(
        tok.apply_chat_template(
            [{"role": "user", "content": content}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
    )


def _same(hf_gens, st_gens):
    assert len(hf_gens) == len(st_gens)
    for h, s in zip(hf_gens, st_gens, strict=True):
        assert s.prompt_token_ids == h.prompt_token_ids
        assert s.response_token_ids == h.response_token_ids
        assert s.text == h.text and s.finish_reason == h.finish_reason
        assert s.policy_version == h.policy_version and s.agent_id == h.agent_id
        assert s.response_logprobs == pytest.approx(h.response_logprobs, abs=LOGPROB_ATOL)


def _recompute(model, prompt, response):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return logp, logp.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


def test_greedy_generations_equal_the_hf_engines(pair, tok):
    hf, st = pair
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], _chat(tok), "Once upon a time", [13, 14, 15]]
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    for agent in ("a", "b"):
        _same(hf.generate(agent, prompts, params), st.generate(agent, prompts, params))
    assert st.last_stats["path"] == "eager"


def test_logprobs_are_the_raw_model_distribution_under_filtered_sampling(pair):
    _, st = pair
    model = st._agents["a"].model
    params = SamplingParams(max_new_tokens=6, temperature=0.7, top_k=20, top_p=0.9, seed=3)
    for g in st.generate("a", [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]], params):
        assert len(g.response_token_ids) == len(g.response_logprobs) == 6 and g.finish_reason == "length"
        logp, ref = _recompute(model, g.prompt_token_ids, g.response_token_ids)
        assert torch.allclose(torch.tensor(g.response_logprobs), ref, atol=LOGPROB_ATOL)
        ranks = (logp > ref.unsqueeze(-1) + 1e-6).sum(-1)
        assert (ranks < 20).all(), "a token outside the top 20 was drawn"


def test_seeded_sampling_is_reproducible_and_seed_sensitive(pair):
    _, st = pair
    prompts = [[5, 6, 7]] * 3
    a1, a2, a3 = (st.generate("a", prompts, SamplingParams(max_new_tokens=8, seed=s)) for s in (1, 1, 2))
    assert [g.response_token_ids for g in a1] == [g.response_token_ids for g in a2]
    assert [g.response_token_ids for g in a1] != [g.response_token_ids for g in a3]
    before = torch.random.get_rng_state()
    st.generate("a", prompts, SamplingParams(max_new_tokens=4, seed=5))
    assert torch.equal(before, torch.random.get_rng_state()), "a seeded call disturbed the global RNG"


def test_stop_strings_end_and_cut_as_the_hf_engine(pair, tok):
    hf, st = pair
    full = st.generate("a", [[5, 6, 7]], SamplingParams(max_new_tokens=12, temperature=0.0))[0]
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    assert stop.strip(), f"need a visible stop string, got {full.text!r}"
    prompts = [[5, 6, 7], [40, 41, 42, 43], _chat(tok), [5, 6, 7]]
    for stops in ((stop,), ("\n\n",), ("\n\n", " time")):
        params = SamplingParams(max_new_tokens=12, temperature=0.0, stop=stops)
        gens = st.generate("a", prompts, params)
        _same(hf.generate("a", prompts, params), gens)
    cut = st.generate("a", [[5, 6, 7]], SamplingParams(max_new_tokens=12, temperature=0.0, stop=(stop,)))[0]
    assert cut.finish_reason == "stop" and stop not in cut.text and full.text.startswith(cut.text)
    assert cut.response_token_ids == full.response_token_ids[: len(cut.response_token_ids)]
    assert len(cut.response_token_ids) < len(full.response_token_ids)


def test_max_tokens_and_max_model_len(tok):
    agents = {"a": AgentModel(build_tiny_model(tok), tok)}
    st = StaticCacheRolloutEngine(agents, max_model_len=10)
    g = st.generate("a", [[5] * 6], SamplingParams(max_new_tokens=4, temperature=0.0))[0]
    assert len(g.response_token_ids) == 4 and g.finish_reason == "length"
    one = st.generate("a", [[5] * 6], SamplingParams(max_new_tokens=1, temperature=0.0))[0]
    assert one.response_token_ids == g.response_token_ids[:1] and st.last_stats["steps"] == 0
    with pytest.raises(InvalidArgumentError, match="max_model_len 10"):
        st.generate("a", [[5] * 7], SamplingParams(max_new_tokens=4))


def test_eos_ends_rows_and_finished_rows_leave_the_batch(pair):
    hf, st = pair
    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    prompts = [[5, 6, 7], [40, 41, 42, 43, 44], [11, 12], [13, 14, 15, 16]]
    first = st.generate("a", prompts[:1], params)[0].response_token_ids[0]
    model = st._agents["a"].model
    model.generation_config.eos_token_id = [first, st._agents["a"].tokenizer.eos_token_id]
    hf_gens, st_gens = hf.generate("a", prompts, params), st.generate("a", prompts, params)
    _same(hf_gens, st_gens)
    assert st_gens[0].response_token_ids == [first] and st_gens[0].finish_reason == "stop"
    if any(g.finish_reason == "length" for g in st_gens):  # row 0 ended at once while others ran on
        assert st.last_stats["compactions"] >= 1
        assert st.last_stats["row_steps"] < len(prompts) * st.last_stats["steps"]


def test_repeated_prompts_n_samples_prefill_once_and_match(pair, tok):
    hf, st = pair
    chat = _chat(tok)
    prompts = [chat] * 3 + [[5, 6, 7]] * 2 + [[11, 12]]  # n = 3, 2 and 1 samples of three prompts
    params = SamplingParams(max_new_tokens=8, temperature=0.0)
    gens = st.generate("a", prompts, params)
    assert st.last_stats["prefill_rows"] == 3
    _same(hf.generate("a", prompts, params), gens)
    sampled = st.generate("a", prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=0))
    assert len({tuple(g.response_token_ids) for g in sampled[:3]}) > 1, (
        "the n samples of one prompt are equal"
    )
    unshared = StaticCacheRolloutEngine(dict(st._agents), share_prompt_prefix=False)
    _same(gens, unshared.generate("a", prompts, params))
    assert unshared.last_stats["prefill_rows"] == len(prompts)


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers"])
def test_prompts_that_start_alike_prefill_their_head_once_and_match(pair, tok, lean):
    hf, _ = pair
    st = StaticCacheRolloutEngine(dict(hf._agents), lean=lean)
    observation = list(range(20, 36))  # a chain's later agent: one observation, messages of other lengths
    prompts = [observation + m for m in ([41, 42, 43], [44], [45, 46], [47, 48, 49, 50], [51, 52])]
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    gens = st.generate("a", prompts, params)
    assert st.last_stats["forward"] == ("lean" if lean else "transformers")
    assert st.last_stats["prefill_rows"] == 1  # the observation's 16 columns once, then 5 rows of 4
    assert st.last_stats["prefill_tokens"] == 16 + 5 * 4
    _same(hf.generate("a", prompts, params), gens)
    unshared = StaticCacheRolloutEngine(dict(hf._agents), share_prompt_prefix=False, lean=lean)
    _same(gens, unshared.generate("a", prompts, params))
    assert unshared.last_stats["prefill_tokens"] == 5 * 20


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "transformers"])
def test_rows_end_and_leave_the_batch_after_a_head_shared_prefill(pair, tok, lean):
    hf, _ = pair
    observation = list(range(20, 36))  # a one-token prompt beside them: its head is padding only
    prompts = [observation + m for m in ([41, 42, 43], [44], [45, 46], [47, 48, 49, 50], [51, 52])] + [[7]]
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=7, stop=["o"])
    shared = StaticCacheRolloutEngine(dict(hf._agents), lean=lean)
    gens = shared.generate("a", prompts, params)
    stats = shared.last_stats
    assert stats["prefill_tokens"] == 2 * 16 + 6 * 4 and stats["compactions"] >= 2, stats
    assert len({len(g.response_token_ids) for g in gens}) > 2  # rows ended at different steps
    _same(
        StaticCacheRolloutEngine(dict(hf._agents), share_prompt_prefix=False, lean=lean).generate(
            "a", prompts, params
        ),
        gens,
    )


def test_batches_split_at_max_batch_size_keep_order(tok):
    st = StaticCacheRolloutEngine({"a": AgentModel(build_tiny_model(tok), tok)}, max_batch_size=2)
    prompts = [[i + 5, i + 6] for i in range(5)]
    gens = st.generate("a", prompts, SamplingParams(max_new_tokens=2, temperature=0.0))
    assert [g.prompt_token_ids for g in gens] == prompts


def test_update_weights_moves_one_agent_and_bumps_its_version(pair, tok):
    hf, st = pair
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    before_a, before_b = (st.generate(a, [[5, 6, 7]], params)[0] for a in ("a", "b"))
    st.update_weights("a", build_tiny_model(tok, seed=9).state_dict(), policy_version=3)
    assert st.policy_version("a") == 3 and st.policy_version("b") == 0
    after_a, after_b = (st.generate(a, [[5, 6, 7]], params)[0] for a in ("a", "b"))
    assert after_a.policy_version == 3 and after_a.response_logprobs != before_a.response_logprobs
    assert after_b.policy_version == 0 and after_b.response_logprobs == before_b.response_logprobs
    with pytest.raises(FailedPreconditionError):
        st.update_weights("a", {}, policy_version=2)
    with pytest.raises(InvalidArgumentError, match="not in the model"):
        st.update_weights("a", {"nope.weight": torch.zeros(1)}, policy_version=4)


def _lora_policy():
    return MultiAgentPolicy(
        PolicyLayout(mode="lora", agents=(AgentSpec("a", "tiny-llama"), AgentSpec("b", "tiny-llama")))
    )


def test_lora_agents_get_their_own_adapters_and_syncs(tok):
    policy = _lora_policy()
    st = StaticCacheRolloutEngine.from_policy(policy)
    hf = HFRolloutEngine.from_policy(policy)
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    prompts = [[5, 6, 7], [40, 41, 42]]
    base_a, base_b = st.generate("a", prompts, params), st.generate("b", prompts, params)
    with torch.no_grad():
        for p in policy.parameters("a"):
            p.add_(torch.randn_like(p) * 0.5)
    sync = policy.state_for_sync("a")
    assert sync and all("lora_" in k for k in sync)
    version = policy.bump_version("a")
    st.update_weights("a", sync, version)
    hf.update_weights("a", sync, version)
    new_a, new_b = st.generate("a", prompts, params), st.generate("b", prompts, params)
    assert (st.policy_version("a"), st.policy_version("b")) == (1, 0)
    assert [g.policy_version for g in new_a] == [1, 1] and [g.policy_version for g in new_b] == [0, 0]

    def flat(gens):
        return [v for g in gens for v in g.response_logprobs]

    assert flat(new_a) != pytest.approx(flat(base_a), abs=1e-4)
    _same(base_b, new_b)  # b's adapter untouched
    assert flat(new_a) != pytest.approx(flat(new_b), abs=1e-4), "two adapters gave the same outputs"
    for agent, gens in (("a", new_a), ("b", new_b)):
        _same(hf.generate(agent, prompts, params), gens)
        ids = torch.tensor([gens[0].prompt_token_ids + gens[0].response_token_ids])
        lp = policy.logprobs(agent, ids, torch.ones_like(ids), torch.ones(1, 6))
        assert torch.allclose(lp[0].detach(), torch.tensor(gens[0].response_logprobs), atol=LOGPROB_ATOL)


def test_pinned_serves_an_older_version_and_restores(pair, tok):
    _, st = pair
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    old = {k: v.clone() for k, v in st._agents["a"].model.state_dict().items()}
    base = st.generate("a", [[5, 6, 7]], params)[0]
    st.update_weights("a", build_tiny_model(tok, seed=9).state_dict(), policy_version=1)
    with st.pinned("a", old, 0):
        pinned = st.generate("a", [[5, 6, 7]], params)[0]
    assert pinned.policy_version == 0 and pinned.response_logprobs == base.response_logprobs
    assert st.generate("a", [[5, 6, 7]], params)[0].policy_version == 1


def test_sample_tokens_greedy_top_k_and_top_p():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 0.0]])
    new, lp = sample_tokens(logits, SamplingParams(temperature=0.0))
    assert new.tolist() == [1, 0]
    assert torch.allclose(lp, torch.log_softmax(logits, -1).gather(-1, new[:, None]).squeeze(-1))
    torch.manual_seed(0)
    for _ in range(20):
        top1, _ = sample_tokens(logits, SamplingParams(top_k=1))
        assert top1.tolist() == [1, 0]
        nucleus, _ = sample_tokens(logits, SamplingParams(top_p=0.5))  # row 0: only token 1 holds >= 0.5
        assert nucleus[0].item() == 1
        two, _ = sample_tokens(logits, SamplingParams(top_k=2, temperature=2.0))
        assert two[0].item() in (1, 3)


def test_preallocated_layer_appends_in_place_selects_rows_and_crops():
    layer = _PreallocatedLayer(capacity=5)
    k = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).view(2, 1, 3, 2)  # (B, H, q, D)
    keys, values = layer.update(k, -k)
    assert keys.shape == (2, 1, 3, 2) and layer.get_seq_length() == 3 and layer.get_mask_sizes(1) == (4, 0)
    buffer = layer._k.data_ptr()
    keys, _ = layer.update(k[:, :, :1] + 100, -k[:, :, :1])
    assert layer._k.data_ptr() == buffer, "an append reallocated the cache"
    assert torch.equal(keys[:, :, 3], k[:, :, 0] + 100)
    layer.batch_select_indices(torch.tensor([1, 1, 0]))
    assert torch.equal(layer.keys[0], layer.keys[1]) and torch.equal(layer.keys[2, :, :3], k[0])
    layer.crop(-1)
    assert layer.get_seq_length() == 3
    with pytest.raises(InvalidArgumentError, match="overflow"):
        layer.update(torch.zeros(3, 1, 3, 2), torch.zeros(3, 1, 3, 2))


def test_build_rollout_engine_builds_it_for_hf_static():
    from marti.config import load_config
    from services.trainer.rollout.engines.generation import build_rollout_engine, generation_config

    cfg = generation_config(load_config(ROOT / "examples" / "tiny.yaml"))
    policy = MultiAgentPolicy(PolicyLayout(mode="lora", agents=(AgentSpec("agent_1", "tiny-llama"),)))
    engine = build_rollout_engine(cfg, policy, ["agent_1"], "cpu", copy_weights=False, engine="hf_static")
    assert isinstance(engine, StaticCacheRolloutEngine) and engine.compile is None
    g = engine.generate("agent_1", [[5, 6, 7]], SamplingParams(max_new_tokens=2, temperature=0.0))[0]
    assert len(g.response_token_ids) == 2


def test_static_cache_path_matches_the_hf_engine_without_compiling(pair, monkeypatch):
    """The compiled path's shapes and cache handling (padded batch, bucketed static cache reset between calls),
    with ``torch.compile`` replaced by the identity so it runs in seconds."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    hf, _ = pair
    st = StaticCacheRolloutEngine(dict(hf._agents), compile=True)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    for _ in range(2):
        gens = st.generate("a", prompts, params)
        assert st.last_stats["path"] == "compiled" and st.last_stats["prefill_rows"] == 4
        _same(hf.generate("a", prompts, params), gens)
    assert len(st._static_caches) == 1
    _same(hf.generate("b", prompts[:1], params), st.generate("b", prompts[:1], params))


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_compiled_decoding_matches_the_eager_loop(pair, tok):
    """The compiled path (static cache, ``torch.compile``; CUDA graphs only on CUDA) on the CPU: minutes of
    compilation, hence slow."""
    hf, _ = pair
    st = StaticCacheRolloutEngine(dict(hf._agents), compile=True)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    params = SamplingParams(max_new_tokens=10, temperature=0.0)
    for _ in range(2):  # the second call reuses the bucket's cache and graph
        gens = st.generate("a", prompts, params)
        assert st.last_stats["path"] == "compiled" and st.last_stats["prefill_rows"] == 4
        _same(hf.generate("a", prompts, params), gens)


def test_draw_has_the_softmax_distribution_and_never_draws_a_zero():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 0.0, 0.0, 1.0]]).repeat(10_000, 1)  # (20000, 4)
    torch.manual_seed(0)
    new = draw(probs)
    first = torch.bincount(new[0::2], minlength=4).float() / 10_000
    assert torch.all((first - probs[0]).abs() <= 4 * (probs[0] * (1 - probs[0]) / 10_000).sqrt() + 1e-9)
    assert first[1] == 0 and new[1::2].eq(3).all()
    torch.manual_seed(0)
    assert torch.equal(draw(probs), new)  # the global RNG: seeded draws repeat


def test_draw_at_the_rounding_edge_stays_on_a_token_of_positive_probability(monkeypatch):
    # u * total can round up to the total; the search then lands past the last token of positive mass
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.ones(*shape, dtype=kw.get("dtype")))
    assert draw(torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.2, 0.0, 0.8, 0.0]])).tolist() == [1, 2]


def test_draw_keeps_tiny_probabilities_and_refuses_a_row_without_mass():
    """The cumulative sum is float64: a token of probability 1e-9 after a large mass keeps its own interval (in
    float32 it had none); a NaN or all-zero row (a diverged model) is refused naming the row."""
    probs = torch.tensor([[1.0] + [1e-9] * 9])  # (1, 10)
    cdf = probs.cumsum(-1, dtype=torch.float64)
    assert bool((cdf[0, 1:] > cdf[0, :-1]).all())
    torch.manual_seed(0)
    assert draw(probs.repeat(1000, 1)).eq(0).all()
    with pytest.raises(FloatingPointError, match=r"rows \[1, 2\]"):
        draw(torch.tensor([[0.5, 0.5], [float("nan"), 0.5], [0.0, 0.0]]))
    with pytest.raises(FloatingPointError, match=r"rows \[0\]"):
        sample_tokens(torch.full((1, 4), float("nan")), SamplingParams())


def test_auto_is_hf_static_on_the_cpu_and_vllm_or_hf_on_cuda(monkeypatch):
    """``rollout.engine: auto`` (the default) builds the static-cache engine on the CPU, where it is the faster
    (docs/benchmarks.md "Rollout engines"); on CUDA vLLM when installed, else ``hf``."""
    from marti.config import load_config
    from services.trainer.rollout.engines import generation
    from services.trainer.rollout.engines.generation import build_rollout_engine, generation_config

    cfg = generation_config(load_config(ROOT / "examples" / "tiny.yaml", ["rollout.engine=auto"]))
    policy = MultiAgentPolicy(PolicyLayout(mode="lora", agents=(AgentSpec("agent_1", "tiny-llama"),)))
    engine = build_rollout_engine(cfg, policy, ["agent_1"], "cpu", copy_weights=False)
    assert type(engine) is StaticCacheRolloutEngine
    monkeypatch.setattr(generation, "vllm_available", lambda: False)
    assert generation.resolve_auto_engine("cuda") == "hf"
    monkeypatch.setattr(generation, "vllm_available", lambda: True)
    assert generation.resolve_auto_engine("cuda") == "vllm"
