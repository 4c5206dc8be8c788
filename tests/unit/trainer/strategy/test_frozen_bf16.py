"""Cached bf16 copies of frozen linear weights under bf16 autocast (``strategy/frozen_bf16.py``): the LoRA update's
loss and gradients equal plain autocast's, the frozen weights are no longer cast per forward, and the float32
weights every other consumer reads (reference forward, state dict) stay as they were. A tiny random Llama."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout
from services.trainer.strategy import frozen_bf16
from services.trainer.strategy.base import OptimConfig
from services.trainer.strategy.torch_strategy import TorchTrainEngine

IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18, 19, 20]])  # (B=2, T=8)
MASK = torch.ones_like(IDS)
ACTIONS = MASK[:, 4:]  # (B, A=4)


def _policy() -> MultiAgentPolicy:
    policy = MultiAgentPolicy(PolicyLayout(mode="lora", agents=(AgentSpec("a", "tiny-llama"),)))
    # the transformers forward, whose linears these copies serve (models/lean_training.py fuses its own copies)
    policy.lean_training = False
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters("a"):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return policy


def _loss_and_grads(policy: MultiAgentPolicy) -> tuple[torch.Tensor, list[torch.Tensor]]:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = -policy.logprobs("a", IDS, MASK, ACTIONS).mean()
    params = policy.parameters("a")
    grads = torch.autograd.grad(loss, params)
    return loss.detach(), list(grads)


class _Casts(TorchDispatchMode):
    """Counts float32 -> bf16 copies of 2-D tensors (weights) made while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and args[0].dim() == 2 and args[0].dtype == torch.float32:
            self.count += kwargs.get("dtype") == torch.bfloat16
        return func(*args, **kwargs)


def _casts_per_forward(policy: MultiAgentPolicy) -> int:
    _loss_and_grads(policy)  # the first forward makes the cached copies
    with _Casts() as casts:
        _loss_and_grads(policy)
    return casts.count


def test_the_bf16_update_equals_autocast_without_casting_the_frozen_base_per_forward():
    plain = _policy()
    cached = copy.deepcopy(plain)
    frozen = [
        m for m in cached.model("a").modules() if type(m) is torch.nn.Linear and not m.weight.requires_grad
    ]
    assert (
        frozen_bf16.install(cached.model("a")) == len(frozen) > 8
    )  # the base's q/k/v/o/mlp linears, lm_head
    loss, grads = _loss_and_grads(plain)
    got_loss, got_grads = _loss_and_grads(cached)
    assert torch.equal(got_loss, loss)  # the same bf16 rounding of the same weights
    for g, want in zip(got_grads, grads, strict=True):
        assert torch.equal(g, want)
    # autocast casts every frozen base weight (and the trainable adapters' once per forward); the cache removes
    # the frozen ones
    before, after = _casts_per_forward(plain), _casts_per_forward(cached)
    assert before - after >= len(frozen)


def test_consumers_read_the_float32_weights_and_a_changed_weight_is_recast():
    policy = _policy()
    want_ref = policy.ref_logprobs("a", IDS, MASK, ACTIONS)
    state = {k: v.clone() for k, v in policy.model("a").state_dict().items()}
    engine = TorchTrainEngine(policy.model("a"), policy.parameters("a"), OptimConfig(lr=1e-3, bf16=True))
    assert engine.bf16 and any(frozen_bf16.installed(m) for m in policy.model("a").modules())
    loss, _ = _loss_and_grads(policy)
    # the reference forward (adapters disabled, no autocast) and the state dict are the float32 ones
    assert torch.equal(policy.ref_logprobs("a", IDS, MASK, ACTIONS), want_ref)
    now = policy.model("a").state_dict()
    assert now.keys() == state.keys() and all(
        torch.equal(now[k], v) and now[k].dtype == v.dtype for k, v in state.items()
    )
    # a frozen weight changed in place (a checkpoint's base loaded, say) is recast, not served stale
    key = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
    with torch.no_grad():
        now[key].mul_(-1.0)
    changed, _ = _loss_and_grads(policy)
    fresh = copy.deepcopy(policy)  # the copy keeps the forward, not the cached bf16 weights
    assert frozen_bf16.installed(fresh.model("a").get_submodule(key.removesuffix(".weight")))
    assert not torch.equal(changed, loss) and torch.equal(_loss_and_grads(fresh)[0], changed)


@pytest.mark.parametrize("bf16", [False, True])
def test_the_torch_engine_caches_only_with_bf16(bf16):
    policy = _policy()
    TorchTrainEngine(policy.model("a"), policy.parameters("a"), OptimConfig(lr=1e-3, bf16=bf16))
    linears = [m for m in policy.model("a").modules() if type(m) is torch.nn.Linear]
    assert any(frozen_bf16.installed(m) for m in linears) == bf16
    assert not any(frozen_bf16.installed(m) for m in linears if m.weight.requires_grad)  # adapters stay plain


def test_only_a_cpu_engine_caches_and_the_cache_is_one_bf16_copy_per_frozen_weight():
    """docs/models.md, docs/gpu.md: the cached copies are made on the CPU only (a model elsewhere, here on the meta
    device as a GPU's stand-in, keeps plain autocast), and each is the frozen weight in bf16 (2 bytes an element)."""
    models = {}
    for device in ("cpu", "meta"):
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)).to(device)
        model[0].requires_grad_(False)  # frozen, as a LoRA base; model[1] is trained
        engine = TorchTrainEngine(model, list(model[1].parameters()), OptimConfig(lr=1e-3, bf16=True))
        assert engine.bf16
        models[device] = model
    assert [frozen_bf16.installed(m) for m in models["cpu"]] == [True, False]
    assert not any(frozen_bf16.installed(m) for m in models["meta"])
    frozen = models["cpu"][0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        models["cpu"](torch.ones(2, 6))
    cached = frozen_bf16._CACHE[frozen][1]
    assert cached.dtype == torch.bfloat16 and cached.shape == frozen.weight.shape
    assert torch.equal(cached, frozen.weight.to(torch.bfloat16))


def test_outside_autocast_or_once_trainable_a_linear_takes_the_plain_path():
    """The module docstring's two plain paths: a forward outside bf16 autocast is the float32 one, and a linear whose
    weight requires grad at the call (made trainable after install) gets its gradient as under plain autocast."""
    torch.manual_seed(0)
    plain = torch.nn.Linear(6, 4).requires_grad_(False)
    cached = copy.deepcopy(plain)
    assert frozen_bf16.install(cached) == 1
    x = torch.randn(3, 6)
    assert torch.equal(cached(x), plain(x))  # no autocast: float32
    for m in (plain, cached):
        m.requires_grad_(True)  # an adapter made trainable later
        with torch.autocast("cpu", dtype=torch.bfloat16):
            m(x).float().square().sum().backward()
    assert cached.weight.grad is not None and torch.equal(cached.weight.grad, plain.weight.grad)
