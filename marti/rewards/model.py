"""A reward model as a reward kind: an ``AutoModelForSequenceClassification`` with one output, read from a folder.

The folder is what ``save_pretrained`` writes (``config.json``, the weights, the tokenizer's files), as OpenRLHF's
``--reward_pretrain`` and TRL's reward-model ``reward_funcs`` use it. Before any weight is read, its
``config.json`` must name a ``...ForSequenceClassification`` architecture with exactly one label: a causal LM
would load with a freshly initialised, random score head, and a head of several labels has no single reward.

Each completion is scored as the text ``prompt + completion`` (no chat template is applied), in batches of
``batch_size`` texts, each cut to its last ``max_length`` tokens (the start of a long prompt is dropped, never the
completion). Batches are padded on the right, with the pad token the model's config names (a decoder reward
model reads its score at each text's last non-pad token, whose position right padding leaves unchanged), so a
completion's score does not depend on what it is batched with. The model runs in eval mode without
gradients. The score is the head's raw output (no normalisation here).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from marti.errors import InvalidArgumentError, NotFoundError
from marti.plumbing.arguments import checked
from marti.rewards.base import check_batch, check_scores

__all__ = ["ModelRewardScorer", "check_reward_model", "reward_model_config", "reward_model_tokenizer"]


class ModelRewardScorer:
    """Scores completions with a local sequence-classification reward model (one output label).

    Args:
        path: A folder holding the model and its tokenizer (``save_pretrained`` output).
        batch_size: Texts per forward pass (>= 1).
        max_length: Tokens kept per text, its last ones (>= 1).
        device: Torch device to run on (``"cpu"``, ``"cuda:0"``).

    Attributes:
        name: ``"reward model 'PATH'"``, how errors name it.

    Raises:
        NotFoundError: ``path`` is not a folder, or has no ``config.json``, no tokenizer or no weights (named).
        InvalidArgumentError: ``device`` is not a torch device name; the model is not a sequence-classification model, or its head has a number of
            labels other than one (path and ``num_labels`` named); the tokenizer has neither a pad nor an EOS
            token; ``batch_size`` / ``max_length`` < 1.
    """

    @checked
    def __init__(
        self, path: str, *, batch_size: int = 8, max_length: int = 2048, device: str = "cpu"
    ) -> None:
        for arg, value in (("batch_size", batch_size), ("max_length", max_length)):
            if value < 1:
                raise InvalidArgumentError(f"ModelRewardScorer: {arg} must be >= 1, got {value!r}")
        self.path, self.batch_size, self.max_length, self.device = path, batch_size, max_length, device
        self.name = f"reward model {path!r}"
        try:
            torch.device(device)
        except (RuntimeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"ModelRewardScorer: device {device!r} is not a torch device ({exc})"
            ) from None
        config = reward_model_config(path)
        self.tokenizer = reward_model_tokenizer(path, config)
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                path, config=config, local_files_only=True
            )
        except OSError as exc:
            raise NotFoundError(f"{self.name}: the weights cannot be loaded ({exc})") from None
        self.model = model.to(device).eval()

    @checked
    def score(
        self, prompts: Sequence[str], completions: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> list[float]:
        """Score each ``prompt + completion`` text with the model's single output (its raw value), in batches
        of ``batch_size`` (arguments and result as :meth:`RewardScorer.score`; ``columns`` are only checked for
        length: the model does not read them).

        Raises:
            InvalidArgumentError: The inputs disagree in length, a text has no tokens at all (index named), or
                the model produced a non-finite score (index and value named).
        """
        n = check_batch(prompts, completions, columns, scorer=self.name)
        texts = [p + c for p, c in zip(prompts, completions, strict=True)]
        out: list[float] = []
        with torch.inference_mode():
            for start in range(0, n, self.batch_size):
                out += self._forward(texts[start : start + self.batch_size], start)
        return check_scores(out, n, scorer=self.name)

    def _forward(self, texts: list[str], start: int) -> list[float]:
        """The scores of one batch (``start``: the index of its first text, for errors)."""
        enc = self.tokenizer(
            texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_length
        ).to(self.device)
        empty = (enc["attention_mask"].sum(dim=1) == 0).nonzero()
        if len(empty):
            i = start + int(empty[0, 0])
            raise InvalidArgumentError(f"{self.name}: text {i} (prompt + completion) has no tokens")
        logits = self.model(**enc).logits  # (b, 1)
        return logits[:, 0].float().tolist()


def check_reward_model(path: str) -> Any:
    """Check a reward model folder as far as can be done without reading its weights, so a job refuses it before
    anything starts: ``config.json`` (:func:`reward_model_config`), a tokenizer that loads with a pad or EOS token
    (:func:`reward_model_tokenizer`) and a weights file that ``from_pretrained`` reads (``model.safetensors``,
    ``pytorch_model.bin`` or their sharded ``*.index.json``).

    Returns:
        The model's ``transformers`` config.

    Raises:
        NotFoundError / InvalidArgumentError: What :func:`reward_model_config` and :func:`reward_model_tokenizer`
            raise; NotFoundError for a folder without a weights file (the names looked for listed).
    """
    config = reward_model_config(path)
    reward_model_tokenizer(path, config)
    from transformers.utils import (
        SAFE_WEIGHTS_INDEX_NAME,
        SAFE_WEIGHTS_NAME,
        WEIGHTS_INDEX_NAME,
        WEIGHTS_NAME,
    )

    names = (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME)
    if not any((Path(path) / n).is_file() for n in names):
        raise NotFoundError(
            f"reward model {path!r} has no weights file ({', '.join(names)}): a reward model is a folder written "
            "by save_pretrained (config.json, weights, tokenizer)"
        )
    return config


def reward_model_tokenizer(path: str, config: Any) -> Any:
    """The folder's tokenizer, padding on the right with the model's pad token, truncating on the left; a config
    without a pad token gets the tokenizer's pad (or EOS) token id.

    Args:
        path: The reward model folder.
        config: Its config (:func:`reward_model_config`).

    Raises:
        NotFoundError: No tokenizer loads from the folder (the path and the loader's reason named).
        InvalidArgumentError: Neither ``config.json`` nor the tokenizer defines a pad or EOS token.
    """
    name = f"reward model {path!r}"
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (ValueError, OSError) as exc:
        raise NotFoundError(f"{name}: no tokenizer can be loaded from the folder ({exc})") from None
    tokenizer.padding_side, tokenizer.truncation_side = "right", "left"
    if config.pad_token_id is not None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(config.pad_token_id)
    elif tokenizer.pad_token_id is not None or tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
        config.pad_token_id = tokenizer.pad_token_id
    else:
        raise InvalidArgumentError(
            f"{name}: neither config.json nor the tokenizer defines a pad or EOS token; batches need one"
        )
    return tokenizer


def reward_model_config(path: str) -> Any:
    """Read and check a reward model's ``config.json`` without loading its weights: a sequence classifier
    (``*ForSequenceClassification``) with exactly one label. The trainer runs it before a job starts.

    Returns:
        The model's ``transformers`` config.

    Raises:
        NotFoundError: ``path`` is not a folder, or has no ``config.json``.
        InvalidArgumentError: The config cannot be read, names no sequence-classification architecture, or has
            ``num_labels`` other than 1 (the path and the value named).
    """
    name = f"reward model {path!r}"
    folder = Path(path)
    if not (folder / "config.json").is_file():
        what = "has no config.json" if folder.is_dir() else "is not a folder"
        raise NotFoundError(
            f"{name} {what}: a reward model is a folder written by save_pretrained (config.json, "
            "weights, tokenizer)"
        )
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (ValueError, OSError, KeyError, json.JSONDecodeError) as exc:
        raise InvalidArgumentError(f"{name}: config.json cannot be read ({exc})") from None
    architectures = list(getattr(config, "architectures", None) or [])
    if not any(a.endswith("ForSequenceClassification") for a in architectures):
        raise InvalidArgumentError(
            f"{name} is not a sequence-classification model (config.json architectures: "
            f"{architectures}); a reward model is an AutoModelForSequenceClassification with num_labels=1"
        )
    if config.num_labels != 1:
        raise InvalidArgumentError(
            f"{name} has a head of num_labels={config.num_labels} ({architectures[0]}); a reward model "
            "must have exactly one output label (num_labels=1)"
        )
    return config
