"""The lean training forward (services/trainer/models/lean_training.py) against the transformers forward it replaces
in the update: the same logits and gradients (float32: to ~1e-5 of their scale; bf16 autocast: as close to float32
as the transformers forward under autocast is), for LoRA (all of q/k/v/o, some projections of a group, two active
adapters) and full fine-tuning, on Llama and Qwen2 (q/k/v biases, grouped heads), over groups that share prompts,
chains that share a head, rows that share nothing and one-token responses; frozen weights changed in place or
replaced are followed; models and forwards it does not compute keep the transformers forward."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from services.trainer.models import lean_training
from services.trainer.models.loading import build_tiny_model, load_tokenizer
from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout, _sequence_logprobs
from services.trainer.models.prefix_sharing import response_logits
from services.trainer.models.training_attention import MATH_ATTENTION_MAX_TOKENS
from tests.tiny_models import tiny_qwen2
from tests.trainer_batches import chain_batch, group_batch


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


def _lora(model: torch.nn.Module, targets: list[str], names: tuple[str, ...] = ("a",)) -> torch.nn.Module:
    """``model`` in a peft LoRA wrapper (adapters ``names`` on ``targets``, B matrices random so they count), all
    of ``names`` active; only the adapters require grad."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0)
    peft_model = get_peft_model(model, cfg, adapter_name=names[0])
    for name in names[1:]:
        peft_model.add_adapter(name, LoraConfig(r=2, lora_alpha=6, target_modules=targets, lora_dropout=0.0))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for pname, p in peft_model.named_parameters():
            if "lora_" in pname:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    peft_model.base_model.set_adapter(list(names))
    for pname, p in peft_model.named_parameters():
        p.requires_grad_("lora_" in pname)
    return peft_model


def _batch(kind: str, pad_id: int):
    """(ids, mask, A) of a batch kind: ``group``, ``chain``, ``distinct`` (no two rows alike), ``one`` (A = 1)."""
    b = chain_batch(pad_id) if kind == "chain" else group_batch(pad_id)
    ids, mask, actions = b.input_ids, b.attention_mask, b.action_mask.shape[1]
    if kind == "chain":
        return ids, mask, actions
    if kind == "distinct":
        ids = ids.clone()
        ids[:, -actions - 1] += torch.arange(ids.shape[0])  # every prompt's last token differs
    if kind == "one":
        ids, mask, actions = ids[:, : ids.shape[1] - 4], mask[:, : ids.shape[1] - 4], 1
    return ids, mask, actions


def _run(model, ids, mask, actions, lean: bool, share: bool = True, autocast: bool = False):
    """(B, A, V) float32 logits and {name: grad} of a weighted log-likelihood over the valid response tokens."""
    model.zero_grad(set_to_none=True)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        forward = lean_training.response_logits if lean else response_logits
        logits = forward(model, ids, mask, actions, share=share)
    labels = ids[:, -actions:]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    weights = torch.linspace(-1.0, 1.0, logp.numel()).view_as(logp)
    (logp * weights * mask[:, -actions:]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach().float(), grads


def _max_rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest difference of two gradient sets, relative to each parameter's largest entry."""
    assert a.keys() == b.keys() and a
    return max(float((a[n] - b[n]).abs().max()) / (float(a[n].abs().max()) + 1e-12) for n in a)


MODELS = {
    "llama_lora_qkvo": lambda tok: _lora(
        build_tiny_model(tok, seed=0), ["q_proj", "k_proj", "v_proj", "o_proj"]
    ),
    "llama_lora_q_v_gate_down": lambda tok: _lora(
        build_tiny_model(tok, seed=0), ["q_proj", "v_proj", "gate_proj", "down_proj"]
    ),
    "llama_two_adapters": lambda tok: _lora(build_tiny_model(tok, seed=0), ["q_proj", "v_proj"], ("a", "b")),
    "llama_full": lambda tok: build_tiny_model(tok, seed=0).requires_grad_(True),
    "qwen2_lora_all": lambda tok: _lora(
        tiny_qwen2(tok.vocab_size),
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
    "qwen2_full": lambda tok: tiny_qwen2(tok.vocab_size).requires_grad_(True),
}


@pytest.mark.parametrize("kind", ["group", "chain", "distinct", "one"])
@pytest.mark.parametrize("name", list(MODELS))
def test_float32_logits_and_gradients_equal_the_transformers_forward(tok, name, kind):
    model = MODELS[name](tok)
    ids, mask, actions = _batch(kind, tok.pad_token_id)
    assert lean_training.applies(model, ids.shape[1])
    want, want_grads = _run(model, ids, mask, actions, lean=False, share=False)  # the plain forward
    for share in (True, False):
        got, grads = _run(model, ids, mask, actions, lean=True, share=share)
        valid = mask[:, -actions:].bool()
        assert got.shape == want.shape
        torch.testing.assert_close(got[valid], want[valid], rtol=0, atol=1e-4 * float(want.abs().max()))
        assert _max_rel(want_grads, grads) < 1e-4, share


@pytest.mark.parametrize("name", ["llama_lora_qkvo", "qwen2_lora_all", "llama_full"])
def test_bf16_autocast_is_as_close_to_float32_as_the_transformers_forward_under_autocast(tok, name):
    model = MODELS[name](tok)
    ids, mask, actions = _batch("group", tok.pad_token_id)
    want, want_grads = _run(model, ids, mask, actions, lean=False)
    hf, hf_grads = _run(model, ids, mask, actions, lean=False, autocast=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert lean_training.compute_dtype(model) == torch.bfloat16
        dtype = lean_training.response_logits(model, ids, mask, actions).dtype
    assert dtype == torch.bfloat16
    got, grads = _run(model, ids, mask, actions, lean=True, autocast=True)
    valid = mask[:, -actions:].bool()
    hf_error = float((hf - want)[valid].abs().mean())
    assert 0 < float((got - want)[valid].abs().mean()) <= 2 * hf_error  # rounded, no worse than autocast's
    assert _max_rel(want_grads, grads) <= 2 * _max_rel(want_grads, hf_grads) + 1e-3


def test_frozen_weights_changed_in_place_or_replaced_are_followed(tok):
    model = MODELS["llama_lora_qkvo"](tok)
    ids, mask, actions = _batch("group", tok.pad_token_id)
    _run(model, ids, mask, actions, lean=True)  # caches the fused frozen weights
    layer = model.base_model.model.model.layers[0]
    with torch.no_grad():
        layer.self_attn.k_proj.base_layer.weight.mul_(-2.0)  # in place: the version counter moves
    layer.mlp.down_proj.weight = torch.nn.Parameter(  # a new parameter
        torch.randn_like(layer.mlp.down_proj.weight), requires_grad=False
    )
    want, _ = _run(model, ids, mask, actions, lean=False)
    got, _ = _run(model, ids, mask, actions, lean=True)
    valid = mask[:, -actions:].bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=0, atol=1e-4 * float(want.abs().max()))


def test_models_and_forwards_it_does_not_compute_are_refused(tok):
    from peft import LoraConfig, get_peft_model

    base = build_tiny_model(tok, seed=0)
    model = _lora(copy.deepcopy(base), ["q_proj", "v_proj"])
    assert lean_training.applies(model, 16)
    with torch.no_grad():
        assert not lean_training.applies(model, 16)  # no gradients recorded: the transformers forward
    assert not lean_training.applies(model, MATH_ATTENTION_MAX_TOKENS + 1)
    with torch.autocast("cpu", dtype=torch.float16):
        assert not lean_training.applies(model, 16)
    with model.disable_adapter():  # the reference forward
        assert not lean_training.supports(model)
    layer = model.base_model.model.model.layers[1]
    handle = layer.register_forward_pre_hook(
        lambda *a: None
    )  # ZeRO-3 and accelerate hook layers: not called here
    assert not lean_training.supports(model)
    handle.remove()
    assert lean_training.supports(model)
    layer.self_attn.o_proj.register_forward_hook(lambda *a: None)
    assert not lean_training.supports(model)
    assert not lean_training.applies(copy.deepcopy(base).to(torch.bfloat16), 16)  # bf16 weights
    dora = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))
    assert not lean_training.supports(dora)
    dropped = get_peft_model(
        copy.deepcopy(base), LoraConfig(r=4, target_modules=["q_proj"], lora_dropout=0.1)
    )
    assert not lean_training.supports(dropped.train()) and lean_training.supports(dropped.eval())
    merged = _lora(copy.deepcopy(base), ["q_proj"])
    merged.base_model.merge_adapter()
    assert not lean_training.supports(merged)
    checkpointed = copy.deepcopy(base)
    checkpointed.gradient_checkpointing_enable()
    assert not lean_training.supports(checkpointed)
    other = copy.deepcopy(base)
    other.config.hidden_act = "gelu"
    assert not lean_training.supports(other)


def test_the_policy_update_runs_it_and_switching_it_off_gives_the_same_numbers(tok, monkeypatch):
    policy = MultiAgentPolicy(PolicyLayout(mode="lora", agents=(AgentSpec("a", "tiny-llama"),)))
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for p in policy.parameters("a"):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    calls = []
    monkeypatch.setattr(
        lean_training, "response_logits", lambda *a, **k: calls.append(1) or _LEAN(*a, **k), raising=True
    )
    ids, mask, actions = _batch("group", tok.pad_token_id)
    action_mask = mask[:, -actions:]
    results = []
    for lean in (True, False):
        policy.lean_training = lean
        logp = policy.logprobs("a", ids, mask, action_mask)
        (grad,) = torch.autograd.grad(logp[action_mask.bool()].sum(), [policy.parameters("a")[0]])
        results.append((logp.detach(), grad))
    assert calls == [1]  # the first (lean) forward only
    (lean_lp, lean_grad), (hf_lp, hf_grad) = results
    valid = action_mask.bool()
    torch.testing.assert_close(lean_lp[valid], hf_lp[valid], rtol=0, atol=1e-4)
    torch.testing.assert_close(lean_grad, hf_grad, rtol=1e-4, atol=1e-4 * float(hf_grad.abs().max()))
    with torch.no_grad():
        _sequence_logprobs(policy.model("a"), ids, mask, action_mask, False, True, True)
    assert calls == [1]  # a forward without grad keeps the transformers forward


_LEAN = lean_training.response_logits


def test_the_padding_token_as_a_valid_input_gets_the_embeddings_gradient_of_the_transformers_forward(tok):
    """transformers' embedding has ``padding_idx = pad_token_id`` (no gradient to that row); the pad token can also
    be a valid input (tiny-llama pads with its end-of-sequence token, an end of turn in a multi-turn prompt)."""
    model = MODELS["llama_full"](tok)
    assert model.get_input_embeddings().padding_idx == tok.pad_token_id
    ids, mask, actions = _batch("group", tok.pad_token_id)
    ids = ids.clone()
    ids[0, 3] = tok.pad_token_id  # a valid prompt token
    assert mask[0, 3] == 1
    _, want_grads = _run(model, ids, mask, actions, lean=False, share=False)
    _, grads = _run(model, ids, mask, actions, lean=True)
    assert _max_rel(want_grads, grads) < 1e-4


def test_attention_dropout_in_effect_in_one_layer_only_is_refused(tok):
    """transformers' attention drops out when its own module is in training mode, whatever the model's mode."""
    model = build_tiny_model(tok, seed=0)
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1  # what a config's attention_dropout gives at construction
    assert not lean_training.supports(model.train())
    assert lean_training.supports(model.eval())
    model.model.layers[1].self_attn.train()
    assert not lean_training.supports(model)


def test_lora_layers_with_a_bias_on_either_matrix_are_refused(tok):
    """The stacked products read the A and B weights only: peft's ``lora_bias`` (on B), or a bias on A, is refused."""
    from peft import LoraConfig, get_peft_model

    biased = get_peft_model(
        build_tiny_model(tok, seed=0), LoraConfig(r=4, target_modules=["q_proj"], lora_bias=True)
    )
    assert not lean_training.supports(biased)
    model = _lora(build_tiny_model(tok, seed=0), ["q_proj"])
    assert lean_training.supports(model)
    q_proj = model.base_model.model.model.layers[0].self_attn.q_proj
    q_proj.lora_A["a"] = torch.nn.Linear(q_proj.in_features, 4, bias=True)
    assert not lean_training.supports(model)


def test_adapters_in_another_dtype_than_float32_are_refused(tok):
    """peft casts a LoRA branch's input to the adapter's dtype: bf16 adapters on a float32 base multiply in bf16
    outside autocast, which the stacked float32 products do not."""
    model = _lora(build_tiny_model(tok, seed=0), ["q_proj", "v_proj"])
    assert lean_training.supports(model)
    model.base_model.model.model.layers[1].self_attn.v_proj.lora_B["a"].to(torch.bfloat16)
    assert not lean_training.supports(model)
