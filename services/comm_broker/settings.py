"""Runtime settings of the comm_broker service (pydantic-settings, env prefix ``MARTI_BROKER_``)."""

from __future__ import annotations

from dataclasses import fields

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from marti.rpc.settings import ServerSettings

from .core.limits import BrokerLimits

_D = BrokerLimits()

#: Names of the settings that are broker limits (one per ``BrokerLimits`` field).
LIMIT_NAMES = tuple(f.name for f in fields(BrokerLimits))


class BrokerSettings(ServerSettings):
    """Settings of the broker: server settings, storage, compression, and every core limit.

    Values come from keyword arguments (the command line), then ``MARTI_BROKER_*`` environment variables,
    then these defaults. The limit fields mirror :class:`~services.comm_broker.core.limits.BrokerLimits`.
    """

    model_config = SettingsConfigDict(env_prefix="MARTI_BROKER_", extra="ignore")

    port: int = Field(50051, ge=0, le=65535, description="TCP port; 0 asks the OS for a free one.")
    data_dir: str | None = Field(None, description="Folder of the SQLite write-ahead log; None = in memory.")
    fsync: bool = Field(False, description="fsync every commit (survives power loss, slower).")
    auto_create_sessions: bool = Field(True, description="Create unknown sessions on first use.")
    compression_level: int = Field(3, ge=1, le=22, description="zstd level of delivered frames.")
    default_batch_messages: int = Field(256, gt=0, description="Messages per delivered frame by default.")
    gc_gen0_threshold: int = Field(
        50_000,
        ge=0,
        description="Net allocations between young-generation garbage collections (CPython default 700; "
        "0 keeps the default). Raised because the broker's data is acyclic.",
    )
    tick_interval_s: float = Field(
        0.5, gt=0, description="Period of redelivery and session-expiry checks, s."
    )

    max_sessions: int = Field(_D.max_sessions, gt=0, description="Live sessions at once.")
    session_idle_s: float = Field(
        _D.session_idle_s, gt=0, description="Idle time before a session expires, s."
    )
    max_agents_per_session: int = Field(_D.max_agents_per_session, gt=0, description="Agents per session.")
    max_mailbox_messages: int = Field(_D.max_mailbox_messages, gt=0, description="Messages per mailbox.")
    max_mailbox_bytes: int = Field(_D.max_mailbox_bytes, gt=0, description="Bytes per mailbox.")
    max_payload_bytes: int = Field(_D.max_payload_bytes, gt=0, description="Bytes per payload.")
    max_batch_messages: int = Field(_D.max_batch_messages, gt=0, description="Envelopes per frame.")
    max_frame_bytes: int = Field(_D.max_frame_bytes, gt=0, description="Uncompressed bytes per frame.")
    max_agent_id_chars: int = Field(_D.max_agent_id_chars, gt=0, description="Characters per id or name.")
    max_receivers: int = Field(_D.max_receivers, gt=0, description="Receivers per envelope.")
    max_topics_per_agent: int = Field(_D.max_topics_per_agent, gt=0, description="Topics per agent.")
    ack_timeout_s: float = Field(_D.ack_timeout_s, gt=0, description="Unacked deliveries come back after, s.")
    max_delivery_attempts: int = Field(_D.max_delivery_attempts, gt=0, description="Deliveries before DLQ.")
    max_unacked_per_agent: int = Field(_D.max_unacked_per_agent, gt=0, description="Unacked per agent.")
    dedup_window_s: float = Field(_D.dedup_window_s, gt=0, description="Dedup window by message_id, s.")
    max_dedup_entries: int = Field(_D.max_dedup_entries, gt=0, description="Remembered ids per session.")
    max_dead_letters: int = Field(_D.max_dead_letters, gt=0, description="Dead letters kept per session.")
    max_state_bytes: int = Field(_D.max_state_bytes, gt=0, description="Bytes per state-board value.")
    default_ttl_s: float = Field(_D.default_ttl_s, ge=0, description="TTL of messages without one; 0 = none.")
    max_wait_s: float = Field(_D.max_wait_s, gt=0, description="Longest long poll or waiting send, s.")

    def limits(self) -> BrokerLimits:
        """Returns the core limits these settings describe."""
        return BrokerLimits(**{name: getattr(self, name) for name in LIMIT_NAMES})
