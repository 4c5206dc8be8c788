"""``rollout.dtype``: native-bf16 detection, the dtype resolution, config validation, and the transformers engines
sampling with bf16 copies of fp32 weights (log-probabilities of the copy's forward, synced by ``update_weights``,
seeded draws reproducible). A tiny random Llama, well under a second per test."""

from __future__ import annotations

import pytest
import torch

from marti.config import config_from_dict
from marti.errors import InvalidArgumentError
from services.trainer.models.loading import TinyModelConfig, build_tiny_model, load_tokenizer
from services.trainer.rollout import AgentModel, HFRolloutEngine, SamplingParams
from services.trainer.rollout.engines.generation import build_rollout_engine, generation_config
from services.trainer.rollout.engines.precision import cpu_has_bf16, resolve_rollout_dtype
from services.trainer.rollout.engines.static import StaticCacheRolloutEngine

SMALL = TinyModelConfig(
    num_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2
)
ENGINES = [HFRolloutEngine, StaticCacheRolloutEngine]
FLAGS_NO_BF16 = "flags\t\t: fpu sse2 avx2 avx512f avx512bw\n"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


def _cpuinfo(tmp_path, text):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nmodel name\t: x\n" + text)
    return path


@pytest.mark.parametrize("flag", ["avx512_bf16", "amx_bf16"])
def test_bf16_is_detected_from_either_cpu_flag(tmp_path, flag):
    assert cpu_has_bf16(_cpuinfo(tmp_path, f"flags\t\t: fpu avx512f {flag} avx512bw\n"))
    assert not cpu_has_bf16(_cpuinfo(tmp_path, FLAGS_NO_BF16))
    assert not cpu_has_bf16(_cpuinfo(tmp_path, f"bugs\t\t: {flag}\n" + FLAGS_NO_BF16))  # only the flags line
    assert not cpu_has_bf16(tmp_path / "absent")


def test_auto_resolves_per_device_and_explicit_settings_win(tmp_path):
    bf16 = _cpuinfo(tmp_path, "flags\t\t: avx512f avx512_bf16\n")
    none = tmp_path / "none"
    none.write_text(FLAGS_NO_BF16)
    assert resolve_rollout_dtype("auto", "cpu", bf16) == torch.bfloat16
    assert resolve_rollout_dtype("auto", "cpu", none) == torch.float32
    assert resolve_rollout_dtype("auto", "cuda", bf16) is None  # the model's own dtype on a GPU
    assert resolve_rollout_dtype(None, "cpu", bf16) is None  # the default: the policy's dtype, no copy
    assert resolve_rollout_dtype("bfloat16", "cpu", none) == torch.bfloat16
    assert resolve_rollout_dtype("float32", "cuda:1", bf16) == torch.float32
    with pytest.raises(InvalidArgumentError, match=r"rollout.dtype.*'fp16'"):
        resolve_rollout_dtype("fp16", "cpu")


def _raw(**rollout) -> dict:
    return {
        "training_name": "t",
        "agents": [{"name": "a", "pretrain_model": "m", "role": "r"}],
        "rollout": rollout,
    }


def test_config_validates_rollout_dtype_naming_the_value():
    assert config_from_dict(_raw(), source="c.yaml").rollout.dtype is None
    assert config_from_dict(_raw(dtype="bfloat16"), source="c.yaml").rollout.dtype == "bfloat16"
    with pytest.raises(InvalidArgumentError) as info:
        config_from_dict(_raw(dtype="half"), source="c.yaml")
    assert "rollout.dtype" in str(info.value) and "'half'" in str(info.value)
    with pytest.raises(InvalidArgumentError, match=r"rollout.dtype=bfloat16 .*vLLM"):
        config_from_dict({**_raw(dtype="bfloat16", engine="vllm"), "device": "cuda"}, source="c.yaml")


def _forward_logprobs(model, prompt, response):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return logp.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("engine_cls", ENGINES)
def test_bf16_engine_logprobs_are_a_bf16_forward_of_the_same_tokens(tok, engine_cls):
    model = build_tiny_model(tok, seed=0, config=SMALL)
    engine = engine_cls({"a": AgentModel(model, tok)}, dtype=torch.bfloat16)
    copy = engine._agents["a"].model
    assert engine.samples_with_copies and copy is not model
    assert next(copy.parameters()).dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.float32
    assert (
        copy.model.rotary_emb.inv_freq.dtype == torch.float32
    )  # buffers keep their dtype: positions stay exact
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12]] * 3 + [[13, 14, 15]]  # a group of 3 (shared prefill) and one more
    gens = engine.generate("a", prompts, SamplingParams(max_new_tokens=8, temperature=1.0, seed=3))
    worst_bf16 = worst_fp32 = 0.0
    for g in gens:
        got = torch.tensor(g.response_logprobs)
        worst_bf16 = max(
            worst_bf16,
            float((got - _forward_logprobs(copy, g.prompt_token_ids, g.response_token_ids)).abs().max()),
        )
        worst_fp32 = max(
            worst_fp32,
            float((got - _forward_logprobs(model, g.prompt_token_ids, g.response_token_ids)).abs().max()),
        )
    # the bf16 forward that sampled, up to the rounding of a different (cached, batched) computation order (about
    # one bf16 step of the logits); an engine sampling with the fp32 weights would match those within 1e-5 instead
    assert worst_bf16 < 0.02
    assert worst_fp32 > 1e-4


@pytest.mark.parametrize("engine_cls", ENGINES)
def test_update_weights_refreshes_the_bf16_copy_and_seeds_reproduce(tok, engine_cls):
    model = build_tiny_model(tok, seed=0, config=SMALL)
    engine = engine_cls({"a": AgentModel(model, tok)}, dtype=torch.bfloat16)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=7)
    prompts = [[5, 6, 7, 8]] * 2
    first = engine.generate("a", prompts, params)
    assert [g.response_token_ids for g in engine.generate("a", prompts, params)] == [
        g.response_token_ids for g in first
    ]
    newer = build_tiny_model(tok, seed=1, config=SMALL).state_dict()
    engine.update_weights("a", newer, 1)
    copy = engine._agents["a"].model
    key = "model.layers.0.mlp.up_proj.weight"
    assert copy.state_dict()[key].dtype == torch.bfloat16
    assert torch.equal(copy.state_dict()[key], newer[key].to(torch.bfloat16))
    assert not torch.equal(model.state_dict()[key], newer[key])  # the weights it was given are not written
    gens = engine.generate("a", prompts, params)
    assert all(g.policy_version == 1 for g in gens)
    lp = _forward_logprobs(copy, gens[0].prompt_token_ids, gens[0].response_token_ids)
    assert torch.allclose(torch.tensor(gens[0].response_logprobs), lp, atol=0.02)


def test_pinned_writes_the_old_weights_into_the_bf16_copy_and_puts_the_new_back(tok):
    """docs/models.md: ``pinned`` writes into the converted copy (converting what it loads), never into the weights
    the engine was given, and restores the copy on exit."""
    model = build_tiny_model(tok, seed=0, config=SMALL)
    engine = HFRolloutEngine({"a": AgentModel(model, tok)}, dtype=torch.bfloat16)
    copy, key = engine._agents["a"].model, "model.layers.0.mlp.up_proj.weight"
    current, given = copy.state_dict()[key].clone(), model.state_dict()[key].clone()
    old = build_tiny_model(tok, seed=1, config=SMALL).state_dict()
    with engine.pinned("a", {key: old[key]}, 0):
        assert copy.state_dict()[key].dtype == torch.bfloat16
        assert torch.equal(copy.state_dict()[key], old[key].to(torch.bfloat16))
    assert torch.equal(copy.state_dict()[key], current) and torch.equal(model.state_dict()[key], given)


def test_same_dtype_needs_no_copy_and_the_job_builds_the_resolved_engine(tok, tmp_path):
    model = build_tiny_model(tok, seed=0, config=SMALL)
    engine = HFRolloutEngine({"a": AgentModel(model, tok)}, dtype=torch.float32)
    assert not engine.samples_with_copies and engine._agents["a"].model is model
    # a LoRA policy sampled in bf16 from its live modules: the engine holds a converted copy, adapter merged
    cfg = config_from_dict(_raw(dtype="bfloat16", max_new_tokens=4), source="c.yaml")
    policy = _policy(tok)
    built = build_rollout_engine(generation_config(cfg), policy, ["a"], "cpu", copy_weights=False)
    assert built.dtype == torch.bfloat16 and built.samples_with_copies
    assert built._agents["a"].model is not policy.rollout_target("a")[0]
    gens = built.generate("a", [[5, 6, 7]], SamplingParams(max_new_tokens=3, temperature=0.0))
    assert len(gens[0].response_token_ids) == 3


def _policy(tok):
    from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout

    return MultiAgentPolicy(PolicyLayout(mode="lora", agents=(AgentSpec("a", "tiny-llama"),)))
