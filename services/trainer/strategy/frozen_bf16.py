"""Cached bf16 copies of frozen linear weights, for bf16 autocast on the CPU (``strategy.bf16`` with LoRA).

Autocast casts a float32 weight to bf16 at every forward unless the weight is a leaf that requires grad (only those
enter its cast cache). A LoRA policy's base linears are frozen, so under ``strategy.bf16`` every forward of the
update re-cast all of them: ~13% of the update's forward and backward on the CPU (8 rows of 60 tokens, SmolLM2-135M:
0.84 s -> 0.73 s without the casts).

:func:`install` gives each frozen ``nn.Linear`` of a model a forward that, only inside bf16 autocast on the weight's
device, multiplies with a cached bf16 copy of the weight (made on first use, remade when the weight is replaced or
changed in place: its storage, device or version counter differ). That is the bf16 rounding autocast applies, so
loss and gradients are those of autocast today. The float32 weight stays the parameter: checkpoints, the reference
forward (LoRA: the same model with adapters disabled, outside autocast), evaluation and the rollout engines' copies
(merged or converted, made from the float32 weights) read it unchanged, and a forward outside bf16 autocast is the plain float32 one. A weight that
requires grad at the call (a trainable linear, or an adapter made trainable later) takes the plain path.

Memory: 2 bytes per element of every frozen linear weight run under autocast (half of the float32 base's linears
again); hence only on the CPU (:class:`~services.trainer.strategy.torch_strategy.TorchTrainEngine`), where memory is
plentiful and the cast is slow. A module copied with ``copy.deepcopy`` keeps the forward but not the cached copy.
"""

from __future__ import annotations

import types
import weakref
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["install", "installed"]

_CACHE: weakref.WeakKeyDictionary[torch.nn.Linear, tuple[tuple[Any, ...], torch.Tensor]] = (
    weakref.WeakKeyDictionary()
)
"""linear -> (what its weight was when cast: storage pointer, device, version counter; the bf16 copy)."""


def install(model: torch.nn.Module) -> int:
    """Give every ``nn.Linear`` of ``model`` whose weight does not require grad the cached-bf16 forward (see the module
    docstring); a linear that already has it is left alone.

    Returns:
        The number of linears given it by this call.
    """
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and not module.weight.requires_grad and not installed(module):
            module.forward = types.MethodType(_forward, module)
            count += 1
    return count


def installed(module: torch.nn.Module) -> bool:
    """Whether ``module`` has the cached-bf16 forward."""
    forward = module.__dict__.get("forward")
    return getattr(forward, "__func__", None) is _forward


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``nn.Linear.forward``, with the cached bf16 weight inside bf16 autocast when the weight is frozen float32."""
    weight = self.weight
    device = weight.device.type
    if (
        weight.dtype == torch.float32
        and not weight.requires_grad
        and torch.is_autocast_enabled(device)
        and torch.get_autocast_dtype(device) == torch.bfloat16
    ):
        weight = _bf16(self)
    return F.linear(x, weight, self.bias)


def _bf16(module: torch.nn.Linear) -> torch.Tensor:
    """The module's weight in bf16: the cached copy, remade when the weight changed since it was cast."""
    weight = module.weight
    key = (weight.data_ptr(), weight.device, weight._version)
    hit = _CACHE.get(module)
    if hit is None or hit[0] != key:
        with torch.no_grad():
            hit = (key, weight.detach().to(torch.bfloat16))
        _CACHE[module] = hit
    return hit[1]
