"""HF rollout engine on the tiny model: batching, logprob semantics, stop handling, versioned weight sync."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from marti.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError
from services.trainer.models.loading import build_tiny_model, load_tokenizer
from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout
from services.trainer.rollout import AgentModel, HFRolloutEngine, SamplingParams, vllm_available


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture()
def engine(tok):
    return HFRolloutEngine(
        {
            "a": AgentModel(build_tiny_model(tok, seed=0), tok),
            "b": AgentModel(build_tiny_model(tok, seed=1), tok),
        }
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_new_tokens": 0},
        {"temperature": -0.01},
        {"top_p": 0.0},
        {"top_p": 1.01},
        {"top_k": -1},
        {"stop": ("",)},
    ],
)
def test_sampling_params_reject_values_outside_their_domain(kwargs):
    with pytest.raises(InvalidArgumentError) as err:
        SamplingParams(**kwargs)
    assert next(iter(kwargs)) in str(err.value)


def test_sampling_params_accept_their_edges():
    p = SamplingParams(max_new_tokens=1, temperature=0.0, top_p=1.0, top_k=0, stop="x")
    assert p.stop == ("x",)


def _recompute_logprobs(model, prompt, response):
    """Independent reference: full forward without padding, log_softmax over the whole vocabulary."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return torch.stack([logp[len(prompt) - 1 + j, t] for j, t in enumerate(response)])


def test_logprobs_are_raw_temperature_one_even_with_filtered_sampling(engine, tok):
    model = engine._agents["a"].model
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]  # different lengths: left padding matters
    gens = engine.generate("a", prompts, SamplingParams(max_new_tokens=6, temperature=0.7, top_k=20, seed=3))
    assert [g.prompt_token_ids for g in gens] == prompts
    for g in gens:
        assert len(g.response_logprobs) == len(g.response_token_ids) == 6
        assert g.finish_reason == "length" and g.agent_id == "a" and g.policy_version == 0
        ref = _recompute_logprobs(model, g.prompt_token_ids, g.response_token_ids)
        assert torch.allclose(torch.tensor(g.response_logprobs), ref, atol=1e-4)


def test_left_padded_batch_matches_one_by_one_greedy(engine):
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13]]
    params = SamplingParams(max_new_tokens=5, temperature=0.0)
    batched = engine.generate("a", prompts, params)
    single = [engine.generate("a", [p], params)[0] for p in prompts]
    for b, s in zip(batched, single, strict=True):
        assert b.response_token_ids == s.response_token_ids
        assert torch.allclose(torch.tensor(b.response_logprobs), torch.tensor(s.response_logprobs), atol=1e-4)


def test_seeded_sampling_is_reproducible_and_seed_sensitive(engine):
    prompts = [[5, 6, 7]] * 3
    a1 = engine.generate("a", prompts, SamplingParams(max_new_tokens=8, seed=1))
    a2 = engine.generate("a", prompts, SamplingParams(max_new_tokens=8, seed=1))
    a3 = engine.generate("a", prompts, SamplingParams(max_new_tokens=8, seed=2))
    assert [g.response_token_ids for g in a1] == [g.response_token_ids for g in a2]
    assert [g.response_token_ids for g in a1] != [g.response_token_ids for g in a3]


def test_batches_split_at_max_batch_size_keep_order(tok):
    eng = HFRolloutEngine({"a": AgentModel(build_tiny_model(tok), tok)}, max_batch_size=2)
    prompts = [[i + 5, i + 6] for i in range(5)]
    gens = eng.generate("a", prompts, SamplingParams(max_new_tokens=2, temperature=0.0))
    assert [g.prompt_token_ids for g in gens] == prompts
    with pytest.raises(InvalidArgumentError):
        HFRolloutEngine({"a": AgentModel(build_tiny_model(tok), tok)}, max_batch_size=0)


def test_prompt_plus_new_tokens_bounded_by_max_model_len(tok):
    eng = HFRolloutEngine({"a": AgentModel(build_tiny_model(tok), tok)}, max_model_len=10)
    assert (
        len(
            eng.generate("a", [[5] * 6], SamplingParams(max_new_tokens=4, temperature=0.0))[
                0
            ].response_token_ids
        )
        == 4
    )
    with pytest.raises(InvalidArgumentError) as err:
        eng.generate("a", [[5] * 7], SamplingParams(max_new_tokens=4))
    assert "max_model_len 10" in str(err.value)


def test_eos_ends_a_response_with_finish_reason_stop(engine):
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    first = engine.generate("a", [[5, 6, 7]], params)[0].response_token_ids[0]
    model = engine._agents["a"].model
    model.generation_config.eos_token_id = [first, engine._agents["a"].tokenizer.eos_token_id]
    g = engine.generate("a", [[5, 6, 7]], params)[0]
    assert g.response_token_ids == [first] and g.finish_reason == "stop" and len(g.response_logprobs) == 1


def test_stop_string_cuts_text_and_keeps_the_completing_token(engine):
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    full = engine.generate("a", [[5, 6, 7]], params)[0]
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    assert stop.strip(), f"need a visible stop string, got {full.text!r}"
    g = engine.generate("a", [[5, 6, 7]], SamplingParams(max_new_tokens=12, temperature=0.0, stop=(stop,)))[0]
    assert g.finish_reason == "stop" and stop not in g.text and full.text.startswith(g.text)
    assert g.response_token_ids == full.response_token_ids[: len(g.response_token_ids)]
    assert len(g.response_token_ids) < len(full.response_token_ids)


def test_chat_and_text_prompts(engine, tok):
    chat = [{"role": "user", "content": "What is 2+2?"}]
    g_chat, g_text = engine.generate(
        "a", [chat, "hello there"], SamplingParams(max_new_tokens=2, temperature=0.0)
    )
    expected = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert g_chat.prompt_token_ids == list(expected)
    assert g_text.prompt_token_ids == tok("hello there", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("prompts", [[], [[]], [[49152]], [[-1]], [[{"content": "no role"}]]])
def test_bad_prompts_are_rejected(engine, prompts):
    with pytest.raises(InvalidArgumentError):
        engine.generate("a", prompts)


def test_unknown_agent(engine):
    with pytest.raises(NotFoundError):
        engine.generate("zz", [[1]])
    with pytest.raises(NotFoundError):
        engine.policy_version("zz")


def test_update_weights_tags_versions_and_validates(engine, tok):
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    before = engine.generate("a", [[5, 6, 7]], params)[0]
    new_weights = build_tiny_model(tok, seed=9).state_dict()
    engine.update_weights("a", new_weights, policy_version=3)
    assert engine.policy_version("a") == 3 and engine.policy_version("b") == 0
    after = engine.generate("a", [[5, 6, 7]], params)[0]
    assert after.policy_version == 3 and before.policy_version == 0
    assert after.response_logprobs != before.response_logprobs
    engine.update_weights("a", {}, policy_version=3)  # same version again is allowed (re-sync)
    with pytest.raises(FailedPreconditionError):
        engine.update_weights("a", {}, policy_version=2)
    with pytest.raises(InvalidArgumentError, match="not in the model"):
        engine.update_weights("a", {"nope.weight": torch.zeros(1)}, policy_version=4)
    with pytest.raises(InvalidArgumentError, match="shape"):
        engine.update_weights("a", {"model.norm.weight": torch.zeros(3)}, policy_version=4)
    with pytest.raises(InvalidArgumentError):
        engine.update_weights("a", {}, policy_version=-1)


def _policy(mode, tok_agents=("a", "b")):
    return MultiAgentPolicy(
        PolicyLayout(mode=mode, agents=tuple(AgentSpec(n, "tiny-llama") for n in tok_agents))
    )


def test_engine_from_policy_copies_and_syncs(tok):
    policy = _policy("per_agent")
    eng = HFRolloutEngine.from_policy(policy)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    base = eng.generate("a", [[5, 6, 7]], params)[0]
    with torch.no_grad():
        for p in policy.parameters("a"):
            p.add_(torch.randn_like(p) * 0.5)
    assert (
        eng.generate("a", [[5, 6, 7]], params)[0].response_logprobs == base.response_logprobs
    )  # owns a copy
    eng.update_weights("a", policy.state_for_sync("a"), policy.bump_version("a"))
    synced = eng.generate("a", [[5, 6, 7]], params)[0]
    assert synced.policy_version == 1 and synced.response_logprobs != base.response_logprobs
    ids = torch.tensor([synced.prompt_token_ids + synced.response_token_ids])
    lp = policy.logprobs("a", ids, torch.ones_like(ids), torch.ones(1, 4))
    assert torch.allclose(lp[0].detach(), torch.tensor(synced.response_logprobs), atol=1e-4)


def test_shared_policy_sync_moves_every_agent_on_it():
    eng = HFRolloutEngine.from_policy(_policy("shared"))
    eng.update_weights("a", {}, policy_version=2)
    assert eng.policy_version("b") == 2


def test_lora_engine_switches_adapters_per_agent():
    policy = _policy("lora")
    eng = HFRolloutEngine.from_policy(policy)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    base_a = eng.generate("a", [[5, 6, 7]], params)[0]
    base_b = eng.generate("b", [[5, 6, 7]], params)[0]
    assert base_a.response_logprobs == pytest.approx(base_b.response_logprobs, abs=1e-6)  # LoRA B starts at 0
    with torch.no_grad():
        for p in policy.parameters("a"):
            p.add_(torch.randn_like(p) * 0.5)
    sync = policy.state_for_sync("a")
    assert sync and all("lora_" in k for k in sync)
    eng.update_weights("a", sync, policy.bump_version("a"))
    new_a = eng.generate("a", [[5, 6, 7]], params)[0]
    new_b = eng.generate("b", [[5, 6, 7]], params)[0]
    assert new_a.response_logprobs != pytest.approx(base_a.response_logprobs, abs=1e-4)
    assert new_b.response_logprobs == pytest.approx(base_b.response_logprobs, abs=1e-6)
    assert (eng.policy_version("a"), eng.policy_version("b")) == (1, 0)
    with pytest.raises(InvalidArgumentError, match="adapter"):
        eng.update_weights("a", {"base_model.model.bogus.lora_A.weight": torch.zeros(1)}, 2)


@pytest.mark.skipif(vllm_available(), reason="vllm installed: the GPU check covers it")
def test_vllm_engine_without_vllm_fails_with_a_clear_error():
    from services.trainer.rollout.engines.vllm_engine import VLLMRolloutEngine

    with pytest.raises(FailedPreconditionError, match="vllm"):
        VLLMRolloutEngine({"a": "tiny-llama"})


def test_vllm_serves_lora_agents_as_requests_and_refuses_per_agent_models_it_cannot_tell_apart():
    from services.trainer.rollout.engines.vllm_engine import VLLMAgent, vllm_agents_for

    lora = MultiAgentPolicy(
        PolicyLayout(mode="lora", agents=(AgentSpec("a", "tiny-llama"), AgentSpec("b", "tiny-llama")))
    )
    agents = vllm_agents_for(lora, ["a", "b"])
    assert all(s.lora and s.model == "tiny-llama" for s in agents.values())
    assert agents["a"].lora_config == {
        "r": 8,
        "lora_alpha": 16,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    }
    per_agent = MultiAgentPolicy(
        PolicyLayout(mode="per_agent", agents=(AgentSpec("a", "tiny-llama"), AgentSpec("b", "tiny-llama")))
    )
    assert vllm_agents_for(per_agent, ["a"]) == {"a": VLLMAgent("tiny-llama")}
    with pytest.raises(InvalidArgumentError, match="share pretrain_model 'tiny-llama'"):
        vllm_agents_for(per_agent, ["a", "b"])


@pytest.mark.skipif(vllm_available(), reason="vllm installed: the GPU check covers it")
def test_a_vllm_rollout_engine_without_vllm_names_the_package():
    from marti.config import load_config
    from services.trainer.rollout.engines.generation import build_rollout_engine, generation_config

    cfg = generation_config(load_config(Path(__file__).resolve().parents[4] / "examples" / "tiny.yaml"))
    policy = MultiAgentPolicy(PolicyLayout(mode="lora", agents=(AgentSpec("agent_1", "tiny-llama"),)))
    with pytest.raises(FailedPreconditionError, match="vllm"):
        build_rollout_engine(cfg, policy, ["agent_1"], "cpu", copy_weights=False, engine="vllm")


# --- where a response ends: stop strings within the generated text only, padding never kept ---------------------


def _chat_prompt(tok, content="Tell me a story"):
    """SmolLM2's chat prompt: it ends in "\\n" (after ``<|im_start|>assistant``)."""
    ids = tok.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert tok.decode(ids).endswith("\n")
    return list(ids)


def _check_ends(engine, agent_id, gens, params):
    """Invariants of every generation: it ends exactly where its first eos or generated stop string is, its
    log-probabilities are the model's, and (with ``top_k``) every token is one the sampler could have drawn: a
    padding token ``generate`` appended after the row ended is not."""
    spec = engine._agents[agent_id]
    tok, eos = spec.tokenizer, set(engine._eos_ids(spec))

    def dec(ids):
        return tok.decode(ids, skip_special_tokens=True)

    def has_stop(ids):
        return any(s in dec(ids) for s in params.stop)

    for g in gens:
        ids = g.response_token_ids
        assert ids and len(g.response_logprobs) == len(ids)
        assert not any(t in eos for t in ids[:-1]), "a token after eos (padding) was kept"
        assert not has_stop(ids[:-1]), "the response runs past a completed stop string"
        if g.finish_reason == "length":
            assert len(ids) == params.max_new_tokens and ids[-1] not in eos and not has_stop(ids)
            assert g.text == dec(ids)
        else:
            assert g.finish_reason == "stop"
            assert ids[-1] in eos or has_stop(ids), f"stop without eos or a generated stop string: {ids}"
            if has_stop(ids):
                full = dec(ids)
                assert g.text == full[: min(full.find(s) for s in params.stop if s in full)]
            else:
                assert g.text == dec(ids)
        with torch.no_grad():
            logits = spec.model(input_ids=torch.tensor([g.prompt_token_ids + ids])).logits[0].float()
        logp = torch.log_softmax(logits[len(g.prompt_token_ids) - 1 : -1], dim=-1)  # (A, V)
        ref = logp.gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(torch.tensor(g.response_logprobs), ref, atol=1e-4)
        if params.top_k:
            ranks = (logp > ref.unsqueeze(-1) + 1e-6).sum(-1)
            assert (ranks < params.top_k).all(), f"a token outside the top {params.top_k} was kept: {ids}"


def test_a_stop_string_never_matches_across_the_prompt_boundary(engine, tok):
    # The prompt ends in "\n" and the tiny model's greedy answer starts with "\n": transformers' stop_strings
    # matched "\n\n" over the boundary and ended the response after that one token.
    prompt = _chat_prompt(tok)
    free = engine.generate("a", [prompt], SamplingParams(max_new_tokens=8, temperature=0.0))[0]
    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop=("\n\n",))
    g = engine.generate("a", [prompt], params)[0]
    _check_ends(engine, "a", [g], params)
    assert g.response_token_ids == free.response_token_ids[: len(g.response_token_ids)]
    if "\n\n" not in free.text:
        assert g.finish_reason == "length" and g.response_token_ids == free.response_token_ids
    if tok.decode(free.response_token_ids[:1]) == "\n":  # the case the bug was found on
        assert g.response_token_ids != free.response_token_ids[:1]


def test_a_stop_string_spanning_prompt_and_response_is_not_a_match(engine, tok):
    for prompt in ([5, 6, 7], [40, 41, 42, 43], _chat_prompt(tok)):
        free = engine.generate("a", [prompt], SamplingParams(max_new_tokens=6, temperature=0.0))[0]
        first = tok.decode(free.response_token_ids[:1], skip_special_tokens=True)
        stop = tok.decode(prompt)[-2:] + first  # the prompt's end plus the first generated token
        if not first or stop in free.text:
            continue
        g = engine.generate("a", [prompt], SamplingParams(max_new_tokens=6, temperature=0.0, stop=(stop,)))[0]
        assert g.finish_reason == "length" and g.response_token_ids == free.response_token_ids
        assert g.text == free.text


def test_seeded_samples_end_only_on_eos_or_a_generated_stop_string(engine, tok):
    # "\n" is the tiny model's favourite token after the chat prompt: with top_k 3 the chat rows often start with
    # it, and rows end early (on "\n\n" within the generated text) while others go on.
    prompts = [_chat_prompt(tok)] * 4 + [[5, 6, 7], "Once upon a time", _chat_prompt(tok, "Hi")]
    model = engine._agents["a"].model
    for seed in range(3):
        for stop in (("\n\n",), ("\n\n", " time")):
            params = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=3, stop=stop, seed=seed)
            _check_ends(engine, "a", engine.generate("a", prompts, params), params)
    model.generation_config.eos_token_id = [tok.eos_token_id, 198]  # "\n" also ends a row
    for seed in range(2):
        params = SamplingParams(max_new_tokens=8, temperature=1.0, top_k=3, stop=("\n\n",), seed=seed)
        _check_ends(engine, "a", engine.generate("a", prompts, params), params)


@pytest.mark.parametrize("share", [True, False])
def test_a_row_that_ends_early_keeps_no_padding(tok, share):
    # tiny-llama pads with eos (id 2): a row ended by a stop string got the pad appended as if it were its eos.
    assert tok.pad_token_id == tok.eos_token_id
    eng = HFRolloutEngine({"a": AgentModel(build_tiny_model(tok, seed=0), tok)}, share_prompt_prefix=share)
    chat, other = _chat_prompt(tok), tok("Once upon a time", add_special_tokens=False)["input_ids"]
    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop=("\n\n",))
    alone = eng.generate("a", [chat], params)[0]
    gens = eng.generate("a", [chat, other, chat], params)  # the repeated prompt takes the shared-prefix path
    _check_ends(eng, "a", gens, params)
    for g in (gens[0], gens[2]):
        assert g.response_token_ids == alone.response_token_ids
        assert g.response_logprobs == pytest.approx(alone.response_logprobs, abs=1e-4)
        assert g.finish_reason == alone.finish_reason and g.text == alone.text
    if alone.finish_reason == "stop" and len(gens[1].response_token_ids) > len(alone.response_token_ids):
        assert tok.pad_token_id not in alone.response_token_ids  # it ended early, while row 1 went on


def test_a_row_ended_by_eos_keeps_only_its_own_eos(engine, tok):
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    first = engine.generate("a", [[5, 6, 7]], params)[0].response_token_ids[0]
    model = engine._agents["a"].model
    model.generation_config.eos_token_id = [first]
    gens = engine.generate("a", [[5, 6, 7], [40, 41, 42, 43, 44]], params)
    assert gens[0].response_token_ids == [first] and gens[0].finish_reason == "stop"
    _check_ends(engine, "a", gens, params)


@pytest.mark.parametrize("temperature", [1e-30, 1e-45, 9e-6])
def test_a_tiny_positive_temperature_is_greedy(engine, temperature):
    prompts = [[5, 6, 7], [11, 12]]
    greedy = engine.generate("a", prompts, SamplingParams(max_new_tokens=6, temperature=0.0))
    tiny = engine.generate("a", prompts, SamplingParams(max_new_tokens=6, temperature=temperature, seed=1))
    for t, g in zip(tiny, greedy, strict=True):
        assert t.response_token_ids == g.response_token_ids
        assert t.response_logprobs == pytest.approx(g.response_logprobs, abs=1e-6)


def test_row_ends_match_the_first_prefix_holding_a_stop_string(tok):
    """The windowed stop check against decoding the whole prefix, on random ids with newlines, multi-byte
    characters split over tokens, and special tokens that decode to nothing."""
    from services.trainer.rollout.engines.hf import _RowEnds

    pool = [198, 1116, 2756, 26411, 23274, 115, 40993, 0, 1, 655, 314, 28, 29, 30] + [0, 1] * 3
    stops = [("\n\n",), ("é\n",), ("本\n\né",), ("日本",), (" time\n", "\n é"), ("\n",)]
    rng = torch.Generator().manual_seed(0)
    prompt = [5, 198]  # ends in "\n"
    for trial in range(300):
        stop = stops[trial % len(stops)]
        n = 24
        gen = [pool[int(i)] for i in torch.randint(len(pool), (n,), generator=rng)]
        crit = _RowEnds(tok, len(prompt), [2], stop)
        for step in range(1, n + 1):
            crit(torch.tensor([prompt + gen[:step]]), None)
        expected = next(
            (
                k
                for k in range(1, n + 1)
                if any(s in tok.decode(gen[:k], skip_special_tokens=True) for s in stop)
            ),
            None,
        )
        assert crit.ends == [expected], (gen, stop)
