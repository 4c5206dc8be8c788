"""What the lean forwards (the rollout's :mod:`~services.trainer.rollout.engines.lean` and the update's
:mod:`~services.trainer.models.lean_training`) read of a Llama-family model: which architectures they compute, a
decoder layer's fused products, which linears are plain, and the stamp that tells when a weight changed.

Shapes: a linear's weight is (out, in).
"""

from __future__ import annotations

import torch

from services.trainer.models.dense_head import is_dense_input_hook
from services.trainer.models.prefix_sharing import layer_types
from services.trainer.strategy.frozen_bf16 import installed as frozen_bf16_installed

SUPPORTED_CLASSES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
"""transformers classes whose forward the lean forwards reproduce."""


def architecture_supported(model: torch.nn.Module) -> bool:
    """Whether ``model`` (a transformers causal LM, not a peft wrapper) is of :data:`SUPPORTED_CLASSES` with the
    layer the lean forwards compute: SiLU-gated MLP, no tensor-parallel split (``pretraining_tp`` 1), every layer
    full causal attention (no sliding window)."""
    if type(model).__name__ not in SUPPORTED_CLASSES:
        return False
    cfg = model.config
    types = layer_types(model)
    return (
        getattr(cfg, "hidden_act", None) == "silu"
        and getattr(cfg, "pretraining_tp", 1) == 1
        and bool(types)
        and all(t == "full_attention" for t in types)
    )


def layer_groups(layer: torch.nn.Module) -> dict[str, tuple[torch.nn.Module, ...]]:
    """A decoder layer's products, each the projections it fuses: ``qkv``, ``o``, ``gate_up``, ``down``."""
    attn, mlp = layer.self_attn, layer.mlp
    return {
        "qkv": (attn.q_proj, attn.k_proj, attn.v_proj),
        "o": (attn.o_proj,),
        "gate_up": (mlp.gate_proj, mlp.up_proj),
        "down": (mlp.down_proj,),
    }


def layer_linears(layer: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    """A decoder layer's seven projections: q, k, v, o, gate, up, down."""
    return tuple(m for linears in layer_groups(layer).values() for m in linears)


def plain_linear(module: torch.nn.Module | None, *, frozen_bf16: bool = False) -> bool:
    """Whether ``module``'s output is ``F.linear(x, weight, bias)`` of its whole weight, which a fused product
    computes in its place: exactly ``torch.nn.Linear`` (not a peft LoRA layer, whose adapter the product would
    drop), no forward hooks (but :mod:`~services.trainer.models.dense_head`'s, which only changes the input's
    layout), no replaced ``forward`` (DeepSpeed ZeRO-3 and accelerate gather or move weights in them; with
    ``frozen_bf16``, :mod:`~services.trainer.strategy.frozen_bf16`'s is allowed: it computes the same product) and a
    weight of its full (out, in) shape (ZeRO-3 leaves an empty partition)."""
    return (
        type(module) is torch.nn.Linear
        and not module._forward_hooks
        and all(is_dense_input_hook(hook) for hook in module._forward_pre_hooks.values())
        and ("forward" not in vars(module) or (frozen_bf16 and frozen_bf16_installed(module)))
        and tuple(module.weight.shape) == (module.out_features, module.in_features)
    )


def sources(linears: tuple[torch.nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
    """The parameters a fused product of ``linears`` is made from: their weights, then their biases."""
    return tuple(m.weight for m in linears) + tuple(m.bias for m in linears if m.bias is not None)


def stamp(tensors: tuple[torch.Tensor, ...]) -> tuple[tuple[int, int, int], ...]:
    """Each tensor's identity, storage and version counter: a change to any of them means new values."""
    return tuple((id(t), t.data_ptr(), t._version) for t in tensors)


def fused(linears: tuple[torch.nn.Linear, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused product of ``linears`` (their outputs concatenated in order): the (sum out, in) weight and the
    (sum out,) bias (zeros for a linear without one; None when none has one). Differentiable: built from the
    parameters as they are (detach them for a frozen copy)."""
    weight = torch.cat([m.weight for m in linears]) if len(linears) > 1 else linears[0].weight
    if all(m.bias is None for m in linears):
        return weight, None
    bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in linears])
    return weight, bias


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` (..., D) with its first half negated: :func:`rotate`'s form of ``rotate_half``'s signs."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, transformers' ``apply_rotary_pos_emb``: ``x cos + rotate_half(x) sin``, computed as
    ``x cos + roll(x, D/2) signed_sin(sin)``: the same products (``-(a) b == a (-b)`` in floating point), so the
    same floats, in fewer operations. Dtypes promote as in transformers (bf16 ``x`` with float32 ``cos``: float32).

    Args:
        x: (..., D) queries or keys.
        cos: Broadcastable to ``x``.
        sin_signed: :func:`signed_sin` of the ``sin`` that goes with ``cos``.
    """
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed
