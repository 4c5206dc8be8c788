"""Hand the output embedding (the LM head) its input in plain row-major strides.

transformers' causal LMs compute logits only for the last positions they need (``logits_to_keep``):
``lm_head(hidden[:, -k:, :])``, a strided view of the (B, T, H) hidden states. On the CPU, PyTorch 2.13's bf16
``linear`` over such a 3-D view does not fold it into one matrix product: it runs a batched product that first
copies the (H, V) transposed weight once per batch row. For SmolLM2's 49,152 x 576 head that is about 100 ms per
row on 2 cores (a (64, 1, 576) prefill spent 6.4 s) against 3-8 ms for the same product over a dense input; float32
is not affected. Every bf16 prefill (``model.generate``, the static engine, the shared-prefix prefill) went through
it. :func:`dense_head_input` gives the head a dense copy of its input (B x k x H values, negligible next to the
product). The logits equal those of the same product over the dense hidden states bit for bit; against the strided
batched product they can differ in the last bits of bf16 (another order of summation), so seeded bf16 draws can
differ from those of code without the hook (``make demo``'s job: docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

import torch


def _dense(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Forward pre-hook: replace a strided input of 3 or more dims by its row-major copy (else keep it)."""
    if not args or not isinstance(args[0], torch.Tensor):
        return None
    x = args[0]
    if x.dim() < 3 or x.stride() == _row_major_strides(x.shape):
        return None
    return (x.clone(memory_format=torch.contiguous_format), *args[1:])


def _row_major_strides(shape: torch.Size) -> tuple[int, ...]:
    """The strides of a dense row-major tensor of ``shape`` (size-1 dimensions included, as ``clone`` gives)."""
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return tuple(reversed(strides))


def is_dense_input_hook(hook: Any) -> bool:
    """Whether ``hook`` (a forward pre-hook) is the one :func:`dense_head_input` registers, which changes only the
    input's memory layout, not the values a linear layer computes."""
    return hook is _dense


def dense_head_input(model: torch.nn.Module) -> bool:
    """Register :func:`_dense` on ``model``'s output embedding (once; copies made with ``copy.deepcopy`` keep it).

    Args:
        model: A transformers causal LM (``get_output_embeddings``); anything else is left alone.

    Returns:
        True when the hook is on the head (registered now or before), False when the model has no output
        embedding.
    """
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    if not isinstance(head, torch.nn.Module):
        return False
    if not any(is_dense_input_hook(hook) for hook in head._forward_pre_hooks.values()):
        head.register_forward_pre_hook(_dense)
    return True
