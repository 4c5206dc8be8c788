"""Rate limiters: when a table lets an insert or a sample proceed (Reverb's RateLimiter semantics).

State: ``inserts`` and ``samples`` count every insert and every returned sample since the table was created
(they survive restarts), ``withdrawn`` the items deleted by episode id (a Delete: they are owed no samples any
more); ``size`` is the number of items in the table. With ``diff = (inserts - withdrawn) * spi - samples``
(spi = samples per insert):

- a sample may proceed iff ``size >= min_size_to_sample`` and ``diff - 1 >= min_diff``;
- an insert may proceed iff ``size + 1 <= min_size_to_sample`` (still filling up) or
  ``diff + spi <= max_diff``.

Otherwise the caller waits, up to its deadline. Presets: :func:`min_size`, :func:`sample_to_insert_ratio`,
:func:`queue`, :func:`stack`.
"""

from __future__ import annotations

from dataclasses import dataclass

from marti.types.experience import (  # noqa: F401 - the presets are part of this module's API
    RateLimiterConfig,
    min_size,
    queue,
    sample_to_insert_ratio,
    stack,
)


@dataclass(slots=True)
class RateLimiterState:
    """Counters a rate limiter decides on (persisted with the table).

    Attributes:
        inserts: Items inserted since the table was created.
        samples: Samples returned since the table was created.
        deletes: Items removed (evicted or sampled out) since the table was created.
        withdrawn: Items deleted by episode id (``Table.delete``): their inserts no longer count in the diff, so
            a queue whose items were deleted unsampled admits as many inserts as before.
    """

    inserts: int = 0
    samples: int = 0
    deletes: int = 0
    withdrawn: int = 0


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
        """Return ``(inserts - withdrawn) * samples_per_insert - samples``."""
        s = self.state
        return (s.inserts - s.withdrawn) * self.config.samples_per_insert - s.samples

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
            "withdrawn": float(s.withdrawn),
            "diff": self.diff(),
        }
