"""The reward-model actor of a dataset job (``reward.model``): OpenRLHF's reward model on a Ray actor of its own.

It holds a :class:`marti.rewards.ModelRewardScorer` (an ``AutoModelForSequenceClassification`` with one output
label, in eval mode) and scores ``prompt + completion`` texts in batches of ``reward.model_batch_size``. The
alias ``tiny-llama`` is a tiny randomly initialised ``LlamaForSequenceClassification`` (one label, the SmolLM2
tokenizer), written to a folder and loaded through the same code as a real one; it exists for tests and the
scaled-down design script. The actor gets only :class:`RewardActorConfig`, built on the driver.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from marti.config import TrainConfig
from services.trainer.models.loading import load_tokenizer, tiny_llama_config
from services.trainer.models.resolve import TINY_ALIAS
from services.trainer.ray.actor_setup import ActorConfig, actor_setup


@dataclass(frozen=True)
class RewardActorConfig(ActorConfig):
    """The reward-model actor's part of the training config.

    Attributes:
        path: ``reward.model``: a local folder, or ``tiny-llama``.
        batch_size: ``reward.model_batch_size``.
        max_length: ``reward.model_max_length`` (tokens).
    """

    path: str = ""
    batch_size: int = 8
    max_length: int = 2048


def reward_actor_config(cfg: TrainConfig) -> RewardActorConfig:
    """The narrow config of the reward-model actor (``cfg.reward.model`` must be set)."""
    r = cfg.reward
    return RewardActorConfig(cfg.seed, cfg.device, str(r.model), r.model_batch_size, r.model_max_length)


def tiny_reward_model(folder: Path, seed: int) -> Path:
    """Write the ``tiny-llama`` reward model (the tiny models' shape, :func:`tiny_llama_config`, with one label)
    and its tokenizer to ``folder``.

    Returns:
        ``folder``, loadable by :class:`marti.rewards.ModelRewardScorer`.
    """
    import torch
    from transformers import LlamaForSequenceClassification

    tok = load_tokenizer(TINY_ALIAS)
    config = tiny_llama_config(tok, num_labels=1)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForSequenceClassification(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


class RewardModelWorker:
    """Ray actor holding the job's reward model.

    Args:
        config: :class:`RewardActorConfig` (built on the driver by :func:`reward_actor_config`).
        num_threads: torch intra-op threads.

    Raises:
        NotFoundError / InvalidArgumentError: Not a folder with a sequence-classification model of one label
            (see :class:`marti.rewards.ModelRewardScorer`; the path and ``num_labels`` are named).
    """

    def __init__(self, config: RewardActorConfig, num_threads: int | None = None) -> None:
        from marti.rewards.model import ModelRewardScorer

        self.cfg, self.device = actor_setup(config, num_threads)
        path = config.path
        if path.strip().lower() == TINY_ALIAS:
            self._tmp = tempfile.TemporaryDirectory(prefix="marti-tiny-rm-")
            path = str(tiny_reward_model(Path(self._tmp.name), config.seed))
        self.scorer = ModelRewardScorer(
            path, batch_size=config.batch_size, max_length=config.max_length, device=self.device
        )

    def ping(self) -> dict[str, Any]:
        """Liveness and placement info: ``pid``, ``device``, ``torch_threads`` (torch's intra-op threads) and
        ``model``."""
        return {
            "pid": os.getpid(),
            "device": self.device,
            "torch_threads": torch.get_num_threads(),
            "model": self.cfg.path,
        }

    def score(self, prompts: list[str], completions: list[str], columns: dict[str, list[Any]]) -> list[float]:
        """One score per completion (see :meth:`marti.rewards.ModelRewardScorer.score`)."""
        return self.scorer.score(prompts, completions, columns)
