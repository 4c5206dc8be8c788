"""A lean training forward of Llama-family policies on the CPU: response logits with fused products, for the update.

Under bf16 autocast a transformers forward with peft LoRA spends much of an update outside its matrix products:
every linear re-casts its float32 input (q, k and v each cast the same normed hidden states, and every LoRA branch
again), the autograd graph holds a cast and its backward per linear, q/k/v and gate/up run as separate products,
keys and values are repeated to every query head, and a shared prompt runs as its own forward before the
responses. :func:`response_logits` computes the function :func:`~services.trainer.models.prefix_sharing.
response_logits` computes (the same logits up to float rounding: in float32 logits agree to ~1e-5 of their scale
and gradients to ~1e-4; bf16 rounds in other places) with:

- the normed hidden states cast to the compute dtype once per layer, q/k/v and gate/up each one fused product
  whose frozen base weight is cast and concatenated once and cached (remade when a weight changes: its
  identity, storage or version counter; a write through ``.data`` in place moves none of them and is not seen, as
  in :mod:`~services.trainer.strategy.frozen_bf16` and the rollout's lean forward: write weights with ``copy_`` or
  ``load_state_dict``), a trainable base weight concatenated afresh at each call;
- every LoRA adapter of a product as two products: the adapters' A matrices stacked, then their scaled B matrices
  as one block-diagonal matrix (zero blocks for projections without an adapter);
- the shared prompts' tokens and the responses' tokens as the rows of the same products; attention per part
  (each distinct prompt on itself, each row's response on its prompt's keys and its own), the query heads of a
  key/value head as that head's rows (no repeated keys), scores and softmax in float32, masked positions with a
  finite minimum (a padding column's query gets finite values, which no valid position reads).

Which rows share a prompt is :mod:`~services.trainer.models.prefix_sharing`'s choice (whole prompts, or a shorter
head for chains); with sharing off every row is its own prompt (a plain forward). Dtypes: float32 weights and
residual stream, products in bf16 inside bf16 CPU autocast (the rounding autocast applies to each product), float32
otherwise. Gradients flow to every trainable parameter (adapters, or the base in a full fine-tune) by autograd.

Scope (:func:`applies`): a transformers ``LlamaForCausalLM`` or ``Qwen2ForCausalLM`` (plain, or in a peft LoRA
wrapper) on the CPU, float32 weights, a forward that records gradients over at most
:data:`~services.trainer.models.training_attention.MATH_ATTENTION_MAX_TOKENS` columns; no gradient checkpointing,
no dropout, adapters plain LoRA (no DoRA or other variant, no LoRA bias, unmerged) on plain linears. Anything
else runs the transformers forward. Measured on SmolLM2-135M with LoRA in ``marti bench trainer``'s steps (8 rows
of about 58 tokens, bf16 autocast, 2 threads of an AMD EPYC): update 0.95 s -> 0.70 s (``python -m
benchmarks.trainer.step_profile SPEC lean_update``, alternating steps); docs/benchmarks.md.

Memory: the cached frozen base weights hold every frozen linear weight once more in the compute dtype.

Shapes: B rows, T columns, A response (action) tokens, U distinct prefixes of S columns, R = T - 1 - S columns per
row after them, V vocabulary, H query heads, K key/value heads, D head size.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F

from services.trainer.models.llama_family import (
    architecture_supported,
    fused,
    layer_groups,
    layer_linears,
    plain_linear,
    rotate,
    signed_sin,
    sources,
    stamp,
)
from services.trainer.models.prefix_sharing import PrefixLayout, position_ids, prefix_layout
from services.trainer.models.training_attention import MATH_ATTENTION_MAX_TOKENS, checkpointed

__all__ = ["applies", "compute_dtype", "response_logits", "supports"]

_FROZEN: weakref.WeakKeyDictionary[torch.nn.Module, tuple[Any, torch.Tensor, torch.Tensor | None]] = (
    weakref.WeakKeyDictionary()
)
"""first linear of a frozen product -> (stamp of its sources and the dtype, fused weight, fused bias)."""


def compute_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The products' dtype for ``model`` now: bf16 inside bf16 CPU autocast, float32 outside autocast, None (not
    served) for float16 autocast or weights that are not float32."""
    if model.get_input_embeddings().weight.dtype != torch.float32:
        return None
    if not torch.is_autocast_enabled("cpu"):
        return torch.float32
    return torch.bfloat16 if torch.get_autocast_dtype("cpu") == torch.bfloat16 else None


def applies(model: torch.nn.Module, num_tokens: int) -> bool:
    """Whether :func:`response_logits` serves this forward: gradients recorded, ``num_tokens`` at most
    :data:`~services.trainer.models.training_attention.MATH_ATTENTION_MAX_TOKENS` (its attention stores the
    (rows, heads, queries, keys) scores), a :func:`compute_dtype`, and :func:`supports`."""
    return (
        torch.is_grad_enabled()
        and num_tokens <= MATH_ATTENTION_MAX_TOKENS
        and compute_dtype(model) is not None
        and supports(model)
    )


def supports(model: torch.nn.Module) -> bool:
    """Whether :func:`response_logits` computes ``model``'s forward: a Llama-family causal LM
    (:func:`~services.trainer.models.llama_family.architecture_supported`), plain or in a peft LoRA wrapper, on the
    CPU, without gradient checkpointing or attention dropout, whose embedding is a plain ``nn.Embedding``, head a
    plain linear and every projection a plain linear or a plain LoRA layer (:func:`_lora_layer_ok`), no other
    module with forward hooks or a replaced forward (:func:`_hookless`)."""
    inner = _causal_lm(model)
    if inner is None or not architecture_supported(inner) or checkpointed(model):
        return False
    embed = inner.get_input_embeddings()
    if (
        type(embed) is not torch.nn.Embedding
        or embed.max_norm is not None
        or embed.weight.device.type != "cpu"
    ):
        return False
    if any(_attention_dropout(layer.self_attn) for layer in inner.model.layers):
        return False
    projections = [m for layer in inner.model.layers for m in layer_linears(layer)]
    head = inner.get_output_embeddings()
    return (
        plain_linear(head, frozen_bf16=True)
        and all(_projection_ok(m) for m in projections)
        and _hookless_outside(inner, {id(m) for m in projections} | {id(head)})
    )


def _hookless_outside(module: torch.nn.Module, checked: set[int]) -> bool:
    """:func:`_hookless` for ``module`` and its submodules, but the subtrees of the modules in ``checked`` (ids),
    which are checked on their own (a projection's LoRA internals, the head)."""
    if id(module) in checked:
        return True
    return _hookless(module) and all(
        _hookless_outside(child, checked) for child in module._modules.values() if child is not None
    )


def _attention_dropout(attn: torch.nn.Module) -> bool:
    """Whether transformers' attention ``attn`` drops out: its own training mode and its ``attention_dropout`` (read
    from the config when it was built)."""
    return attn.training and float(getattr(attn, "attention_dropout", 0.0) or 0.0) > 0


def _hookless(module: torch.nn.Module) -> bool:
    """No forward hooks and no replaced ``forward`` on ``module`` (DeepSpeed ZeRO-3 and accelerate gather, move or
    offload weights in them; this forward calls none of them)."""
    return not module._forward_hooks and not module._forward_pre_hooks and "forward" not in vars(module)


def _causal_lm(model: torch.nn.Module) -> torch.nn.Module | None:
    """The transformers model inside ``model``: itself, or the model a peft LoRA wrapper holds (None for another peft
    method, whose forward changes more than the linears)."""
    base = getattr(model, "base_model", None)
    if base is None or base is model or not hasattr(model, "peft_config"):
        return model
    from peft.tuners.lora import LoraModel

    return base.model if isinstance(base, LoraModel) else None


def _projection_ok(module: torch.nn.Module) -> bool:
    """A plain linear (:func:`~services.trainer.models.llama_family.plain_linear`) or a plain LoRA layer."""
    return plain_linear(module, frozen_bf16=True) or _lora_layer_ok(module)


def _lora_layer_ok(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a peft LoRA ``Linear`` whose forward is ``base(x) + sum_a B_a(A_a(x)) * scaling_a`` over
    its active adapters: unmerged, adapters on, no hooks, a plain base, weights not transposed
    (``fan_in_fan_out``), and for each active adapter plain float32 A and B linears (no bias), no variant (DoRA and the like)
    and no dropout in effect."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    if type(module) is not LoraLinear or module._forward_hooks or module._forward_pre_hooks:
        return False
    if module.merged or module.disable_adapters or module.fan_in_fan_out:
        return False
    if not plain_linear(module.base_layer, frozen_bf16=True):
        return False
    for name in _adapters(module):
        if name in getattr(module, "lora_variant", {}) or any(
            m[name].bias is not None for m in (module.lora_A, module.lora_B)
        ):
            return False
        if not (plain_linear(module.lora_A[name]) and plain_linear(module.lora_B[name])):
            return False
        if any(m[name].weight.dtype != torch.float32 for m in (module.lora_A, module.lora_B)):
            return False  # peft casts the input to the adapter's dtype: outside autocast, another product
        dropout = module.lora_dropout[name]
        inert = type(dropout) is torch.nn.Dropout and (dropout.p == 0 or not dropout.training)
        if not (type(dropout) is torch.nn.Identity or inert):
            return False
    return True


def _adapters(module: torch.nn.Module) -> list[str]:
    """The active adapters a LoRA layer applies (those it has), in its order; [] for a plain linear."""
    lora_a = getattr(module, "lora_A", None)
    if lora_a is None:
        return []
    return [name for name in module.active_adapters if name in lora_a]


def response_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_actions: int,
    *,
    share: bool = True,
) -> torch.Tensor:
    """Logits that predict the last A tokens of every row, as
    :func:`~services.trainer.models.prefix_sharing.response_logits` (same arguments and result, up to float
    rounding), computed as the module docstring says. The caller checks :func:`applies`.

    Args:
        model: A model :func:`supports` accepts.
        input_ids: (B, T) int64, on the CPU.
        attention_mask: (B, T) 0/1.
        num_actions: A, in [1, T).
        share: Let rows that repeat a prompt (or its head) run it once.

    Returns:
        (B, A, V) logits in the compute dtype (:func:`compute_dtype`), with grad.
    """
    dtype = compute_dtype(model)
    assert dtype is not None  # noqa: S101 - applies() checked it
    inner = _causal_lm(model)
    rows, num_tokens = input_ids.shape
    input_ids, attention_mask, prefix, first, inverse = _prefix(
        input_ids, attention_mask, num_tokens - num_actions, share
    )
    with torch.autocast("cpu", enabled=False):
        hidden, rest = _decoder(inner, input_ids, attention_mask, prefix, first, inverse, dtype)
        # positions prefix-1 .. T-2 of every row: the prefix's last, then the rest; the last A predict the actions
        last = hidden.view(first.numel(), prefix, -1)[:, -1].index_select(0, inverse).unsqueeze(1)
        tail = torch.cat([last, rest.view(rows, num_tokens - 1 - prefix, last.shape[-1])], dim=1)[
            :, -num_actions:
        ]
        head = inner.get_output_embeddings()
        weight, bias = _weights((head,), dtype)
        return F.linear(inner.model.norm(tail).to(dtype), weight, bias)


def _prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int, share: bool) -> PrefixLayout:
    """The rows to compute, the columns run once per distinct value and the rows that hold them
    (:func:`~services.trainer.models.prefix_sharing.prefix_layout`); every row its own whole prompt, as given, when
    nothing is shared."""
    layout = prefix_layout(input_ids, attention_mask, width) if share else None
    if layout is None:
        every = torch.arange(input_ids.shape[0])
        return PrefixLayout(input_ids, attention_mask, width, every, every)
    return layout


def _decoder(
    inner: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prefix: int,
    first: torch.Tensor,
    inverse: torch.Tensor,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoder's last hidden states (before the final norm): (U * S, hidden) of the distinct prefixes and
    (B * R, hidden) of every row's columns ``[S, T - 1)``, float32."""
    end = input_ids.shape[1] - 1
    positions = position_ids(attention_mask)
    embed = inner.get_input_embeddings()
    hidden = torch.cat(
        [
            _embed(embed, input_ids[first, :prefix]).flatten(0, 1),
            _embed(embed, input_ids[:, prefix:end]).flatten(0, 1),
        ]
    )  # (U*S + B*R, hidden)
    flat = torch.cat([positions[first, :prefix].flatten(), positions[:, prefix:end].flatten()]).unsqueeze(0)
    cos, sin = inner.model.rotary_emb(hidden.unsqueeze(0), flat)  # (1, M, D)
    rope = (cos[0].unsqueeze(1), signed_sin(sin[0]).unsqueeze(1))  # (M, 1, D)
    masks = _masks(attention_mask, prefix, first)
    split = first.numel() * prefix
    for layer in inner.model.layers:
        hidden = _layer(layer, hidden, rope, masks, split, inverse, dtype)
    return hidden[:split], hidden[split:]


def _embed(embed: torch.nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    """``embed(ids)`` without the module call: (..., hidden). Its ``padding_idx`` row gets no gradient (transformers
    sets it to ``pad_token_id``, a token that can also be a valid input, an end of turn), as in ``nn.Embedding``."""
    return F.embedding(
        ids, embed.weight, embed.padding_idx, scale_grad_by_freq=embed.scale_grad_by_freq, sparse=embed.sparse
    )


def _masks(
    attention_mask: torch.Tensor, prefix: int, first: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Which keys each query sees, (N, 1, 1, Q, L) bool: the prefixes' causal mask over their non-pad columns
    (U, ..., S, S), and the rest's, over its prefix's columns and its own up to itself (B, ..., R, S + R)."""
    end = attention_mask.shape[1] - 1
    keys = attention_mask.bool()
    cols = torch.arange(end)
    causal = cols.unsqueeze(0) <= cols.unsqueeze(1)  # (end, end): query i sees keys <= i
    head = causal[:prefix, :prefix].unsqueeze(0) & keys[first, :prefix].unsqueeze(1)
    rest = causal[prefix:end, :end].unsqueeze(0) & keys[:, :end].unsqueeze(1)
    return head[:, None, None], rest[:, None, None]


def _layer(
    layer: torch.nn.Module,
    hidden: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    masks: tuple[torch.Tensor, torch.Tensor],
    split: int,
    inverse: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """One decoder layer over all M rows (prefix tokens, then the rest): ``h + attn(norm(h))``, then
    ``h + mlp(norm(h))``, transformers' Llama order; hidden (M, hidden) float32."""
    attn, groups = layer.self_attn, layer_groups(layer)
    size = attn.head_dim
    heads, kv_heads = attn.q_proj.out_features // size, attn.k_proj.out_features // size
    qkv = _product(groups["qkv"], layer.input_layernorm(hidden).to(dtype), dtype)
    qk, v = qkv.split([(heads + kv_heads) * size, kv_heads * size], dim=-1)
    q, k = rotate(qk.view(-1, heads + kv_heads, size), *rope).split(
        [heads, kv_heads], dim=1
    )  # (M, H|K, D) f32
    v = v.view(-1, kv_heads, size).float()
    units, prefix = masks[0].shape[0], masks[0].shape[-1]
    rows, rest = masks[1].shape[0], masks[1].shape[-2]
    qh, kh, vh = (t[:split].unflatten(0, (units, prefix)) for t in (q, k, v))  # (U, S, ., D)
    qr, kr, vr = (t[split:].unflatten(0, (rows, rest)) for t in (q, k, v))  # (B, R, ., D)
    kh, vh = kh.transpose(1, 2), vh.transpose(1, 2)  # (U, K, S, D)
    keys = torch.cat([kh.index_select(0, inverse), kr.transpose(1, 2)], dim=2)  # (B, K, S + R, D)
    values = torch.cat([vh.index_select(0, inverse), vr.transpose(1, 2)], dim=2)
    out = torch.cat(
        [
            _attend(qh, kh, vh, masks[0], attn.scaling).flatten(0, 1),
            _attend(qr, keys, values, masks[1], attn.scaling).flatten(0, 1),
        ]
    )  # (M, H * D)
    hidden = hidden + _product(groups["o"], out.to(dtype), dtype)
    gate, up = _product(groups["gate_up"], layer.post_attention_layernorm(hidden).to(dtype), dtype).chunk(
        2, dim=-1
    )
    return hidden + _product(groups["down"], F.silu(gate) * up, dtype)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """``softmax(q k^T scale, masked) v`` of (N, Q, H, D) float32 queries over (N, K, L, D) keys and values, the
    H / K query heads of a key/value head as that head's rows (PyTorch's math SDPA, which transformers' ``sdpa``
    attention runs in these forwards, also computes bf16 inputs in float32). Returns (N, Q, H * D) float32."""
    n, width, heads, size = q.shape
    kv_heads = k.shape[1]
    grouped = q.view(n, width, kv_heads, heads // kv_heads, size).permute(0, 2, 3, 1, 4)  # (N, K, H/K, Q, D)
    scores = torch.matmul(grouped.flatten(2, 3), k.transpose(-1, -2)) * scale  # (N, K, H/K * Q, L)
    scores = scores.view(n, kv_heads, heads // kv_heads, width, k.shape[2]).masked_fill(
        ~mask, torch.finfo(scores.dtype).min
    )
    probs = torch.softmax(scores, dim=-1).flatten(2, 3)
    out = torch.matmul(probs, v).view(n, kv_heads, heads // kv_heads, width, size)
    return out.permute(0, 3, 1, 2, 4).reshape(n, width, heads * size)


def _product(linears: tuple[torch.nn.Module, ...], x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The fused output of ``linears`` (LoRA layers or plain linears) on (M, in) ``x`` in ``dtype``: (M, sum out)."""
    bases = tuple(getattr(m, "base_layer", m) for m in linears)
    weight, bias = _weights(bases, dtype)
    out = F.linear(x, weight, bias)
    adapters = [_adapters(m) for m in linears]
    if not any(adapters):
        return out
    a_rows, b_blocks = [], []
    for m, names in zip(linears, adapters, strict=True):
        a_rows += [m.lora_A[n].weight for n in names]
        b_blocks.append(
            _joined([m.lora_B[n].weight * m.scaling[n] for n in names], dim=1)
            if names
            else getattr(m, "base_layer", m).weight.new_zeros(m.out_features, 0)
        )
    lora_a = _joined(a_rows, dim=0).to(dtype)  # (sum r, in)
    lora_b = (torch.block_diag(*b_blocks) if len(b_blocks) > 1 else b_blocks[0]).to(dtype)  # (sum out, sum r)
    return out + F.linear(F.linear(x, lora_a), lora_b)


def _joined(tensors: list[torch.Tensor], dim: int) -> torch.Tensor:
    """``torch.cat(tensors, dim)``, without the copy when there is one."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim=dim)


def _weights(
    linears: tuple[torch.nn.Linear, ...], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused weight and bias of ``linears`` in ``dtype``: cached when none requires grad (remade when a source
    changed), else made from the parameters (differentiable)."""
    params = sources(linears)
    if any(p.requires_grad for p in params):
        weight, bias = fused(linears)
        return weight.to(dtype), None if bias is None else bias.to(dtype)
    key = (stamp(params), dtype)
    cached = _FROZEN.get(linears[0])
    if cached is None or cached[0] != key:
        with torch.no_grad():
            weight, bias = fused(linears)
            cached = (key, weight.to(dtype).contiguous(), None if bias is None else bias.to(dtype))
        _FROZEN[linears[0]] = cached
    return cached[1], cached[2]
