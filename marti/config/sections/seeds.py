"""The problem-seed schedule of a training job: which seeds each step plays, held-out seeds, epochs.

A job plays ``problems_per_step`` problems per step, each ``group_size`` times. Problem ``k`` overall
(``k = step * problems_per_step + j``) has seed ``train_seed_start + k``; with a finite problem set
(``rollout.num_train_seeds``) the seeds wrap around, and one pass over the set is an epoch (``max_epochs``
bounds the number of passes, see :func:`steps_for_epochs`).
"""

from __future__ import annotations

from collections.abc import Iterable

from marti.errors import InvalidArgumentError

__all__ = ["DEFAULT_EVAL_SEED_START", "default_eval_seeds", "epochs_done", "steps_for_epochs", "train_seeds"]

DEFAULT_EVAL_SEED_START = 1_000_000
"""First held-out problem seed when ``rollout.eval_seeds`` is not given."""


def default_eval_seeds(count: int) -> list[int]:
    """The default held-out seeds: ``DEFAULT_EVAL_SEED_START, +1, ...``, ``count`` of them."""
    return [DEFAULT_EVAL_SEED_START + i for i in range(count)]


def train_seeds(
    step: int,
    *,
    problems_per_step: int,
    group_size: int,
    train_seed_start: int,
    num_train_seeds: int | None,
    held_out: Iterable[int],
) -> list[int]:
    """Problem seeds of the episodes of training step ``step`` (0-based), each repeated ``group_size`` times.

    Problem ``k`` overall (``k = step * problems_per_step + j``) has seed ``train_seed_start + k``, wrapped
    modulo ``num_train_seeds`` when the problem set is finite; held-out seeds are skipped when the set is
    unbounded, so training never sees an evaluation problem.

    Args:
        step: Training step index, >= 0.
        problems_per_step: Distinct problems per step, >= 1.
        group_size: Episodes per problem, >= 1.
        train_seed_start: First training seed.
        num_train_seeds: Size of the finite problem set, or None for an unbounded one.
        held_out: The evaluation seeds (skipped by an unbounded set).

    Returns:
        ``problems_per_step * group_size`` seeds; consecutive runs of ``group_size`` equal seeds form one group.

    Raises:
        InvalidArgumentError: ``step`` is negative.
    """
    if step < 0:
        raise InvalidArgumentError(f"step must be >= 0, got {step}")
    held = set(held_out)
    seeds: list[int] = []
    for j in range(problems_per_step):
        k = step * problems_per_step + j
        if num_train_seeds is not None:
            seed = train_seed_start + k % num_train_seeds
        else:
            seed = train_seed_start + k
            # Skip held-out seeds: shift by the number of held-out seeds at or below the candidate.
            shift = 0
            while True:
                below = sum(1 for s in held if train_seed_start <= s <= seed + shift)
                if below == shift:
                    break
                shift = below
            seed += shift
        seeds.extend([seed] * group_size)
    return seeds


def steps_for_epochs(max_epochs: int, problems_per_step: int, num_train_seeds: int | None) -> int | None:
    """Steps that make ``max_epochs`` passes over a finite problem set (``max_epochs``), or None if unbounded.

    One epoch is ``num_train_seeds`` problems; a step plays ``problems_per_step``, so ``max_epochs`` passes take
    ``ceil(max_epochs * num_train_seeds / problems_per_step)`` steps (the last step may start the next pass).

    Args:
        max_epochs: Passes over the problem set, >= 1.
        problems_per_step: Problems per step, >= 1.
        num_train_seeds: Size of the problem set, or None (no epochs: a fresh seed every problem).

    Returns:
        The step count, >= 1, or None when the problem set is unbounded.

    Raises:
        InvalidArgumentError: ``max_epochs``, ``problems_per_step`` or ``num_train_seeds`` is < 1.
    """
    if max_epochs < 1 or problems_per_step < 1 or (num_train_seeds is not None and num_train_seeds < 1):
        raise InvalidArgumentError(
            f"max_epochs ({max_epochs}), problems_per_step ({problems_per_step}) and num_train_seeds "
            f"({num_train_seeds}) must be >= 1"
        )
    if num_train_seeds is None:
        return None
    return -(-(max_epochs * num_train_seeds) // problems_per_step)


def epochs_done(steps: int, problems_per_step: int, num_train_seeds: int | None) -> float | None:
    """Passes over the problem set after ``steps`` steps: ``steps * problems_per_step / num_train_seeds``.

    Returns:
        The (fractional) epoch count, or None when the problem set is unbounded.
    """
    if num_train_seeds is None:
        return None
    return steps * problems_per_step / num_train_seeds
