"""What every reward kind is, and the one check of what a reward kind returns.

A reward kind (a user function, a remote reward server, a reward model, a built-in verifier wrapped as one) is a
:class:`RewardScorer`: ``score(prompts, completions, columns) -> list[float]``, one float per completion.
``columns`` holds each dataset column, one value per completion (``columns["label"][i]`` belongs to
``completions[i]``), so a scorer sees the row each completion answers.

Every kind's output goes through :func:`check_scores` before anyone uses it: a wrong type, a wrong length, or
a value that is not a finite real number (NaN, inf, ``None``, ``bool``, text) raises
:class:`~marti.errors.InvalidArgumentError` naming the scorer (its function path, URL or model path), the index
and the value. Nothing is ever scored 0 in place of a bad value.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from marti.errors import InvalidArgumentError
from marti.plumbing.arguments import checked

__all__ = [
    "MAX_ABS_REWARD",
    "RewardScorer",
    "WeightedSum",
    "check_batch",
    "check_reward",
    "check_scores",
    "is_finite_real",
    "shorten",
]

MAX_ABS_REWARD = 1e20
"""Largest reward magnitude accepted (:func:`check_reward`). Advantages and returns are float32 (largest
3.4e38) and come from means, differences and variances of a batch's rewards: rewards around 1e200 gave all-zero
advantages (the float64 variance overflows) and around 1e308 infinite ones, with no warning; at 1e30, four equal
rewards got reinforce++ advantages of -0.96 instead of 0 (float32 rounding). Up to 1e25 every estimator's
advantages are those of the same rewards scaled down (measured); 1e20 keeps a margin, and is far beyond any
meaningful reward."""


def check_reward(value: float, where: str) -> None:
    """Refuse a reward that is not a finite number of magnitude at most :data:`MAX_ABS_REWARD`: such a reward is
    a bug in the reward (an env's, a reward function's, an external client's), never something to train on.

    Args:
        value: The reward.
        where: What the message names it as (``rewards[3]``, an agent's episode).

    Raises:
        InvalidArgumentError: ``value`` is NaN, +-inf or beyond +-``MAX_ABS_REWARD`` (named with ``where``).
    """
    if not math.isfinite(value):
        raise InvalidArgumentError(f"{where}: the reward is {value!r}; a reward must be a finite number")
    if abs(value) > MAX_ABS_REWARD:
        raise InvalidArgumentError(
            f"{where}: the reward is {value!r}, beyond +-{MAX_ABS_REWARD:g}: its advantages would overflow "
            "float32 (all zero or infinite); scale the reward down"
        )


@runtime_checkable
class RewardScorer(Protocol):
    """A reward kind: scores completions, one float each.

    Attributes:
        name: How errors name this scorer, its kind and identity: ``"reward function 'my.py:fn'"``,
            ``"remote reward server 'http://host:5000/get_reward'"``, ``"reward model '/models/rm'"``.
    """

    name: str

    def score(
        self, prompts: Sequence[str], completions: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> list[float]:
        """Score each completion.

        Args:
            prompts: The prompt each completion answers (length B).
            completions: The completions (length B).
            columns: Each dataset column, one value per completion (each length B).

        Returns:
            B finite floats, in the order of ``completions``.

        Raises:
            InvalidArgumentError: The inputs disagree in length, or the scorer's output is malformed (named).
            MartiError: Each kind documents its own (a server that times out, a function that raises).
        """
        ...


def shorten(text: Any, limit: int = 80) -> str:
    """``repr(text)`` cut to ``limit`` characters (``...`` marks the cut), for error messages."""
    out = repr(text)
    return out if len(out) <= limit else out[: limit - 3] + "..."


def check_batch(
    prompts: Sequence[str], completions: Sequence[str], columns: Mapping[str, Sequence[Any]], *, scorer: str
) -> int:
    """Check that prompts, completions and every column have one entry per completion.

    Args:
        prompts: Length B.
        completions: Length B.
        columns: Column name -> B values.
        scorer: The scorer's name, for the message.

    Returns:
        B, the number of completions.

    Raises:
        InvalidArgumentError: A length differs from ``len(completions)``, naming the scorer and the column.
    """
    n = len(completions)
    lengths = {"prompts": len(prompts), **{f"column {k!r}": len(v) for k, v in columns.items()}}
    for what, got in lengths.items():
        if got != n:
            raise InvalidArgumentError(
                f"{scorer}: {what} has {got} values for {n} completions (one per completion)"
            )
    return n


def check_scores(scores: Any, expected: int, *, scorer: str) -> list[float]:
    """The one check of a scorer's output, shared by every reward kind.

    Args:
        scores: What the scorer returned: a list or tuple of numbers, or a 1-D numpy array / torch tensor.
        expected: How many completions were scored (B).
        scorer: The scorer's name (:attr:`RewardScorer.name`), for the message.

    Returns:
        ``expected`` Python floats.

    Raises:
        InvalidArgumentError: ``scores`` is not a list of numbers, has a length other than ``expected`` (both
            named), or holds a value that is not a finite real number (NaN, inf, ``None``, ``bool``, text) or is
            beyond +-:data:`MAX_ABS_REWARD` (:func:`check_reward`), naming its index and value.
    """
    values = (
        scores.tolist() if hasattr(scores, "tolist") and not isinstance(scores, (list, tuple)) else scores
    )
    if not isinstance(values, (list, tuple)):
        raise InvalidArgumentError(
            f"{scorer} returned a value of type {type(scores).__name__} ({shorten(scores)}); "
            f"expected a list of {expected} floats, one per completion"
        )
    if len(values) != expected:
        raise InvalidArgumentError(
            f"{scorer} returned {len(values)} scores for {expected} completions "
            f"(expected {expected}, got {len(values)})"
        )
    for i, value in enumerate(values):
        if not is_finite_real(value):
            raise InvalidArgumentError(
                f"{scorer} returned {shorten(value)} ({type(value).__name__}) at index {i}: "
                "every score must be a finite real number (not NaN, inf, None, a bool or text)"
            )
        check_reward(float(value), f"{scorer} returned it at index {i}")
    return [float(v) for v in values]


def is_finite_real(value: Any) -> bool:
    """True for a real number (not a bool) that is finite as a float (an int too large for one is not); numpy
    scalars such as ``np.float32(0.5)`` are real numbers (``numbers.Real``), a 0-d torch tensor is not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class WeightedSum:
    """Several reward kinds as one: each completion's reward is ``sum(w_k * score_k)`` (TRL's ``reward_weights``).

    Args:
        scorers: The reward kinds (at least one), each a :class:`RewardScorer`.
        weights: One finite float per scorer; ``None`` = every weight 1.0.

    Raises:
        InvalidArgumentError: No scorers, an object without ``score``, or weights of another length.
    """

    @checked(own=("scorers",))
    def __init__(self, scorers: Sequence[RewardScorer], weights: Sequence[float] | None = None) -> None:
        self.scorers = list(scorers)
        if not self.scorers or not all(isinstance(s, RewardScorer) for s in self.scorers):
            raise InvalidArgumentError(
                f"WeightedSum: scorers must be a non-empty list of reward scorers (with name and score), "
                f"got {shorten(scorers)}"
            )
        self.weights = [1.0] * len(self.scorers) if weights is None else [float(w) for w in weights]
        if len(self.weights) != len(self.scorers):
            raise InvalidArgumentError(
                f"WeightedSum: {len(self.weights)} weights for {len(self.scorers)} scorers (one weight each)"
            )
        terms = " + ".join(f"{w:g} * {s.name}" for w, s in zip(self.weights, self.scorers, strict=True))
        self.name = f"weighted sum ({terms})"

    @checked
    def score(
        self, prompts: Sequence[str], completions: Sequence[str], columns: Mapping[str, Sequence[Any]]
    ) -> list[float]:
        """The weighted sum of every scorer's checked scores (see :meth:`RewardScorer.score`)."""
        n = check_batch(prompts, completions, columns, scorer=self.name)
        total = [0.0] * n
        for weight, scorer in zip(self.weights, self.scorers, strict=True):
            scores = check_scores(scorer.score(prompts, completions, columns), n, scorer=scorer.name)
            total = [t + weight * s for t, s in zip(total, scores, strict=True)]
        return total
