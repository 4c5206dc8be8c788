"""Rollout engines behind one interface: transformers ``generate`` (CPU, GPU) and vLLM (GPU, when installed).

``VLLMRolloutEngine`` is imported lazily (``from services.trainer.rollout.engines.vllm_engine import ...``) so that
importing this package never needs vllm.

Folders: :mod:`.engines` (the engines and how an actor builds and samples them), :mod:`.episodes` (playing a
step's episodes) and :mod:`.serving` (what the inference gateway serves from).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from services.trainer.rollout.engines.base import Generation, Prompt, RolloutEngine, SamplingParams
    from services.trainer.rollout.engines.hf import AgentModel, HFRolloutEngine

#: The names this package exports from :mod:`.engines.base`, and from :mod:`.engines.hf`: imported on first use
#: (PEP 562), so that importing a torch-free part of the package (``.episodes.env_config``, which ``marti train``
#: needs to check a config) does not import torch.
_FROM_BASE = ("Generation", "Prompt", "RolloutEngine", "SamplingParams")
_FROM_HF = ("AgentModel", "HFRolloutEngine")


def __getattr__(name: str) -> Any:
    """Import an exported name from its module on first use (module ``__getattr__``, PEP 562).

    Raises:
        AttributeError: ``name`` is not exported here.
    """
    if name in _FROM_BASE:
        from services.trainer.rollout.engines import base as module
    elif name in _FROM_HF:
        from services.trainer.rollout.engines import hf as module  # type: ignore[no-redef]
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def vllm_available() -> bool:
    """True when the ``vllm`` package can be imported (found by spec, without importing it)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


__all__ = [
    "AgentModel",
    "Generation",
    "HFRolloutEngine",
    "Prompt",
    "RolloutEngine",
    "SamplingParams",
    "vllm_available",
]
