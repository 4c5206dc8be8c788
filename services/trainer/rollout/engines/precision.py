"""The dtype a transformers rollout engine samples in (``rollout.dtype``), and whether the CPU has native bf16.

On a CPU with AVX512-BF16 or AMX, bf16 matrix products run at 2-4x the fp32 rate (oneDNN), and a rollout is
mostly matrix products (a group's long prompt prefilled, then one forward per token). The engine then samples with
a bf16 copy of each model, refreshed by every ``update_weights``, while training keeps its fp32 weights; the
behaviour log-probabilities it returns are those of the bf16 forward that sampled (the learner's ``tis_cap`` and
``behaviour_kl`` see the train/rollout mismatch). Autocast per forward was measured slower than the copy
(docs/benchmarks.md, "Rollout engines"). A peft LoRA model's copy is instead a plain model with the adapter merged
into its linears, where :func:`~services.trainer.rollout.engines.merged.merged_copies` allows it (see there).

None (the default) keeps the models' own dtype. ``auto`` resolves per device: on a CPU, bf16 where
:func:`cpu_has_bf16` finds native support and fp32 elsewhere; on a GPU, the model's own dtype (no copy).
"""

from __future__ import annotations

from pathlib import Path

import torch

from marti.errors import InvalidArgumentError
from marti.plumbing.cpu_features import CPUINFO, cpu_has_bf16

__all__ = ["ROLLOUT_DTYPES", "cpu_has_bf16", "resolve_rollout_dtype"]

ROLLOUT_DTYPES = ("auto", "float32", "bfloat16")
"""The values of ``rollout.dtype``."""


def resolve_rollout_dtype(
    setting: str | None, device: str | torch.device, cpuinfo: Path = CPUINFO
) -> torch.dtype | None:
    """The dtype the engine samples in for a ``rollout.dtype`` setting on ``device``.

    Args:
        setting: ``auto``, ``float32``, ``bfloat16``, or None (the models' own dtype).
        device: Where the engine's models run (``cpu``, ``cuda``, ``cuda:1``, ...).
        cpuinfo: Where CPU flags are read (tests pass their own file).

    Returns:
        ``torch.float32`` / ``torch.bfloat16``, or None: sample in the models' own dtype (``setting`` None, or
        ``auto`` off the CPU).

    Raises:
        InvalidArgumentError: ``setting`` is not one of :data:`ROLLOUT_DTYPES` (named).
    """
    if setting is None:
        return None
    if setting not in ROLLOUT_DTYPES:
        raise InvalidArgumentError(f"rollout.dtype must be one of {ROLLOUT_DTYPES}, got {setting!r}")
    if setting != "auto":
        return getattr(torch, setting)
    if torch.device(device).type != "cpu":
        return None
    return torch.bfloat16 if cpu_has_bf16(cpuinfo) else torch.float32


def needs_copy(model: torch.nn.Module, dtype: torch.dtype | None) -> bool:
    """Whether sampling ``model`` in ``dtype`` needs a converted copy: some floating-point parameter is in another
    dtype (None: never)."""
    if dtype is None:
        return False
    return any(p.is_floating_point() and p.dtype != dtype for p in model.parameters())


def sampling_copies(models: list[torch.nn.Module], dtype: torch.dtype | None) -> list[torch.nn.Module]:
    """Per model, the module to sample with in ``dtype``: the model itself when it is already in ``dtype``, else a
    deep copy whose floating-point parameters are converted to it (buffers such as the rotary embedding's
    frequencies keep their dtype, so positions stay exact), made once per distinct model object (models shared by
    several agents, or a LoRA base holding several adapters, stay shared among them)."""
    memo: dict[int, torch.nn.Module] = {}
    out = []
    for model in models:
        if id(model) not in memo:
            memo[id(model)] = _converted(model, dtype) if needs_copy(model, dtype) else model
        out.append(memo[id(model)])
    return out


def _converted(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    import copy

    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p in clone.parameters():
            if p.is_floating_point():
                p.data = p.data.to(dtype)
    clone.eval()
    return clone
