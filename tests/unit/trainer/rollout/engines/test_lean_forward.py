"""LeanCausalLM against the transformers forward it replaces in the static engine's eager loop.

Logits of a left-padded prefill and of decode steps fed the same tokens are compared with the model's own forward
over the same cache layout (float32: within 1e-4; bf16: within one bf16 step of the logits' scale, measured equal to
the last bit on the 2-vCPU Xeon); weight changes are followed; unsupported models keep the transformers forward.
"""

from __future__ import annotations

import pytest
import torch

from services.trainer.models.loading import build_tiny_model, load_tokenizer
from services.trainer.rollout import AgentModel, HFRolloutEngine, SamplingParams
from services.trainer.rollout.engines.lean import LeanCausalLM, _attend, supports
from services.trainer.rollout.engines.static import (
    StaticCacheRolloutEngine,
    _preallocated_cache,
    _transformers_forward,
)
from tests.tiny_models import tiny_qwen2

PROMPT, STEPS = 9, 5


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


def _batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids (3, PROMPT), mask (3, PROMPT + STEPS) with rows 0 and 2 left-padded, positions, fed (STEPS, 3))."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (3, PROMPT), generator=gen)
    mask = torch.ones(3, PROMPT + STEPS, dtype=torch.long)
    mask[0, :4] = 0
    mask[2, :1] = 0
    positions = (mask[:, :PROMPT].cumsum(-1) - 1).clamp(min=0)
    fed = torch.randint(5, vocab, (STEPS, 3), generator=gen)
    return ids, mask, positions, fed


def _logits(forward, model, batch) -> torch.Tensor:
    """(STEPS + 1, 3, V) float32 logits of the prefill and of STEPS decode steps fed ``fed``."""
    ids, mask, positions, fed = batch
    cache = _preallocated_cache(model, PROMPT + STEPS)
    with torch.no_grad():
        out = [forward(ids, mask[:, :PROMPT], positions, cache).float()]
        pos = positions[:, -1:] + 1
        for step in range(STEPS):
            out.append(forward(fed[step].unsqueeze(-1), mask[:, : PROMPT + step + 1], pos, cache).float())
            pos = pos + 1
    return torch.stack(out)


def _compare(model) -> tuple[torch.Tensor, torch.Tensor]:
    batch = _batch(model.config.vocab_size)
    plain = _logits(lambda *a: _transformers_forward(model, *a), model, batch)
    return plain, _logits(LeanCausalLM(model), model, batch)


def _bf16_step(logits: torch.Tensor) -> float:
    """One bf16 step (ulp) at the logits' largest magnitude."""
    return float(2.0 ** (torch.floor(torch.log2(logits.abs().max())) - 7))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_logits_equal_the_transformers_forward(tok, dtype):
    model = build_tiny_model(tok, seed=0).to(dtype)
    plain, lean = _compare(model)
    assert torch.isfinite(lean).all()
    atol = 1e-4 if dtype == torch.float32 else _bf16_step(plain)
    torch.testing.assert_close(lean, plain, atol=atol, rtol=0)


def test_qwen2_with_biases_and_an_untied_head(tok):
    model = tiny_qwen2(len(tok))
    plain, lean = _compare(model)
    torch.testing.assert_close(lean, plain, atol=1e-4, rtol=0)


def test_a_padded_row_is_unaffected_by_the_others(tok):
    model = build_tiny_model(tok, seed=0)
    ids, mask, positions, _ = _batch(model.config.vocab_size)
    lean = LeanCausalLM(model)
    batch_logits = lean(ids, mask[:, :PROMPT], positions, _preallocated_cache(model, PROMPT))
    alone = lean(ids[:1, 4:], mask[:1, 4:PROMPT], positions[:1, 4:], _preallocated_cache(model, PROMPT))
    torch.testing.assert_close(batch_logits[:1], alone, atol=1e-4, rtol=0)


def test_weight_changes_are_followed_and_only_their_products_repacked(tok):
    model = build_tiny_model(tok, seed=0)
    reference = build_tiny_model(tok, seed=1)
    lean = LeanCausalLM(model)
    assert lean.refresh() == 0
    with torch.no_grad():
        model.model.layers[1].self_attn.k_proj.weight.copy_(reference.model.layers[1].self_attn.k_proj.weight)
    assert lean.refresh() == 1  # layer 1's fused q/k/v product only
    down = model.model.layers[0].mlp.down_proj
    down.weight.data = reference.model.layers[0].mlp.down_proj.weight.data.clone()
    assert lean.refresh() == 1
    with torch.no_grad():
        for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
            mine.copy_(theirs)
    assert lean.refresh() == 2 * 4 + 1  # every layer's four products and the head
    batch = _batch(model.config.vocab_size)
    expected = _logits(lambda *a: _transformers_forward(reference, *a), reference, batch)
    torch.testing.assert_close(_logits(lean, model, batch), expected, atol=1e-4, rtol=0)


def test_supports_only_what_it_reproduces(tok):
    from peft import LoraConfig, get_peft_model

    assert supports(build_tiny_model(tok, seed=0))
    assert supports(build_tiny_model(tok, seed=0).to(torch.bfloat16))
    assert not supports(build_tiny_model(tok, seed=0).to(torch.float16))
    assert not supports(build_tiny_model(tok, seed=0, attn_implementation="eager"))
    peft_model = get_peft_model(build_tiny_model(tok, seed=0), LoraConfig(r=4, target_modules=["q_proj"]))
    assert not supports(peft_model)
    with pytest.raises(ValueError, match="does not serve PeftModel"):
        LeanCausalLM(peft_model)


def test_a_sliding_window_is_not_supported_by_either_lean_forward(tok):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from services.trainer.models import lean_training

    def qwen2(sliding: bool) -> torch.nn.Module:  # max_window_layers 0: every layer slides when asked to
        cfg = Qwen2Config(
            vocab_size=tok.vocab_size,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            use_sliding_window=sliding,
            sliding_window=8,
            max_window_layers=0,
        )
        return Qwen2ForCausalLM(cfg).eval()

    assert supports(qwen2(False)) and lean_training.supports(qwen2(False))
    assert not supports(qwen2(True)) and not lean_training.supports(
        qwen2(True)
    )  # it would attend past the window


def test_the_engine_runs_the_lean_forward_with_the_transformers_results(tok):
    model = build_tiny_model(tok, seed=0)
    prompts = [[1, 5, 9, 200, 31], [1, 7, 300], [1, 5, 9, 200, 31]]
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    lean = StaticCacheRolloutEngine({"a": AgentModel(model, tok)})
    plain = StaticCacheRolloutEngine({"a": AgentModel(model, tok)}, lean=False)
    hf = HFRolloutEngine({"a": AgentModel(model, tok)})
    lean_gens = lean.generate("a", prompts, greedy)
    assert lean.last_stats["forward"] == "lean"
    plain_gens = plain.generate("a", prompts, greedy)
    assert plain.last_stats["forward"] == "transformers"
    for mine, other in [(lean_gens, plain_gens), (lean_gens, hf.generate("a", prompts, greedy))]:
        for g, h in zip(mine, other, strict=True):
            assert g.response_token_ids == h.response_token_ids
            torch.testing.assert_close(
                torch.tensor(g.response_logprobs), torch.tensor(h.response_logprobs), atol=1e-4, rtol=0
            )


def test_the_engine_samples_with_weights_loaded_by_update_weights(tok):
    engine = StaticCacheRolloutEngine({"a": AgentModel(build_tiny_model(tok, seed=0), tok)})
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    prompts = [[1, 5, 9, 200, 31]]
    before = engine.generate("a", prompts, greedy)[0]
    other = build_tiny_model(tok, seed=1)
    engine.update_weights("a", other.state_dict(), policy_version=1)
    after = engine.generate("a", prompts, greedy)[0]
    expected = HFRolloutEngine({"a": AgentModel(other, tok)}).generate("a", prompts, greedy)[0]
    assert after.response_token_ids == expected.response_token_ids
    assert after.response_token_ids != before.response_token_ids


def test_a_prompt_run_in_two_parts_equals_one_prefill(tok):
    """Several new positions after a filled cache attend causally from their own slots (not from the first)."""
    model = build_tiny_model(tok, seed=0)
    lean = LeanCausalLM(model)
    ids = torch.randint(5, model.config.vocab_size, (2, PROMPT), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, PROMPT, dtype=torch.long)
    positions = torch.arange(PROMPT).expand(2, -1)
    whole = lean(ids, mask, positions, _preallocated_cache(model, PROMPT))
    cache = _preallocated_cache(model, PROMPT)
    lean(ids[:, :4], mask[:, :4], positions[:, :4], cache)
    torch.testing.assert_close(lean(ids[:, 4:], mask, positions[:, 4:], cache), whole, atol=1e-4, rtol=0)


def test_a_model_with_lora_layers_injected_keeps_the_transformers_forward(tok):
    """A peft model's base (its LoRA layers in place, no PeftModel wrapper) is a LlamaForCausalLM whose
    projections add the adapter: the packed products would drop it."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    base = get_peft_model(build_tiny_model(tok, seed=0), lora).get_base_model()
    assert type(base).__name__ == "LlamaForCausalLM"
    assert not supports(base)
    engine = StaticCacheRolloutEngine({"a": AgentModel(base, tok)})
    engine.generate("a", [[1, 5, 9, 200, 31]], SamplingParams(max_new_tokens=2, temperature=0.0))
    assert engine.last_stats["forward"] == "transformers"


def test_a_hooked_or_partitioned_projection_is_not_supported(tok):
    """DeepSpeed ZeRO-3 gathers a projection's weight in a forward pre-hook and leaves an empty partition
    outside it; accelerate's offload replaces ``forward``: the packed products would bypass either."""
    hooked = build_tiny_model(tok, seed=0)
    hooked.model.layers[1].mlp.up_proj.register_forward_pre_hook(lambda module, args: None)
    assert not supports(hooked)
    partitioned = build_tiny_model(tok, seed=0)
    partitioned.model.layers[0].self_attn.o_proj.weight.data = torch.empty(0)
    assert not supports(partitioned)
    wrapped = build_tiny_model(tok, seed=0)
    head = wrapped.lm_head
    head.forward = lambda x: torch.nn.functional.linear(x, head.weight)
    assert not supports(wrapped)


def test_the_engine_samples_from_a_zero3_model(tok):
    """A DeepSpeed ZeRO-3 model on the CPU (gloo), as a colocated engine samples it: the transformers forward."""
    from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout
    from services.trainer.strategy.base import OptimConfig
    from services.trainer.strategy.deepspeed_strategy import DeepSpeedStrategy

    layout = PolicyLayout(
        mode="per_agent", agents=(AgentSpec("a", "tiny-llama"),), keep_reference=False, seed=0
    )
    policy = MultiAgentPolicy(layout)
    DeepSpeedStrategy(zero_stage=3).setup(
        policy.model("a"), policy.parameters("a"), OptimConfig(lr=1e-2, total_steps=2)
    )
    model = policy.model("a")
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    engine = StaticCacheRolloutEngine({"a": AgentModel(model, tok)})
    got = engine.generate("a", [[1, 5, 9, 200]], greedy)[0]
    assert engine.last_stats["forward"] == "transformers"
    expected = HFRolloutEngine({"a": AgentModel(model, tok)}).generate("a", [[1, 5, 9, 200]], greedy)[0]
    assert got.response_token_ids == expected.response_token_ids


def test_parameters_replaced_by_load_state_dict_with_assign_are_followed(tok):
    model = build_tiny_model(tok, seed=0)
    reference = build_tiny_model(tok, seed=1)
    lean = LeanCausalLM(model)
    model.load_state_dict(reference.state_dict(), assign=True)
    assert lean.refresh() == 2 * 4 + 1
    batch = _batch(model.config.vocab_size)
    expected = _logits(lambda *a: _transformers_forward(reference, *a), reference, batch)
    torch.testing.assert_close(_logits(lean, model, batch), expected, atol=1e-4, rtol=0)


def test_a_replaced_layer_and_head_are_followed(tok):
    model = build_tiny_model(tok, seed=0)
    reference = build_tiny_model(tok, seed=1)
    lean = LeanCausalLM(model)
    model.model.layers[1] = reference.model.layers[1]
    model.lm_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False)
    assert lean.refresh() == 4 + 1
    batch = _batch(model.config.vocab_size)
    expected = _logits(lambda *a: _transformers_forward(model, *a), model, batch)
    torch.testing.assert_close(_logits(lean, model, batch), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_single_queries_without_a_mask_equal_grouped_head_attention(dtype):
    """One query per row, no mask: bf16 attends in the rows arrangement (a key/value head's query heads as its rows,
    faster on the CPU), float32 with transformers' enable_gqa; both equal transformers' arrangement up to rounding."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(shape, generator=gen).to(dtype)
        for shape in ((8, 9, 1, 64), (8, 3, 52, 64), (8, 3, 52, 64))
    )
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    got = _attend(q, k, v, None)
    assert got.shape == want.shape == (8, 9, 1, 64)
    torch.testing.assert_close(
        got.float(), want.float(), rtol=0, atol=1e-2 if dtype == torch.bfloat16 else 1e-6
    )
