"""Running mean and standard deviation of a stream of rewards (``algorithm.normalize_reward``).

Combines batch statistics with Chan et al.'s parallel update (Chan, Golub and LeVeque 1979, "Updating formulae
and a pairwise algorithm for computing sample variances"), as OpenRLHF's ``RunningMoments`` does for its
``--normalize_reward``: each batch first updates the moments, then is normalised with them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class RunningMoments:
    """Count, mean and sum of squared deviations of every value seen so far.

    Attributes:
        count: Values seen.
        mean: Their mean (reward units).
        m2: Sum of squared deviations from the mean.
    """

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    @property
    def std(self) -> float:
        """Population standard deviation of the values seen (0 before two values)."""
        return math.sqrt(self.m2 / self.count) if self.count > 1 else 0.0

    def update(self, values: Sequence[float]) -> None:
        """Fold a batch of finite values into the moments (Chan et al.'s parallel combination)."""
        n = len(values)
        if n == 0:
            return
        b_mean = sum(values) / n
        b_m2 = sum((v - b_mean) ** 2 for v in values)
        total = self.count + n
        delta = b_mean - self.mean
        self.mean += delta * n / total
        self.m2 += b_m2 + delta * delta * self.count * n / total
        self.count = total

    def normalize(self, rewards: Sequence[float | None], eps: float = 1e-8) -> list[float | None]:
        """Update with the batch's known rewards, then return ``(r - mean) / (std + eps)`` (None stays None).

        Args:
            rewards: B rewards, None for unscored samples.
            eps: Added to the standard deviation, > 0.
        """
        self.update([r for r in rewards if r is not None])
        scale = self.std + eps
        return [None if r is None else (r - self.mean) / scale for r in rewards]

    def state(self) -> dict[str, float]:
        """The moments as a plain dict (checkpoints)."""
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    @classmethod
    def from_state(cls, state: dict[str, float]) -> RunningMoments:
        """Restore :meth:`state`."""
        return cls(int(state["count"]), float(state["mean"]), float(state["m2"]))
