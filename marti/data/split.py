"""The held-out split of a problem set given as a seeded fraction: the same rows for the same seed, disjoint
train and held-out parts, both non-empty."""

from __future__ import annotations

import numpy as np

from marti.errors import InvalidArgumentError

_SPLIT_STREAM = 0x5EED5
"""Second word of the split's numpy seed, so the split's draw differs from the epoch orders' (same seed)."""


def split_indices(
    n: int, fraction: float, *, seed: int, source: str = "dataset"
) -> tuple[list[int], list[int]]:
    """Split ``range(n)`` into training and held-out row indices, ``round(n * fraction)`` held out.

    Args:
        n: Rows in the set.
        fraction: Held-out fraction, in (0, 1).
        seed: The dataset seed: the same seed gives the same split.
        source: The source's description, named in errors.

    Returns:
        ``(train, held_out)``: disjoint, sorted (source order), together ``range(n)``.

    Raises:
        InvalidArgumentError: ``fraction`` outside (0, 1), or a part that would be empty (names ``n`` and the
            fraction).
    """
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction < 1:
        raise InvalidArgumentError(f"eval_fraction must be a number in (0, 1), got {fraction!r}")
    held = round(n * fraction)
    if held < 1 or held >= n:
        raise InvalidArgumentError(
            f"{source}: eval_fraction {fraction} of {n} rows holds out {held} rows; both the training and "
            "the held-out part need at least one row (change eval_fraction or give eval_path)"
        )
    order = np.random.default_rng([seed % 2**64, _SPLIT_STREAM]).permutation(n)
    out = {int(i) for i in order[:held]}
    return [i for i in range(n) if i not in out], sorted(out)


def shared_prompts(train: list[str], held_out: list[str]) -> list[tuple[int, int]]:
    """The held-out problems whose prompt is also a training problem's (a file with duplicate rows, split by
    ``eval_fraction`` or repeated in ``eval_path``): held-out accuracy on them measures recall of trained rows.

    Args:
        train: The training prompts, in order.
        held_out: The held-out prompts, in order.

    Returns:
        ``(held-out index, index of the first training problem with that prompt)`` per shared prompt, in
        held-out order.
    """
    first: dict[str, int] = {}
    for i, prompt in enumerate(train):
        first.setdefault(prompt, i)
    return [(j, first[p]) for j, p in enumerate(held_out) if p in first]
