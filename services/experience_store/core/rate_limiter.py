"""Rate limiters: when a table lets an insert or a sample proceed (Reverb's RateLimiter semantics).

State: ``inserts`` and ``samples`` count every insert and every returned sample since the table was created
(they survive restarts); ``size`` is the number of items in the table. With ``diff = inserts * spi - samples``
(spi = samples per insert):

- a sample may proceed iff ``size >= min_size_to_sample`` and ``diff - 1 >= min_diff``;
- an insert may proceed iff ``size + 1 <= min_size_to_sample`` (still filling up) or
  ``diff + spi <= max_diff``.

Otherwise the caller waits, up to its deadline. Presets: :func:`min_size`, :func:`sample_to_insert_ratio`,
:func:`queue`, :func:`stack`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from marti.errors import InvalidArgumentError


@dataclass(frozen=True, slots=True)
class RateLimiterConfig:
    """Rate limiter settings.

    Attributes:
        samples_per_insert: spi > 0, the target number of samples per inserted item.
        min_size_to_sample: Samples wait until the table holds at least this many items (>= 1).
        min_diff: Lower bound on ``inserts * spi - samples`` after a sample (may be -inf).
        max_diff: Upper bound on ``inserts * spi - samples`` after an insert (may be +inf).
    """

    samples_per_insert: float = 1.0
    min_size_to_sample: int = 1
    min_diff: float = -math.inf
    max_diff: float = math.inf

    def validate(self) -> None:
        """Reject settings that are malformed or could deadlock.

        A deadlock is a state where neither an insert nor a sample may proceed: with reachable diffs spaced by
        ``spi`` (inserts) and 1 (samples), that state exists when the window ``max_diff - min_diff`` is smaller
        than ``spi`` (integer spi) or ``spi + 1`` (fractional spi, a conservative bound).

        Raises:
            InvalidArgumentError: naming the bad value and why it could deadlock.
        """
        spi = self.samples_per_insert
        if not (math.isfinite(spi) and spi > 0):
            raise InvalidArgumentError(f"samples_per_insert must be a finite number > 0, got {spi}")
        if self.min_size_to_sample < 1:
            raise InvalidArgumentError(f"min_size_to_sample must be >= 1, got {self.min_size_to_sample}")
        if math.isnan(self.min_diff) or math.isnan(self.max_diff) or self.min_diff > self.max_diff:
            raise InvalidArgumentError(
                f"min_diff ({self.min_diff}) must be <= max_diff ({self.max_diff}) and neither may be NaN"
            )
        window = self.max_diff - self.min_diff
        needed = spi if float(spi).is_integer() else spi + 1.0
        if window < needed:
            raise InvalidArgumentError(
                f"rate limiter could deadlock: max_diff - min_diff = {window} is smaller than {needed} "
                f"(samples_per_insert={spi}), so a state exists where an insert would exceed max_diff and a "
                "sample would fall below min_diff; widen the error buffer"
            )


@dataclass(slots=True)
class RateLimiterState:
    """Counters a rate limiter decides on (persisted with the table).

    Attributes:
        inserts: Items inserted since the table was created.
        samples: Samples returned since the table was created.
        deletes: Items removed (evicted or sampled out) since the table was created.
    """

    inserts: int = 0
    samples: int = 0
    deletes: int = 0


class RateLimiter:
    """Decides whether inserts and samples may proceed; the owning table waits and retries.

    Args:
        config: Validated on construction.
        state: Counters to start from (a restored table passes its persisted counters).

    Raises:
        InvalidArgumentError: from :meth:`RateLimiterConfig.validate`.
    """

    def __init__(self, config: RateLimiterConfig, state: RateLimiterState | None = None) -> None:
        config.validate()
        self.config = config
        self.state = state or RateLimiterState()

    def diff(self) -> float:
        """Return ``inserts * samples_per_insert - samples``."""
        return self.state.inserts * self.config.samples_per_insert - self.state.samples

    def can_insert(self, size: int) -> bool:
        """Whether one insert may proceed now, with ``size`` items in the table."""
        if size + 1 <= self.config.min_size_to_sample:
            return True
        return self.diff() + self.config.samples_per_insert <= self.config.max_diff

    def can_sample(self, size: int) -> bool:
        """Whether one sample may proceed now, with ``size`` items in the table."""
        if size < self.config.min_size_to_sample:
            return False
        return self.diff() - 1.0 >= self.config.min_diff

    def info(self) -> dict[str, float]:
        """Return settings and counters, for GetTableInfo."""
        c, s = self.config, self.state
        return {
            "samples_per_insert": c.samples_per_insert,
            "min_size_to_sample": float(c.min_size_to_sample),
            "min_diff": c.min_diff,
            "max_diff": c.max_diff,
            "inserts": float(s.inserts),
            "samples": float(s.samples),
            "deletes": float(s.deletes),
            "diff": self.diff(),
        }


def min_size(n: int) -> RateLimiterConfig:
    """Samples wait until the table holds ``n`` items; no other limit."""
    return RateLimiterConfig(1.0, n, -math.inf, math.inf)


def sample_to_insert_ratio(
    samples_per_insert: float, min_size_to_sample: int, error_buffer: float
) -> RateLimiterConfig:
    """Keep samples per insert near ``samples_per_insert``, within ``+- error_buffer`` samples.

    Same construction as Reverb: ``offset = samples_per_insert * min_size_to_sample``,
    ``min_diff = offset - error_buffer``, ``max_diff = offset + error_buffer``.

    Raises:
        InvalidArgumentError: when ``error_buffer`` is negative or NaN.
    """
    if not error_buffer >= 0:
        raise InvalidArgumentError(f"error_buffer must be >= 0, got {error_buffer}")
    offset = samples_per_insert * min_size_to_sample
    return RateLimiterConfig(
        samples_per_insert, min_size_to_sample, offset - error_buffer, offset + error_buffer
    )


def queue(size: int) -> RateLimiterConfig:
    """Queue preset: each item sampled once, inserts wait when ``size`` items wait to be sampled."""
    if size < 1:
        raise InvalidArgumentError(f"queue size must be >= 1, got {size}")
    return RateLimiterConfig(1.0, 1, 0.0, float(size))


def stack(size: int) -> RateLimiterConfig:
    """Stack preset: same limiter as :func:`queue` (the table pairs it with LIFO selection)."""
    return queue(size)
