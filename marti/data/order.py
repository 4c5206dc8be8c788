"""The order problems are played in: a pure function of the global problem index, so a resumed job continues at
the right row.

Problem ``k`` of a job (0-based, counted over the whole run) on a set of ``n`` rows is in epoch ``k // n`` at
position ``k % n``; its row is ``permutation(seed, epoch)[k % n]``. Each epoch is a fresh seeded permutation
(every row exactly once per epoch, a different order each epoch, the same for the same seed); without shuffling
row ``k % n``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from marti.errors import InvalidArgumentError


@lru_cache(maxsize=8)
def permutation(n: int, seed: int, epoch: int) -> tuple[int, ...]:
    """The order of the ``n`` rows in epoch ``epoch`` under ``seed`` (numpy's PCG64 seeded with
    ``[seed, epoch]``; stable across runs and machines).

    Args:
        n: Rows in the set (>= 1).
        seed: The dataset seed (any int; negative seeds are taken modulo 2**64).
        epoch: The epoch (>= 0).

    Returns:
        A permutation of ``range(n)``.

    Raises:
        InvalidArgumentError: ``n < 1`` or ``epoch < 0``.
    """
    if n < 1 or epoch < 0:
        raise InvalidArgumentError(f"permutation needs n >= 1 and epoch >= 0, got n={n}, epoch={epoch}")
    rng = np.random.default_rng([seed % 2**64, epoch])
    return tuple(int(i) for i in rng.permutation(n))


def row_of(k: int, n: int, *, seed: int, shuffle: bool = True) -> int:
    """The row played as global problem ``k`` of a set of ``n`` rows.

    Args:
        k: Global problem index (>= 0), counted from the job's first step, across epochs and resumes.
        n: Rows in the training set (>= 1).
        seed: The dataset seed.
        shuffle: False: rows in file order every epoch (``k % n``).

    Returns:
        The 0-based row index.

    Raises:
        InvalidArgumentError: ``k < 0`` or ``n < 1`` (names both).
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0 or n < 1:
        raise InvalidArgumentError(
            f"row_of needs a problem index k >= 0 and n >= 1 rows, got k={k!r}, n={n!r}"
        )
    epoch, position = divmod(k, n)
    return permutation(n, seed, epoch)[position] if shuffle else position
