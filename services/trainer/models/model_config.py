"""What a model's config says, read without torch: the tiny test model's shape (:class:`TinyModelConfig`) and the
longest sequence a model takes (:func:`model_max_positions`), so that ``marti train`` can check a job against
them before anything starts, and still refuse a bad job in well under a second. Only a model whose length its
``config.json`` does not state as ``max_position_embeddings`` (a GGUF file, GPT-2's ``n_positions``) is read
through transformers' ``AutoConfig``. There is no hub access: importing this module sets ``HF_HUB_OFFLINE=1`` and
``TRANSFORMERS_OFFLINE=1`` (unless already set), before transformers is imported here or by
:mod:`services.trainer.models.loading`, which imports this module first.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from services.trainer.models.gguf_reads import gguf_reads_once  # noqa: E402
from services.trainer.models.resolve import resolve_model  # noqa: E402

__all__ = ["DEFAULT_MAX_POSITIONS", "TinyModelConfig", "model_max_positions"]

DEFAULT_MAX_POSITIONS = 2048
"""The longest sequence assumed of a model whose config states no ``max_position_embeddings``."""


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny random Llama used by tests.

    Attributes:
        num_layers: Transformer blocks (default 2).
        hidden_size: Model width (default 64).
        intermediate_size: MLP width (default 128).
        num_attention_heads: Query heads; must divide ``hidden_size`` (default 4).
        num_key_value_heads: KV heads; must divide ``num_attention_heads`` (default 2).
        max_position_embeddings: Longest sequence in tokens, prompt plus response (default 2048).
    """

    num_layers: int = 2
    hidden_size: int = 64
    intermediate_size: int = 128
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048


def model_max_positions(name: str) -> int:
    """The longest sequence (prompt plus response tokens) model ``name`` takes: its config's
    ``max_position_embeddings`` (:data:`DEFAULT_MAX_POSITIONS` when it states none; ``tiny-llama``: the
    :class:`TinyModelConfig` default), read from the config alone (a GGUF file's metadata), no weights loaded.

    Raises:
        NotFoundError: The model cannot be found locally (see :func:`resolve_model`).
    """
    resolved = resolve_model(name)
    if resolved.kind == "tiny":
        return TinyModelConfig().max_position_embeddings
    if resolved.kind == "hf_dir" and (stated := _stated_max_positions(Path(resolved.path))) is not None:
        return stated
    from transformers import AutoConfig

    if resolved.kind == "gguf":
        with gguf_reads_once():
            config = AutoConfig.from_pretrained(resolved.path, gguf_file=resolved.gguf_file)
    else:
        config = AutoConfig.from_pretrained(resolved.path, local_files_only=True)
    return int(getattr(config, "max_position_embeddings", None) or DEFAULT_MAX_POSITIONS)


def _stated_max_positions(model_dir: Path) -> int | None:
    """``max_position_embeddings`` as the folder's ``config.json`` states it, read as JSON: what transformers'
    config classes give for that key, without importing them (about 1 CPU s in a ``marti train`` driver, which
    otherwise never needs them). ``None`` when the file or the key is missing or not a positive integer, so the
    caller asks ``AutoConfig`` (which also maps other names, such as GPT-2's ``n_positions``)."""
    try:
        stated = json.loads((model_dir / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return stated if type(stated) is int and stated > 0 else None
