"""The start every trainer actor shares (policy, rollout, reference, critic and reward-model actors): its narrow
config's base (:class:`ActorConfig`), the device it resolves (:func:`resolve_device`) and :func:`actor_setup`
(torch threads, seeds, device)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TypeVar

import torch

from marti.config import TrainConfig
from marti.errors import InvalidArgumentError

__all__ = ["ActorConfig", "actor_setup", "resolve_device"]


def resolve_device(cfg: TrainConfig | ActorConfig) -> str:
    """``cpu`` or ``cuda`` from ``config.device`` (``auto`` picks CUDA when available)."""
    if cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return cfg.device


@dataclass(frozen=True)
class ActorConfig:
    """Base of an actor's narrow config (its part of the training config, built on the driver): what every
    actor starts with.

    Attributes:
        seed: The job's RNG seed (``seed``).
        device: ``device`` (``auto``, ``cpu`` or ``cuda``; ``auto`` is resolved in the actor, see
            :func:`resolve_device`).
    """

    seed: int
    device: str


_Config = TypeVar("_Config", TrainConfig, ActorConfig)


def actor_setup(config: _Config, num_threads: int | None = None) -> tuple[_Config, str]:
    """Common start of a trainer actor: set torch threads, seed the RNGs, pick the device.

    Args:
        config: The training config, validated once on the driver, or an actor's narrow config
            (:class:`ActorConfig`); Ray passes the frozen object by value and the actor does not parse it again.
        num_threads: torch intra-op threads; ``None`` keeps torch's default.

    Returns:
        ``(config, device)`` with device ``cpu`` or ``cuda``.

    Raises:
        InvalidArgumentError: ``config`` is neither a :class:`~marti.config.TrainConfig` nor an
            :class:`ActorConfig` (a raw mapping is loaded with :func:`marti.config.config_from_dict` first).
    """
    if not isinstance(config, TrainConfig | ActorConfig):
        raise InvalidArgumentError(
            f"config must be a validated marti.config.TrainConfig or an ActorConfig, got {type(config).__name__}"
        )
    cfg = config
    if num_threads:
        torch.set_num_threads(num_threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    return cfg, resolve_device(cfg)
