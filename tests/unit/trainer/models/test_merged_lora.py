"""Merged LoRA sampling copies (``rollout/engines/merged.py``): a LoRA policy sampled in bf16 runs a plain model with
``W + scaling * B @ A`` in its linears, equal to the unmerged bf16 copy within bf16 rounding, re-merged by every
weight sync (a training update moves its output), one copy per adapter where several agents share a base; the merge
computed in float32 then cast; adapters it does not cover (DoRA, an adapter bias, a non-linear adapted layer) keep
the unmerged copy. A tiny random Llama; a few seconds in all."""

from __future__ import annotations

import pytest
import torch

from marti.errors import InvalidArgumentError
from services.trainer.models.loading import load_tokenizer
from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout
from services.trainer.rollout import HFRolloutEngine, SamplingParams
from services.trainer.rollout.engines.merged import MergedLoRA, _lora_layers
from services.trainer.rollout.engines.static import StaticCacheRolloutEngine

BF16 = torch.bfloat16
TOL = 0.2
"""Most |logit| difference from bf16 rounding of this model (logits of magnitude ~1; a few hundredths to 0.13 seen)."""
IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18, 19, 20]])  # (B=2, T=8)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


def _policy(agents: int = 1) -> MultiAgentPolicy:
    """A LoRA policy whose adapters are random (peft starts B at 0: a merge would change nothing)."""
    specs = tuple(AgentSpec(f"a{i}", "tiny-llama") for i in range(agents))
    policy = MultiAgentPolicy(PolicyLayout(mode="lora", agents=specs))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for agent in policy.agent_ids:
            for p in policy.parameters(agent):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return policy


def _logits(model: torch.nn.Module, adapter: str | None = None) -> torch.Tensor:
    """(B, T, V) fp32 logits of :data:`IDS`, with ``adapter`` active on a peft model."""
    if adapter is not None:
        model.set_adapter(adapter)
    with torch.no_grad():
        return model(input_ids=IDS).logits.float()


def _engine(policy: MultiAgentPolicy, cls=HFRolloutEngine, **kwargs) -> HFRolloutEngine:
    return cls.from_policy(policy, copy_weights=False, dtype=BF16, **kwargs)


@pytest.mark.parametrize("cls", [HFRolloutEngine, StaticCacheRolloutEngine])
def test_merged_copy_is_a_plain_bf16_model_equal_to_the_unmerged_copy(tok, cls):
    policy = _policy()
    merged = _engine(policy, cls)
    unmerged = _engine(policy, cls, merge_adapters=0)
    plain = merged._agents["a0"].model
    assert merged._agents["a0"].adapter_name is None and not _lora_layers(plain)
    assert next(plain.parameters()).dtype == BF16
    assert unmerged._agents["a0"].adapter_name == "agent0" and _lora_layers(unmerged._agents["a0"].model)
    got, ref = _logits(plain), _logits(unmerged._agents["a0"].model, "agent0")
    with policy.model("a0").disable_adapter():
        base = _logits(policy.model("a0"))
    assert (got - ref).abs().max() < TOL
    assert (
        ref - base
    ).abs().max() > 3 * TOL  # the adapter matters: a copy without it would fail the line above
    # behaviour log-probabilities are the merged forward's (prefix-shared prefill and batched decode round apart)
    gens = merged.generate(
        "a0", [IDS[0].tolist()] * 2, SamplingParams(max_new_tokens=5, temperature=1.0, seed=1)
    )
    for g in gens:
        full = torch.tensor([g.prompt_token_ids + g.response_token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(plain(input_ids=full).logits[0].float(), -1)
        want = logp[len(g.prompt_token_ids) - 1 : -1].gather(-1, torch.tensor(g.response_token_ids)[:, None])
        assert torch.allclose(torch.tensor(g.response_logprobs), want.squeeze(-1), atol=0.05)


def test_a_training_update_moves_the_merged_copy_after_the_sync(tok):
    policy = _policy()
    engine = _engine(policy)
    plain = engine._agents["a0"].model
    before = _logits(plain)
    opt = torch.optim.SGD(policy.parameters("a0"), lr=5.0)
    mask = torch.ones_like(IDS)
    policy.logprobs("a0", IDS, mask, mask[:, 4:]).sum().backward()  # raise the tokens' likelihood
    opt.step()
    live = _logits(policy.model("a0"), "agent0")
    assert (live - before).abs().max() > 3 * TOL  # the update is visible beyond bf16 rounding
    assert torch.equal(_logits(plain), before)  # the copy is not the live model: only a sync moves it
    engine.update_weights("a0", policy.state_for_sync("a0"), policy.bump_version("a0"))
    after = _logits(plain)
    assert (after - live).abs().max() < TOL
    # pinned to the old adapter: the old merge, then the new one back on exit
    with engine.pinned("a0", _random_adapter_like(policy, "a0", scale=0.0), 0):
        with policy.model("a0").disable_adapter():
            assert (_logits(plain) - _logits(policy.model("a0"))).abs().max() < TOL
    assert torch.equal(_logits(plain), after)


def _random_adapter_like(policy: MultiAgentPolicy, agent: str, scale: float) -> dict[str, torch.Tensor]:
    return {k: torch.randn(v.shape) * scale for k, v in policy.state_for_sync(agent).items()}


def test_agents_on_one_base_sample_with_their_own_adapter(tok):
    policy = _policy(agents=2)
    live = {a: _logits(policy.model(a), f"agent{i}") for i, a in enumerate(policy.agent_ids)}
    assert (live["a0"] - live["a1"]).abs().max() > 3 * TOL
    per_adapter = _engine(policy, merge_adapters=2)  # one merged base copy per adapter
    shared = _engine(policy)  # the default: two adapters on one base keep one unmerged copy
    assert per_adapter._agents["a0"].model is not per_adapter._agents["a1"].model
    assert shared._agents["a0"].model is shared._agents["a1"].model and not shared._merged
    last = {a: torch.log_softmax(x[0, -1], -1) for a, x in live.items()}  # (V,) after IDS[0], per agent
    for a, b in [("a0", "a1"), ("a1", "a0")]:
        assert (_logits(per_adapter._agents[a].model) - live[a]).abs().max() < TOL
        for engine in (per_adapter, shared):
            gen = engine.generate(a, [IDS[0].tolist()], SamplingParams(max_new_tokens=1, temperature=0.0))[0]
            token, logp = gen.response_token_ids[0], gen.response_logprobs[0]
            assert abs(logp - float(last[a][token])) < 0.05  # its own adapter's distribution ...
            assert abs(logp - float(last[b][token])) > 0.1  # ... not the other agent's
    # a sync of one agent re-merges only its own copy
    other = _logits(per_adapter._agents["a1"].model)
    per_adapter.update_weights("a0", _random_adapter_like(policy, "a0", scale=0.0), 1)
    assert torch.equal(_logits(per_adapter._agents["a1"].model), other)
    assert per_adapter.policy_version("a0") == 1 and per_adapter.policy_version("a1") == 0


def test_bad_adapter_weights_are_refused_before_anything_changes(tok):
    policy = _policy()
    merged = MergedLoRA(policy.model("a0"), "agent0", BF16)
    before = _logits(merged.model)
    good = policy.state_for_sync("a0")
    key = next(iter(good))
    with pytest.raises(InvalidArgumentError, match="not in adapter 'agent0'"):
        merged.load({key: good[key], "nope.lora_A.weight": good[key]})
    with pytest.raises(InvalidArgumentError, match=r"has shape \(1,\)"):
        merged.load({key: torch.zeros(1)})
    assert torch.equal(_logits(merged.model), before)
    with pytest.raises(InvalidArgumentError, match="merge_adapters must be an int >= 0, got -1"):
        _engine(policy, merge_adapters=-1)


@pytest.mark.parametrize("bad", [True, 1.5, 1.0, "1", None])
def test_a_merge_adapters_that_is_not_an_int_is_refused_by_name(tok, bad):
    with pytest.raises(InvalidArgumentError, match=f"merge_adapters must be an int >= 0, got {bad!r}"):
        _engine(_policy(), merge_adapters=bad)


@pytest.mark.parametrize("engine", ["hf", "hf_static"])
def test_rollout_merge_adapters_reaches_the_built_engine(tok, tmp_path, engine):
    from marti.config import load_config
    from services.trainer.rollout.engines.generation import build_rollout_engine, generation_config

    team = tmp_path / "team.yaml"
    team.write_text(
        "training_name: t\nagents: [{name: a0, pretrain_model: tiny-llama, role: r}, {name: a1, pretrain_model: tiny-llama, role: r}]\n"
    )
    policy = _policy(agents=2)
    for setting, merged in [(1, set()), (2, {"a0", "a1"})]:
        cfg = load_config(
            team,
            ["policy.mode=lora", "rollout.dtype=bfloat16", f"rollout.merge_adapters={setting}"],
        )
        built = build_rollout_engine(
            generation_config(cfg), policy, ["a0", "a1"], "cpu", copy_weights=False, engine=engine
        )
        assert set(built._merged) == merged


def _peft_model(tok, **lora) -> torch.nn.Module:
    """The tiny Llama with one peft adapter ``agent0`` made from ``LoraConfig(r=4, **lora)``, B non-zero."""
    from peft import LoraConfig, get_peft_model

    from services.trainer.models.loading import build_tiny_model

    cfg = LoraConfig(r=4, lora_alpha=8, **{"target_modules": ["q_proj", "v_proj"], **lora})
    model = get_peft_model(build_tiny_model(tok, seed=0), cfg, adapter_name="agent0")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(1))
    return model


@pytest.mark.parametrize(
    "lora",
    [
        {"use_dora": True},  # DoRA: the magnitude vector rescales W + BA, not a plain sum
        {"lora_bias": True},  # an adapter bias
        {"target_modules": ["q_proj", "embed_tokens"]},  # an adapted layer that is not a linear
    ],
    ids=["dora", "lora_bias", "embedding"],
)
def test_adapters_the_merge_does_not_cover_keep_the_unmerged_copy(tok, lora):
    from services.trainer.rollout import AgentModel

    model = _peft_model(tok, **lora)
    engine = HFRolloutEngine({"a0": AgentModel(model, tok, "agent0")}, dtype=BF16)
    assert not engine._merged and engine._agents["a0"].adapter_name == "agent0"
    copy = engine._agents["a0"].model
    assert copy is not model and _lora_layers(copy) and next(copy.parameters()).dtype == BF16


def test_the_merged_weight_is_computed_in_float32_then_cast(tok):
    """``cast(W + scaling * B @ A)`` with W, A, B in float32, the adapter kept as a float32 copy, and the rotary
    frequencies (a buffer) left in float32."""
    from services.trainer.rollout import AgentModel

    model = _peft_model(tok)
    engine = HFRolloutEngine({"a0": AgentModel(model, tok, "agent0")}, dtype=BF16)
    merged = engine._merged["a0"]
    assert all(v.dtype == torch.float32 for v in merged.adapter_state().values())
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    a, b = layer.lora_A["agent0"].weight, layer.lora_B["agent0"].weight  # (r, in), (out, r) float32
    want = (layer.base_layer.weight + layer.scaling["agent0"] * (b @ a)).to(BF16)
    got = merged.model.model.layers[0].self_attn.q_proj.weight
    assert got.dtype == BF16 and torch.equal(got, want)
    in_bf16 = layer.base_layer.weight.to(BF16) + layer.scaling["agent0"] * (b.to(BF16) @ a.to(BF16))
    assert not torch.equal(got, in_bf16)  # a merge computed in bf16 rounds differently
    assert merged.model.model.rotary_emb.inv_freq.dtype == torch.float32
