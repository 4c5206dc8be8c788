"""Every limit of the broker core, in one frozen dataclass (settings.py builds it from flags/env)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from marti.errors import InvalidArgumentError


@dataclass(frozen=True, slots=True)
class BrokerLimits:
    """Limits and timings of the broker core. Every value is checked at the edge in the unit tests.

    Attributes:
        max_sessions: Live sessions at once; creating one more raises RESOURCE_EXHAUSTED.
        session_idle_s: A session untouched for this long (seconds) is expired with all its data.
        max_agents_per_session: Mailboxes per session.
        max_mailbox_messages: Messages (pending + unacked) one mailbox may hold.
        max_mailbox_bytes: Bytes (``Envelope.size_bytes``) one mailbox may hold.
        max_payload_bytes: Largest payload of one envelope.
        max_batch_messages: Envelopes in one Send frame, and most messages in one delivered frame.
        max_frame_bytes: Largest uncompressed frame (the zstd decompression limit).
        max_agent_id_chars: Longest agent id, session name, topic or message id (characters).
        max_receivers: Receivers listed in one envelope.
        max_topics_per_agent: Topics one agent may subscribe to.
        ack_timeout_s: A delivery not acked within this many seconds is delivered again.
        max_delivery_attempts: After this many deliveries without an ack the message is dead-lettered.
        max_unacked_per_agent: Deliveries one agent may hold unacked; further deliveries wait for acks.
        dedup_window_s: A message_id seen within this many seconds is dropped as a duplicate.
        max_dedup_entries: Remembered message ids per session (oldest forgotten first).
        max_dead_letters: Dead letters kept per session (oldest dropped first).
        max_state_bytes: Largest value on the state board.
        default_ttl_s: TTL for messages that declare none (0: no expiry).
        max_wait_s: Longest a Receive long poll or a waiting Send may block (seconds).
    """

    max_sessions: int = 10_000
    session_idle_s: float = 3600.0
    max_agents_per_session: int = 1024
    max_mailbox_messages: int = 100_000
    max_mailbox_bytes: int = 256 * 1024 * 1024
    max_payload_bytes: int = 4 * 1024 * 1024
    max_batch_messages: int = 4096
    max_frame_bytes: int = 32 * 1024 * 1024
    max_agent_id_chars: int = 256
    max_receivers: int = 1024
    max_topics_per_agent: int = 64
    ack_timeout_s: float = 30.0
    max_delivery_attempts: int = 5
    max_unacked_per_agent: int = 10_000
    dedup_window_s: float = 600.0
    max_dedup_entries: int = 1_000_000
    max_dead_letters: int = 10_000
    max_state_bytes: int = 1024 * 1024
    default_ttl_s: float = 0.0
    max_wait_s: float = 60.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            allow_zero = f.name == "default_ttl_s"
            if value < 0 or (value == 0 and not allow_zero):
                raise InvalidArgumentError(f"broker limit {f.name}={value} must be positive")


def check_name(limits: BrokerLimits, kind: str, value: str) -> None:
    """Checks an id (agent id, session name, topic, message id) against the broker's naming rules.

    Args:
        limits: The limits (``max_agent_id_chars``).
        kind: What the value names, for the error message (e.g. ``"agent id"``).
        value: The id.

    Raises:
        InvalidArgumentError: Empty, longer than ``max_agent_id_chars`` characters, or containing NUL.
    """
    if not value:
        raise InvalidArgumentError(f"{kind} must be a non-empty string")
    if len(value) > limits.max_agent_id_chars:
        raise InvalidArgumentError(
            f"{kind} {value[:32]!r}... has {len(value)} characters, over max_agent_id_chars="
            f"{limits.max_agent_id_chars}"
        )
    if "\x00" in value:
        raise InvalidArgumentError(f"{kind} {value!r} contains a NUL character")
