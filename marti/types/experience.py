"""Domain types of the experience store shared by the SDK and the store: table configuration (the YAML schema of
``--config`` and of CreateTable), rate limiter settings and presets, checkpoint and sampling results.

Table configuration: the YAML schema of ``--config`` and of CreateTable, with presets.

A table is composed like Reverb's: sampler, remover, max size (and max bytes), max times sampled, rate limiter
and signature. YAML example (see docs/experience_store.md)::

    tables:
      - name: agent_1
        preset: queue          # queue | stack | uniform | prioritized (optional; fields below override it)
        max_size: 10000
      - name: replay
        sampler: prioritized
        priority_exponent: 0.6
        remover: fifo
        max_size: 100000
        max_bytes: 1073741824
        rate_limiter: {kind: sample_to_insert_ratio, samples_per_insert: 4, min_size_to_sample: 100, error_buffer: 200}
        signature: {require_logprobs: true, roles: [planner]}
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    model_validator,
)

from marti.errors import InvalidArgumentError
from marti.types.trajectory import Trajectory

#: Largest integer a table setting may be: the protocol carries them as int64 (a larger one could not be sent to
#: the store, nor a table holding it described back).
INT64_MAX = 2**63 - 1


def _integer(value: Any) -> int:
    """An integer setting as an ``int`` (numpy integers count). Raises ValueError for anything else: pydantic on
    its own read ``"10"`` as 10, ``True`` as 1 and ``10.0`` as 10."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"must be an integer, not {type(value).__name__}")
    return int(value)


def _number(value: Any) -> float:
    """A real-valued setting as a ``float`` (integers and numpy numbers count). Raises ValueError for a string or
    a bool (pydantic on its own read ``"0.5"`` as 0.5 and ``True`` as 1.0)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"must be a number, not {type(value).__name__}")
    return float(value)


#: Table config field types that take what they say and nothing pydantic would convert into it.
Integer = Annotated[int, BeforeValidator(_integer)]
Number = Annotated[float, BeforeValidator(_number)]


#: Range of ``samples_per_insert``: the limiter's diff (a float64) must change by exactly ``spi`` per insert and 1
#: per sample for counts up to about 1e9 items.
MIN_SAMPLES_PER_INSERT = 1e-6
MAX_SAMPLES_PER_INSERT = 1e6
#: Largest finite ``min_diff`` / ``max_diff`` magnitude (2**53 / 8: a diff near it still moves by 1 per sample).
MAX_DIFF_MAGNITUDE = 2.0**50


@dataclass(frozen=True, slots=True)
class RateLimiterConfig:
    """Rate limiter settings.

    Attributes:
        samples_per_insert: spi in [:data:`MIN_SAMPLES_PER_INSERT`, :data:`MAX_SAMPLES_PER_INSERT`] (1e-6 to 1e6),
            the target number of samples per inserted item.
        min_size_to_sample: Samples wait until the table holds at least this many items (>= 1).
        min_diff: Lower bound on ``inserts * spi - samples`` after a sample (-inf, or finite at most
            :data:`MAX_DIFF_MAGNITUDE` = 2**50 in magnitude).
        max_diff: Upper bound on ``inserts * spi - samples`` after an insert (+inf, or finite as ``min_diff``).
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
        if not MIN_SAMPLES_PER_INSERT <= spi <= MAX_SAMPLES_PER_INSERT:
            raise InvalidArgumentError(
                f"samples_per_insert {spi} is out of range [{MIN_SAMPLES_PER_INSERT:g}, "
                f"{MAX_SAMPLES_PER_INSERT:g}]: past it one insert or one sample no longer moves the limiter's "
                "float64 diff exactly, and calls could wait forever"
            )
        for name in ("min_diff", "max_diff"):
            value = getattr(self, name)
            if math.isfinite(value) and abs(value) > MAX_DIFF_MAGNITUDE:
                raise InvalidArgumentError(
                    f"{name} {value} is out of range: a finite bound is at most {MAX_DIFF_MAGNITUDE:g} in "
                    "magnitude (a float64 diff past it no longer changes by 1 per sample; a queue's or stack's "
                    "max_diff is its size, the table's max_size by default); use inf for no bound"
                )
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


@dataclass(frozen=True, slots=True)
class SampleFilter:
    """Restricts which items a sample may return. Defaults match everything.

    Attributes:
        agent_ids: Only items of these agents.
        roles: Only items of these roles.
        min_policy_version: Only items with ``policy_version >= min_policy_version``.
        max_age_s: Only items whose trajectory ``created_at`` is at most this many seconds old (0 = any age).
    """

    agent_ids: frozenset[str] = frozenset()
    roles: frozenset[str] = frozenset()
    min_policy_version: int = 0
    max_age_s: float = 0.0

    def is_empty(self) -> bool:
        """True when the filter matches every item."""
        return not (self.agent_ids or self.roles or self.min_policy_version > 0 or self.max_age_s > 0)

    def matches(self, rec: Any, now: float) -> bool:
        """Whether an item passes the filter at Unix time ``now``."""
        return (
            (not self.agent_ids or rec.agent_id in self.agent_ids)
            and (not self.roles or rec.role in self.roles)
            and rec.policy_version >= self.min_policy_version
            and (self.max_age_s <= 0 or now - rec.created_at <= self.max_age_s)
        )


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    """Outcome of a checkpoint.

    Attributes:
        path: Snapshot file written ('' for in-memory storage).
        duration_s: Wall time of the checkpoint in seconds.
        num_bytes: Size of the snapshot file in bytes.
    """

    path: str
    duration_s: float
    num_bytes: int


@dataclass(frozen=True, slots=True)
class SampledTrajectory:
    """A sampled trajectory with its sampling facts.

    Attributes:
        key: Item key (use it to update the priority).
        table: Table it was sampled from.
        priority: Priority at sampling time.
        probability: Probability it was the one selected.
        importance_weight: ``1 / (table_size * probability)`` (Reverb's importance weight).
        times_sampled: Samples of this item including this one.
        table_size: Items the selection was made among.
        trajectory: The trajectory.
    """

    key: int
    table: str
    priority: float
    probability: float
    importance_weight: float
    times_sampled: int
    table_size: int
    trajectory: Trajectory


SelectorKind = Literal["uniform", "prioritized", "fifo", "lifo", "max_heap", "min_heap"]


class RateLimiterSpec(BaseModel):
    """Rate limiter section of a table config.

    Attributes:
        kind: ``min_size`` | ``sample_to_insert_ratio`` | ``queue`` | ``stack`` | ``custom``.
        min_size_to_sample: For min_size, sample_to_insert_ratio and custom.
        samples_per_insert: For sample_to_insert_ratio and custom.
        error_buffer: For sample_to_insert_ratio: allowed deviation, in samples.
        size: For queue and stack: items that may wait to be sampled.
        min_diff, max_diff: For custom (may be -inf / inf).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")
    kind: Literal["min_size", "sample_to_insert_ratio", "queue", "stack", "custom"] = "min_size"
    min_size_to_sample: Integer = Field(default=1, le=INT64_MAX)
    samples_per_insert: Number = 1.0
    error_buffer: Number = 1.0
    size: Integer = Field(default=1000, le=INT64_MAX)
    min_diff: Number = -math.inf
    max_diff: Number = math.inf

    def build(self) -> RateLimiterConfig:
        """Return the validated :class:`RateLimiterConfig` (raises InvalidArgumentError on bad settings)."""
        if self.kind == "min_size":
            cfg = min_size(self.min_size_to_sample)
        elif self.kind == "sample_to_insert_ratio":
            cfg = sample_to_insert_ratio(self.samples_per_insert, self.min_size_to_sample, self.error_buffer)
        elif self.kind == "queue":
            cfg = queue(self.size)
        elif self.kind == "stack":
            cfg = stack(self.size)
        else:
            cfg = RateLimiterConfig(
                self.samples_per_insert, self.min_size_to_sample, self.min_diff, self.max_diff
            )
        cfg.validate()
        return cfg


class SignatureSpec(BaseModel):
    """What every trajectory in a table must look like. Empty lists and None mean "anything".

    Attributes:
        agent_ids: Allowed agent ids.
        roles: Allowed roles.
        min_policy_version: Smallest accepted policy version.
        require_rewards: Every turn must carry a reward.
        require_logprobs: Every turn must carry one logprob per response token.
        max_turns: Most turns per trajectory.
        max_prompt_tokens: Most prompt tokens (T_prompt) per turn.
        max_response_tokens: Most response tokens (A) per turn.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")
    agent_ids: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    min_policy_version: Integer = Field(default=0, ge=-INT64_MAX - 1, le=INT64_MAX)
    require_rewards: StrictBool = False
    require_logprobs: StrictBool = False
    max_turns: Integer | None = Field(default=None, ge=1, le=INT64_MAX)
    max_prompt_tokens: Integer | None = Field(default=None, ge=0, le=INT64_MAX)
    max_response_tokens: Integer | None = Field(default=None, ge=0, le=INT64_MAX)


_PRESETS: dict[str, dict[str, Any]] = {
    "queue": {"sampler": "fifo", "remover": "fifo", "max_times_sampled": 1, "full_policy": "block"},
    "stack": {"sampler": "lifo", "remover": "lifo", "max_times_sampled": 1, "full_policy": "block"},
    "uniform": {"sampler": "uniform", "remover": "fifo"},
    "prioritized": {"sampler": "prioritized", "remover": "fifo"},
}


class TableConfig(BaseModel):
    """One table.

    Attributes:
        name: Table name (non-empty, at most 128 characters).
        preset: Optional preset whose defaults the other fields override: queue (FIFO, each item sampled once,
            inserts wait when ``max_size`` items wait), stack (same with LIFO), uniform, prioritized.
        sampler: Selector that picks sampled items.
        remover: Selector that picks the item to evict when the table is full and ``full_policy`` is evict.
        priority_exponent: alpha of a prioritized sampler or remover.
        importance_beta: beta of the importance weights of a prioritized sampler.
        max_size: Most items (>= 1).
        max_bytes: Most stored (compressed) payload bytes (>= 1); an item alone above it is refused.
        max_times_sampled: An item is removed after this many samples; 0 = never.
        full_policy: ``evict`` (remover makes room) or ``block`` (inserts wait, up to their deadline).
        rate_limiter: See :class:`RateLimiterSpec`.
        signature: See :class:`SignatureSpec`.
        max_policy_lag: Most policy versions an item may lag behind a sampler that states its current version
            (``Table.sample(current_policy_version=v)``): a selected item whose ``policy_version`` is below
            ``v - max_policy_lag`` is removed instead of returned, counted as ``stale_removed`` (an item without turns
            is never stale). None = no bound.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")
    name: str = Field(min_length=1, max_length=128)
    preset: Literal["queue", "stack", "uniform", "prioritized"] | None = None
    sampler: SelectorKind = "uniform"
    remover: SelectorKind = "fifo"
    priority_exponent: Number = Field(default=1.0, ge=0.0, allow_inf_nan=False)
    importance_beta: Number = Field(default=1.0, ge=0.0, le=1.0)
    max_size: Integer = Field(default=1_000_000, ge=1, le=INT64_MAX)
    max_bytes: Integer = Field(default=4 * 1024**3, ge=1, le=INT64_MAX)
    max_times_sampled: Integer = Field(default=0, ge=0, le=INT64_MAX)
    full_policy: Literal["evict", "block"] = "evict"
    rate_limiter: RateLimiterSpec = RateLimiterSpec()
    signature: SignatureSpec = SignatureSpec()
    max_policy_lag: Integer | None = Field(default=None, ge=0, le=INT64_MAX)

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") in _PRESETS:
            preset = data["preset"]
            merged = {**_PRESETS[preset], **data}
            if preset in ("queue", "stack"):
                merged.setdefault("max_size", 1000)
                merged.setdefault("rate_limiter", {"kind": preset, "size": merged["max_size"]})
            return merged
        return data

    @model_validator(mode="after")
    def _check(self) -> TableConfig:
        limiter = self.rate_limiter.build()
        if limiter.min_size_to_sample > self.max_size:
            raise ValueError(
                f"rate limiter could deadlock: min_size_to_sample={limiter.min_size_to_sample} exceeds "
                f"max_size={self.max_size}, so samples could never proceed"
            )
        if self.full_policy == "block" and self.max_times_sampled == 0:
            raise ValueError(
                "table could deadlock: full_policy=block with max_times_sampled=0 never frees room, so inserts "
                "into a full table would wait forever; set max_times_sampled or full_policy=evict"
            )
        return self


def parse_table_config(data: dict[str, Any]) -> TableConfig:
    """Validate one table config mapping.

    Args:
        data: Mapping as read from YAML or built from a CreateTable request.

    Returns:
        The frozen :class:`TableConfig`.

    Raises:
        InvalidArgumentError: naming the bad field and value, or why the rate limiter could deadlock.
    """
    try:
        return TableConfig.model_validate(data)
    except ValidationError as e:
        name = data.get("name", "?") if isinstance(data, dict) else "?"
        raise InvalidArgumentError(f"bad config for table {name!r}: {table_config_errors(e)}") from None


def table_config_errors(exc: ValidationError) -> str:
    """Each problem of a refused :class:`TableConfig`, ``field: why (got value)``, joined by ``"; "``.

    Args:
        exc: The error ``TableConfig.model_validate`` or ``model_validate_json`` raised.
    """
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "table"
        parts.append(f"{loc}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(parts)


def parse_tables_yaml(text: str, source: str = "tables config") -> list[TableConfig]:
    """Parse a tables YAML document (``tables:`` list, see module docstring).

    Args:
        text: The YAML text.
        source: What messages call the document (a file's path: :func:`read_tables_yaml`).

    Raises:
        InvalidArgumentError: one line starting with ``source``, on YAML errors (with line and column), unknown
            top-level keys, a key written twice in one mapping (both lines), duplicate names or bad table configs
            (naming the table and the key).
    """
    import yaml

    from marti.plumbing.yaml_load import load_yaml, yaml_error_line

    try:
        doc = load_yaml(text, source) or {}
    except yaml.YAMLError as e:
        raise InvalidArgumentError(f"{source}: not valid YAML: {yaml_error_line(e)}") from None
    if not isinstance(doc, dict) or set(doc) - {"tables"}:
        extra = sorted(set(doc) - {"tables"}) if isinstance(doc, dict) else doc
        raise InvalidArgumentError(f"{source} must be a mapping with only a 'tables' key, got {extra!r}")
    try:
        tables = [parse_table_config(t) for t in doc.get("tables") or []]
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{source}: {e}") from None
    names = [t.name for t in tables]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise InvalidArgumentError(f"{source}: duplicate table names: {sorted(dup)}")
    return tables


def read_tables_yaml(path: str | os.PathLike[str]) -> list[TableConfig]:
    """Read and parse a tables YAML file (``marti store --config``).

    Raises:
        InvalidArgumentError: one line naming the file: it cannot be read, or any error of
            :func:`parse_tables_yaml`.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InvalidArgumentError(
            f"cannot read tables config file {str(path)!r}: {e.strerror or e}"
        ) from None
    return parse_tables_yaml(text, source=f"tables config {str(path)!r}")
