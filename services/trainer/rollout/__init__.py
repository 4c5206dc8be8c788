"""Rollout engines behind one interface: transformers ``generate`` (CPU, GPU) and vLLM (GPU, when installed).

``VLLMRolloutEngine`` is imported lazily (``from services.trainer.rollout.engines.vllm_engine import ...``) so that
importing this package never needs vllm.

Folders: :mod:`.engines` (the engines and how an actor builds and samples them), :mod:`.episodes` (playing a
step's episodes) and :mod:`.serving` (what the inference gateway serves from).
"""

from services.trainer.rollout.engines.base import Generation, Prompt, RolloutEngine, SamplingParams
from services.trainer.rollout.engines.hf import AgentModel, HFRolloutEngine


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
