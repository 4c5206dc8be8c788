"""Rewards for tasks from data: built-in verifiers, user reward functions, remote reward servers, reward models.

Every reward kind is a :class:`~marti.rewards.base.RewardScorer` (``score(prompts, completions, columns) ->
list[float]``) whose output goes through one check (:func:`~marti.rewards.base.check_scores`). The remote client
(``RemoteRewardScorer``, needs ``httpx``) and the reward model (``ModelRewardScorer``, needs ``torch`` and
``transformers``) are imported on first use, so importing this package needs neither.
"""

from __future__ import annotations

from typing import Any

from marti.rewards.base import RewardScorer, WeightedSum, check_batch, check_scores
from marti.rewards.functions import RewardFunction, reward_functions
from marti.rewards.verifiers import VERIFIERS, BoundVerifier, extract_answer, make_verifier

#: Names imported from their module on first access (heavy optional dependencies).
_LAZY = {"RemoteRewardScorer": "marti.rewards.remote", "ModelRewardScorer": "marti.rewards.model"}

__all__ = [
    "VERIFIERS",
    "BoundVerifier",
    "ModelRewardScorer",
    "RemoteRewardScorer",
    "RewardFunction",
    "RewardScorer",
    "WeightedSum",
    "check_batch",
    "check_scores",
    "extract_answer",
    "make_verifier",
    "reward_functions",
]


def __getattr__(name: str) -> Any:
    """Import ``RemoteRewardScorer`` / ``ModelRewardScorer`` from their modules when first asked for."""
    if name in _LAZY:
        from marti.plumbing.loader import (
            load_attr,  # the one loader of import paths (tests/unit/test_loader.py)
        )

        return load_attr(f"{_LAZY[name]}:{name}")
    raise AttributeError(f"module 'marti.rewards' has no attribute {name!r}")
