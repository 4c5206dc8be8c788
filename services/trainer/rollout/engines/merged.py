"""Sampling copies of a LoRA policy with the adapter merged into the base weights (``rollout.dtype`` copies only).

When a transformers engine samples a peft LoRA model in another dtype (:mod:`~services.trainer.rollout.engines.precision`),
it needs a converted copy anyway. Instead of converting the peft model, adapters and all, :class:`MergedLoRA` holds a
plain transformers model (peft's LoRA layers removed) whose adapted linears carry ``W + scaling * B @ A``, computed in
fp32 from the policy's base weight ``W`` and the adapter's ``A`` (r, in) and ``B`` (out, r), then cast to the sampling
dtype. A decode step then runs no adapter code (at batch 8 on SmolLM2-135M peft's unmerged adapters were ~5 ms of a
~36 ms bf16 step). Every ``update_weights`` / ``pinned`` of the agent recomputes the merged weights from the adapter
it loads; behaviour log-probabilities are those of the merged copy's forward, which sampled.

Memory: a merged copy is one whole base model in the sampling dtype per adapter, where the unmerged copy is one base
for all adapters on it. :func:`merged_copies` therefore merges a base's adapters only where the engine's agents use
at most ``limit`` distinct adapters of it (the engines' ``merge_adapters``, default 1: a single adapter on a base
merges at about the memory of the unmerged copy; several agents with one adapter each keep the shared unmerged copy
unless ``merge_adapters`` allows one base copy per adapter). The merged copy keeps a reference to the policy's base
linears (it reads ``W`` at every merge) and an fp32 copy of the adapter (``r * (in + out)`` values per adapted
linear).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch

from marti.errors import InvalidArgumentError

__all__ = ["MergedLoRA", "can_merge", "merged_copies"]

_PEFT_PREFIX = "base_model.model."
"""What a peft model's module names start with, before the wrapped transformers model's own names."""


def _lora_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Module name (in ``model``) -> peft LoRA layer, for every LoRA layer of ``model`` (empty for a plain model)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft missing: no model can hold adapters
        return {}
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def can_merge(model: torch.nn.Module, adapter_name: str) -> bool:
    """Whether :class:`MergedLoRA` can merge ``adapter_name`` of ``model``: a peft model whose LoRA layers are all
    peft ``lora.Linear`` layers over ``nn.Linear`` with the plain update ``scaling * B @ A`` for that adapter (no
    DoRA, no adapter bias, no ``fan_in_fan_out``). False for anything else (the engine then keeps the unmerged copy)."""
    from peft.tuners.lora import Linear as LoraLinear

    layers = _lora_layers(model)
    if not layers or not hasattr(model, "unload"):
        return False
    for name, layer in layers.items():
        if not (name.startswith(_PEFT_PREFIX) and isinstance(layer, LoraLinear)):
            return False
        if not isinstance(layer.base_layer, torch.nn.Linear) or layer.fan_in_fan_out:
            return False
        if adapter_name not in layer.lora_A or layer.use_dora.get(adapter_name, False):
            return False
        if getattr(layer, "lora_bias", {}).get(adapter_name, False):
            return False
    return True


class MergedLoRA:
    """A plain copy of a peft LoRA model's base in ``dtype`` with one adapter merged into its linears.

    Args:
        source: The peft model (its base linears are read at every merge; they are frozen in LoRA training).
        adapter_name: The adapter to merge.
        dtype: The copy's floating-point dtype.

    Attributes:
        model: The plain transformers model to sample with (eval mode; buffers keep their dtype).
        adapter_name: The merged adapter.

    Raises:
        InvalidArgumentError: :func:`can_merge` is False for ``source`` and ``adapter_name``.
    """

    def __init__(self, source: torch.nn.Module, adapter_name: str, dtype: torch.dtype) -> None:
        if not can_merge(source, adapter_name):
            raise InvalidArgumentError(
                f"adapter {adapter_name!r} of {type(source).__name__} cannot be merged (plain peft LoRA linears only)"
            )
        from peft import get_peft_model_state_dict

        self.adapter_name = adapter_name
        self._layers = _lora_layers(source)  # name -> the source's LoRA layer (base weight, scaling)
        clone = copy.deepcopy(source).unload()  # peft layers replaced by their base layers
        with torch.no_grad():
            for p in clone.parameters():
                if p.is_floating_point():
                    p.data = p.data.to(dtype)
        self.model = clone.eval()
        self._targets = {name: clone.get_submodule(name[len(_PEFT_PREFIX) :]) for name in self._layers}
        current = get_peft_model_state_dict(source, adapter_name=adapter_name)
        self._adapter = {k: v.detach().to(torch.float32, copy=True) for k, v in current.items()}
        self._merge(self._layers)

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The adapter merged now: peft state-dict keys (``get_peft_model_state_dict``'s) -> fp32 CPU copies."""
        return {k: v.to("cpu", copy=True) for k, v in self._adapter.items()}

    def load(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Merge new adapter weights (all or some of :meth:`adapter_state`'s keys) into the copy's linears.

        Every key and shape is checked before anything changes; the linears whose ``A`` or ``B`` is among
        ``weights`` are recomputed from the source's base weight.

        Raises:
            InvalidArgumentError: A key the adapter lacks, or a shape it does not have (named).
        """
        for key, value in weights.items():
            if key not in self._adapter:
                raise InvalidArgumentError(
                    f"adapter weight {key!r} is not in adapter {self.adapter_name!r} ({len(self._adapter)} keys)"
                )
            if tuple(value.shape) != tuple(self._adapter[key].shape):
                raise InvalidArgumentError(
                    f"adapter weight {key!r} has shape {tuple(value.shape)}, expected "
                    f"{tuple(self._adapter[key].shape)}"
                )
        for key, value in weights.items():
            dst = self._adapter[key]
            dst.copy_(value.detach().to(device=dst.device, dtype=dst.dtype))
        changed = {name for name in self._layers if any(k.startswith(f"{name}.lora_") for k in weights)}
        self._merge({name: self._layers[name] for name in changed})

    def _merge(self, layers: Mapping[str, torch.nn.Module]) -> None:
        """Write ``cast(W + scaling * B @ A)`` (computed in fp32) into the copy's linear of each named layer."""
        with torch.no_grad():
            for name, layer in layers.items():
                a = self._adapter[f"{name}.lora_A.weight"]  # (r, in)
                b = self._adapter[f"{name}.lora_B.weight"]  # (out, r)
                w = layer.base_layer.weight.detach().to(device=a.device, dtype=torch.float32)  # (out, in)
                merged = torch.addmm(w, b, a, alpha=float(layer.scaling[self.adapter_name]))
                target = self._targets[name].weight
                target.copy_(merged.to(device=target.device, dtype=target.dtype))


def merged_copies(
    targets: Mapping[str, tuple[torch.nn.Module, str | None]], dtype: torch.dtype | None, limit: int
) -> dict[str, MergedLoRA]:
    """The merged copies a transformers engine samples with, per agent.

    Args:
        targets: agent id -> (model, adapter name or None), as the engine is given them.
        dtype: The sampling dtype; None (no converted copies) merges nothing.
        limit: Merge a model's adapters only when the agents use at most this many distinct adapters of it (one
            whole base copy in ``dtype`` each); 0 merges nothing.

    Returns:
        agent id -> its :class:`MergedLoRA`, for the agents whose model is a LoRA model that needs a converted copy
        (:func:`~services.trainer.rollout.engines.precision.needs_copy`) and :func:`can_merge`; agents on the same
        model and adapter share one copy. Other agents are absent.
    """
    from services.trainer.rollout.engines.precision import needs_copy

    if dtype is None or limit <= 0:
        return {}
    adapters: dict[int, set[str]] = {}
    for model, adapter in targets.values():
        if adapter is not None:
            adapters.setdefault(id(model), set()).add(adapter)
    memo: dict[tuple[int, str], MergedLoRA] = {}
    out = {}
    for agent, (model, adapter) in targets.items():
        if adapter is None or len(adapters[id(model)]) > limit:
            continue
        if not needs_copy(model, dtype) or not all(can_merge(model, a) for a in adapters[id(model)]):
            continue
        key = (id(model), adapter)
        if key not in memo:
            memo[key] = MergedLoRA(model, adapter, dtype)
        out[agent] = memo[key]
    return out
