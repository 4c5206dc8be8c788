"""A lean forward of Llama-family causal LMs for the CPU decode loop, with bf16 weights prepacked for oneDNN.

A transformers forward of one decode step at batch 8 spends much of its time outside the matrix products (module
calls, mask building, separate q/k/v and gate/up products), and its bf16 products read each weight in the plain
(out, in) layout, which oneDNN reorders on every call. :class:`LeanCausalLM` computes what the model's
``forward(..., logits_to_keep=1)`` computes, the same operations in the same dtypes and order (the model's own
RMSNorm and rotary embedding modules, SDPA with the query/key arrangement transformers' ``sdpa`` attention uses
(but for one bf16 query per row without a mask, where another arrangement is 4.6x faster with equal outputs:
:func:`_attend`),
the SiLU-gated MLP, the head on the last position only), with q/k/v fused into one product and gate/up into
another, and, for bf16 weights, every product's weight reordered once for oneDNN
(``torch.ops.mkldnn._reorder_linear_weight``, what inductor's freezing does). Float32 products stay plain
``F.linear`` (a packed float32 product rounds differently). Measured on SmolLM2-135M against the transformers
forward over a left-padded prefill and decode steps: bf16 and float32 logits equal to the last bit on the 2-vCPU
Xeon; the tests allow float rounding. Speed: docs/benchmarks.md, "Rollout engines".

It serves plain transformers ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` models on the CPU (:func:`supports`); a
peft model (unmerged adapters), another architecture, another attention implementation or a CUDA model keeps the
transformers forward. The fused and packed copies are remade for exactly the products whose weights changed
(:meth:`LeanCausalLM.refresh`, by each weight's identity, storage and version counter, which ``copy_``, a replaced
``.data`` and a replaced parameter or module (``load_state_dict(..., assign=True)``) change).

Memory: the fused and packed copies hold up to every linear weight once more, in the model's dtype.

Shapes: B rows, q new positions per row, L key/value positions (filled cache + q), V vocabulary, Hq query heads,
Hk key/value heads, D head size.
"""

from __future__ import annotations

from dataclasses import dataclass
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

__all__ = ["LeanCausalLM", "supports"]

PACKED_DTYPES = (torch.bfloat16, torch.float32)
"""Weight dtypes :class:`LeanCausalLM` serves."""


def supports(model: torch.nn.Module) -> bool:
    """Whether :class:`LeanCausalLM` reproduces ``model``'s forward: a plain transformers model the lean forwards
    compute (:func:`~services.trainer.models.llama_family.architecture_supported`: Llama or Qwen2, SiLU MLP, full
    attention) on the CPU in a dtype of :data:`PACKED_DTYPES` with transformers' ``sdpa`` attention (the default; a
    model loaded with ``eager`` or another implementation keeps it), every projection and the head a plain whole
    ``nn.Linear`` (:func:`~services.trainer.models.llama_family.plain_linear`: not a LoRA layer injected without a
    peft wrapper, not a ZeRO-3 partition)."""
    if not architecture_supported(model):
        return False
    weight = model.get_input_embeddings().weight
    if weight.device.type != "cpu" or weight.dtype not in PACKED_DTYPES:
        return False
    return (
        getattr(model.config, "_attn_implementation", None) in (None, "sdpa")
        and all(plain_linear(m) for layer in model.model.layers for m in layer_linears(layer))
        and plain_linear(model.get_output_embeddings())
    )


@dataclass
class _Packed:
    """One product's weight: the stamp of the parameters it was made from at packing (:func:`~services.trainer.models.llama_family.stamp`), the (out, in)
    weight, its oneDNN-packed form (None where packing is unavailable) and the bias (or None)."""

    stamp: tuple[tuple[int, int, int], ...]
    weight: torch.Tensor
    packed: torch.Tensor | None
    bias: torch.Tensor | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T + bias`` for (..., in) ``x``."""
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, x.shape[-1])
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], out.shape[-1])


def _pack(linears: tuple[torch.nn.Linear, ...]) -> _Packed:
    """The fused product of ``linears`` (their outputs concatenated in order), packed for oneDNN."""
    with torch.no_grad():
        weight, bias = fused(linears)
        weight = weight.detach()
        bias = None if bias is None else bias.detach()
        packed = _reorder(weight)
    return _Packed(stamp(sources(linears)), weight, packed, bias)


def _reorder(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` reordered for oneDNN's products, or None where this torch build has no oneDNN."""
    if not torch.backends.mkldnn.is_available() or weight.dtype == torch.float32:
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight, 8)


class _Layer:
    """One decoder layer's packed products and norms, read from the layer's current modules at each refresh."""

    def __init__(self, layer: torch.nn.Module) -> None:
        self.module = layer
        self.products: dict[str, _Packed] = {}
        self.refresh()

    def refresh(self) -> int:
        """Repack every product whose source weights changed (a weight written in place, its ``.data`` replaced,
        or a new parameter or module put in its place); returns how many were repacked."""
        attn = self.module.self_attn
        self.norms = (self.module.input_layernorm, self.module.post_attention_layernorm)
        self.head_dim = attn.head_dim
        self.heads = (attn.q_proj.out_features // attn.head_dim, attn.k_proj.out_features // attn.head_dim)
        self.qk_v = [attn.q_proj.out_features + attn.k_proj.out_features, attn.v_proj.out_features]
        count = 0
        for name, linears in layer_groups(self.module).items():
            current = self.products.get(name)
            if current is None or stamp(sources(linears)) != current.stamp:
                self.products[name] = _pack(linears)
                count += 1
        return count


class LeanCausalLM:
    """The last position's logits of a :func:`supports` model, computed with packed, fused products.

    Args:
        model: A model :func:`supports` accepts (a transformers ``LlamaForCausalLM`` or ``Qwen2ForCausalLM``).

    Raises:
        ValueError: ``model`` is not supported.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        if not supports(model):
            raise ValueError(f"LeanCausalLM does not serve {type(model).__name__} on {model.device}")
        self.model = model
        self.layers: list[_Layer] = []
        self.head: _Packed | None = None
        self.refresh()

    def refresh(self) -> int:
        """Re-read the model's modules and repack the products whose weights changed since they were packed (all
        of them at the first call; a parameter or module replaced since counts as changed).

        Returns:
            How many products were repacked.
        """
        inner = self.model.model
        self.embed = inner.embed_tokens
        self.rotary = inner.rotary_emb
        self.final_norm = inner.norm
        known = {id(layer.module): layer for layer in self.layers}
        count = 0
        layers = []
        for module in inner.layers:
            layer = known.get(id(module))
            if layer is None or layer.module is not module:
                layer = _Layer(module)
                count += len(layer.products)
            else:
                count += layer.refresh()
            layers.append(layer)
        self.layers = layers
        head = self.model.get_output_embeddings()
        if self.head is None or stamp(sources((head,))) != self.head.stamp:
            self.head = _pack((head,))
            count += 1
        return count

    @torch.no_grad()
    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Any,
    ) -> torch.Tensor:
        """Run ``input_ids`` after what ``cache`` holds and return the logits of each row's last position.

        Args:
            input_ids: (B, q) token ids.
            attention_mask: (B, L) 0/1 over the cached positions and these q (0: padding).
            position_ids: (B, q) rotary positions.
            cache: A transformers ``Cache`` of per-layer key/value layers (``cache.layers[i].update(k, v)``
                appends (B, Hk, q, D) states and returns the (B, Hk, L, D) filled ones), as
                :func:`~services.trainer.rollout.engines.static._preallocated_cache` makes.

        Returns:
            (B, V) logits in the model's dtype.
        """
        hidden = self.embed(input_ids)  # (B, q, hidden)
        cos, sin = self.rotary(hidden, position_ids)  # (B, q, D)
        cos, sin = cos.unsqueeze(1), signed_sin(sin).unsqueeze(1)
        mask = _attention_mask(attention_mask, input_ids.shape[1])
        for i, layer in enumerate(self.layers):
            hidden = _layer_forward(layer, hidden, cos, sin, mask, cache.layers[i])
        last = self.final_norm(hidden[:, -1:])  # (B, 1, hidden)
        assert self.head is not None
        return self.head(last)[:, 0]


def _layer_forward(
    layer: _Layer,
    hidden: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    mask: torch.Tensor | None,
    cache: Any,
) -> torch.Tensor:
    """One decoder layer: ``h + attn(norm(h))``, then ``h + mlp(norm(h))`` (transformers' Llama order); ``sin`` in
    :func:`~services.trainer.models.llama_family.signed_sin` form."""
    rows, width = hidden.shape[:2]
    p, D = layer.products, layer.head_dim
    heads, kv_heads = layer.heads
    qk, v = p["qkv"](layer.norms[0](hidden)).split(layer.qk_v, dim=-1)  # q and k columns, v columns
    qk = rotate(qk.view(rows, width, heads + kv_heads, D).transpose(1, 2), cos, sin)  # (B, Hq + Hk, q, D)
    q, k = qk.split([heads, kv_heads], dim=1)  # (B, Hq, q, D), (B, Hk, q, D)
    v = v.view(rows, width, -1, D).transpose(1, 2)
    keys, values = cache.update(k, v)  # (B, Hk, L, D)
    attn = _attend(q, keys, values, mask)  # (B, Hq, q, D)
    hidden = hidden + p["o"](attn.transpose(1, 2).reshape(rows, width, -1))
    gate, up = p["gate_up"](layer.norms[1](hidden)).chunk(2, dim=-1)
    return hidden + p["down"](F.silu(gate) * up)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """SDPA of (B, Hq, q, D) queries over (B, Hk, L, D) keys and values, arranged as transformers' ``sdpa``
    attention arranges them (so the kernels and their rounding are the same): without a mask, grouped heads
    (``enable_gqa``) and causal when q > 1; one query per row with a mask, the Hq / Hk query heads of a key/value
    head as that head's rows; otherwise keys and values repeated to Hq heads.

    One bf16 query per row without a mask also takes the rows arrangement: PyTorch's CPU flash kernel with
    ``enable_gqa`` took 469 us a call at (8, 9, 1, 64) over 52 keys where the rows arrangement took 101 us, with
    bit-equal outputs (2-vCPU AMD EPYC, 2026-12-07; float32 keeps ``enable_gqa``: 71 against 121 us)."""
    rows, heads, width, size = q.shape
    groups = heads // k.shape[1]
    if width == 1 and (mask is not None or q.dtype == torch.bfloat16):
        grouped = q.reshape(rows, k.shape[1], groups, size)
        return F.scaled_dot_product_attention(grouped, k, v, attn_mask=mask).reshape(rows, heads, 1, size)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=width > 1, enable_gqa=True)
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _attention_mask(attention_mask: torch.Tensor, width: int) -> torch.Tensor | None:
    """(B, 1, q, L) bool: query ``i`` (slot ``L - q + i``) sees the keys at or before its slot that are not pads (a
    left pad's query sees none: SDPA gives it zeros; no query reads a pad's keys, wherever the pad sits). None when
    no key is a pad and the queries are all the positions or one (causal attention needs no mask then)."""
    length = attention_mask.shape[1]
    if (width == 1 or width == length) and bool(attention_mask.bool().all()):
        return None
    keys = attention_mask.bool()  # (B, L)
    slots = torch.arange(length - width, length, device=keys.device).unsqueeze(1)  # (q, 1)
    cols = torch.arange(length, device=keys.device).unsqueeze(0)  # (1, L)
    return ((cols <= slots).unsqueeze(0) & keys.unsqueeze(1)).unsqueeze(1)
