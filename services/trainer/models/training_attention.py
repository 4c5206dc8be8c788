"""Which scaled-dot-product attention kernel a CPU training forward runs: the math kernel for short sequences.

On the CPU, PyTorch's default SDPA kernel for a forward that records gradients is its flash kernel, whose backward
has a cost per (row, head) that dominates for short sequences: SmolLM2-135M's shapes in ``marti bench trainer``
(queries (8, 9, 11, 64) on 57 keys, prefixes (2, 9, 47, 64)) take 3.8 ms and 2.0 ms per layer forward and
backward with flash, 1.7 ms and 0.9 ms with the math kernel (``softmax(q k^T / sqrt(d) + mask) v`` as ordinary
autograd ops, which stores the (rows, heads, Tq, Tk) scores). The math kernel stops winning as keys grow: 0.5-0.8x
flash's time up to 128 keys, 0.6-1.0x up to 192, 1.5-2.5x from 256 keys (12 queries on 512 keys: 31 ms against
17 ms), measured on an Intel Xeon with AMX, 2 threads, bf16 autocast (docs/benchmarks.md, "trainer vs TRL").
Forwards without grad keep flash, whose forward alone is the faster one at every size measured.

Both kernels compute the same function; results agree up to float rounding.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from marti.errors import InvalidArgumentError

MATH_ATTENTION_MAX_TOKENS = 128
"""Longest sequence (keys per query, T of the (B, T) batch) whose CPU training forward runs the math kernel."""


def training_attention(model: torch.nn.Module, num_tokens: int) -> Any:
    """Context for one log-probability forward of ``model`` over ``num_tokens`` columns: SDPA restricted to the math
    kernel when the forward records gradients on the CPU, ``num_tokens <= MATH_ATTENTION_MAX_TOKENS`` (every
    attention call of the forward then has at most that many keys) and the model has no gradient checkpointing
    (whose backward reruns the forward outside this context), else no change (a null context).

    The restriction is PyTorch's process-wide ``sdpa_kernel`` setting, held while any thread is inside such a
    context (:func:`_math_kernel`: the first to enter sets it, the last to leave restores what was set before, so
    overlapping forwards in several threads cannot leave it set); SDPA calls of other threads meanwhile also run
    the math kernel (the same results up to rounding). The backward, run later, follows the kernel its forward
    recorded.

    Args:
        model: The model (its first parameter's device is the forward's).
        num_tokens: T, the columns of the forward's (B, T) input ids, >= 1.

    Raises:
        InvalidArgumentError: ``num_tokens`` < 1.
    """
    if num_tokens < 1:
        raise InvalidArgumentError(f"num_tokens must be >= 1, got {num_tokens}")
    device = next(model.parameters()).device
    if (
        device.type == "cpu"
        and torch.is_grad_enabled()
        and num_tokens <= MATH_ATTENTION_MAX_TOKENS
        and not checkpointed(model)
    ):
        return _math_kernel()
    return contextlib.nullcontext()


_LOCK = threading.Lock()
_HOLDERS = 0
_SETTING: Any = None


@contextlib.contextmanager
def _math_kernel() -> Iterator[None]:
    """``sdpa_kernel(SDPBackend.MATH)`` shared by every thread inside: set by the first to enter, restored by the
    last to leave (nested ``sdpa_kernel`` contexts in several threads would each restore what they saw on entry,
    and the one leaving last could restore the math-only setting another had made)."""
    global _HOLDERS, _SETTING
    with _LOCK:
        if _HOLDERS == 0:
            _SETTING = sdpa_kernel(SDPBackend.MATH)
            _SETTING.__enter__()
        _HOLDERS += 1
    try:
        yield
    finally:
        with _LOCK:
            _HOLDERS -= 1
            if _HOLDERS == 0:
                _SETTING.__exit__(None, None, None)
                _SETTING = None


def checkpointed(model: torch.nn.Module) -> bool:
    """Whether ``model`` (a transformers model, or a wrapper such as peft's around one) has gradient (activation)
    checkpointing on: some module's ``gradient_checkpointing`` flag is set, what transformers'
    ``is_activation_checkpointing`` computes, in one walk over the modules (the property, reached through a peft
    wrapper's attribute forwarding, walked them twice per call: 20 ms on SmolLM2-135M, on every update forward). The
    flag is read from the module's own attributes, then its class's (a module without it: not checkpointed)."""
    return any(
        vars(m).get("gradient_checkpointing", getattr(type(m), "gradient_checkpointing", False))
        for m in model.modules()
    )
