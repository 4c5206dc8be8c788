"""Runtime settings of the experience store (env prefix ``MARTI_STORE_``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from marti.rpc.settings import ServerSettings

from .core.storage import PAGE_SIZES, SYNCHRONOUS_MODES

#: The settings that take one of a few values, and those values.
_CHOICES = {"sqlite_synchronous": SYNCHRONOUS_MODES, "sqlite_page_size": PAGE_SIZES}
#: Longest wait the protocol carries (``timeout_ms`` is a uint32), ms.
MAX_PROTOCOL_WAIT_MS = 2**32 - 1


class StoreSettings(ServerSettings):
    """Server settings plus the store's own limits. Every limit is explicit and configurable."""

    model_config = SettingsConfigDict(env_prefix="MARTI_STORE_", extra="ignore")

    port: int = Field(50053, ge=0, le=65535, description="TCP port; 0 asks the OS for a free one.")
    data_dir: str | None = Field(None, description="Folder of the SQLite WAL database; None = in memory.")
    config: str | None = Field(None, description="Tables YAML file (see docs/experience_store.md).")
    default_table: str | None = Field("default", description="Uniform table created if missing; '' = none.")
    sqlite_synchronous: str = Field(
        "NORMAL", description="NORMAL survives kill -9; FULL survives power loss."
    )
    sqlite_page_size: int = Field(
        16384, description="Page size, bytes, of a new database: 4096, 8192, 16384, 32768 or 65536."
    )
    group_commit_max_bytes: int = Field(
        64 * 1024 * 1024,
        ge=1,
        description="Most payload bytes (+128 per row) committed in one SQLite transaction of grouped calls.",
    )
    wal_checkpoint_mib: float = Field(
        32.0,
        gt=0,
        description="MiB committed (payload + 128 per row) between background copies of the WAL into the database.",
    )
    snapshot_interval_s: float = Field(
        0.0, ge=0, le=365 * 86400, description="Periodic snapshot interval, s (at most a year); 0 = off."
    )
    keep_snapshots: int = Field(2, ge=1, description="Snapshot files kept.")
    executor_threads: int = Field(
        16,
        ge=1,
        le=1024,
        description="Threads running the table calls that do not wait (commits, reads, deletes, priorities).",
    )
    wait_threads: int = Field(
        1024,
        ge=1,
        le=65536,
        description="Threads running Insert and Sample calls, which may wait for room or items (a waiting call "
        "holds one; more calls queue for a free one).",
    )
    default_timeout_ms: int = Field(
        30_000,
        ge=0,
        le=MAX_PROTOCOL_WAIT_MS,
        description="Wait used when a request gives timeout_ms=0, ms (at most 2**32 - 1, as a request's).",
    )
    max_item_bytes: int = Field(64 * 1024 * 1024, gt=0, description="Largest uncompressed trajectory, bytes.")
    chunk_bytes: int = Field(256 * 1024, gt=0, description="Uncompressed bytes per compressed chunk.")
    max_batch_items: int = Field(256, ge=1, description="Most items per Sample/GetAll response message.")
    max_query_items: int = Field(1_000_000, ge=1, description="Most items one GetAllExperiences may return.")
    max_sample_items: int = Field(
        65_536,
        ge=1,
        description="Most items one Sample stream may ask for (its num_samples, the SDK's batch_size); more is "
        "refused with OUT_OF_RANGE before anything is taken.",
    )
    max_wait_ms: int = Field(
        86_400_000,
        ge=1,
        le=MAX_PROTOCOL_WAIT_MS,
        description="Longest wait (timeout_ms, the SDK's timeout_s) an Insert or Sample may ask for, ms (at most "
        "2**32 - 1, what the protocol carries); a longer one is refused with OUT_OF_RANGE.",
    )
    taken_ids_window: int = Field(
        100_000,
        ge=0,
        description="Per table, taken ids (an agent's trajectory of an episode sampled out, stale or dropped; a "
        "deleted episode id) that an idempotent insert still answers as duplicates; the oldest are forgotten first, "
        "and a restart forgets them all.",
    )

    @field_validator(*_CHOICES)
    @classmethod
    def _one_of_its_choices(cls, value: Any, info: ValidationInfo) -> Any:
        """``sqlite_synchronous`` and ``sqlite_page_size`` are each one of :data:`_CHOICES` (checked with or without
        a ``data_dir``: without one, a bad value was accepted without a word)."""
        choices = _CHOICES[info.field_name]
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(map(str, choices))}")
        return value
