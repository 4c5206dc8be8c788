"""Tiny random models beside the tiny Llama (``build_tiny_model``), for tests that cover another architecture."""

from __future__ import annotations

import torch

_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
"""The Llama-family tiny models' shape: 2 layers, hidden 64, grouped heads (4 query, 2 key/value)."""


def tiny_qwen2(vocab: int, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A tiny Qwen2 (q/k/v biases, grouped heads: 4 query, 2 key/value; untied head), random weights and random
    biases (seed 3), in eval mode."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, tie_word_embeddings=False, **_SHAPE)
    torch.manual_seed(3)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model.to(dtype)


def tiny_mistral(vocab: int, sliding_window: int) -> torch.nn.Module:
    """A tiny Mistral whose every layer attends over a sliding window of ``sliding_window`` columns (grouped heads:
    4 query, 2 key/value), random weights (seed 3), float32, in eval mode."""
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=vocab, sliding_window=sliding_window, **_SHAPE)
    torch.manual_seed(3)
    return MistralForCausalLM(cfg).eval()


def tiny_lfm2(vocab: int) -> torch.nn.Module:
    """A tiny LFM2: a short-convolution layer (its cache holds a convolution state, not keys and values), then a
    full-attention layer; random weights (seed 3), float32, in eval mode."""
    from transformers import Lfm2Config, Lfm2ForCausalLM

    cfg = Lfm2Config(vocab_size=vocab, layer_types=["conv", "full_attention"], **_SHAPE)
    torch.manual_seed(3)
    return Lfm2ForCausalLM(cfg).eval()


def tiny_mpt(vocab: int) -> torch.nn.Module:
    """A tiny MPT: ALiBi attention (a bias by column distance, no position embedding), random weights (seed 3),
    float32, in eval mode."""
    from transformers import MptConfig, MptForCausalLM

    cfg = MptConfig(vocab_size=vocab, d_model=64, n_heads=4, n_layers=2, expansion_ratio=2)
    torch.manual_seed(3)
    return MptForCausalLM(cfg).eval()
