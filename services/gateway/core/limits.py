"""Every limit of the inference gateway, in one validated dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from marti.errors import InvalidArgumentError


@dataclass(frozen=True)
class GatewayLimits:
    """Limits and batching settings of one gateway (config section ``gateway``).

    Attributes:
        max_batch: Most prompts of one agent run in one engine call, > 0.
        max_wait_ms: Most milliseconds a request waits for others to fill its batch, >= 0.
        max_queue: Most prompts waiting or running per agent; one more is refused as overloaded (HTTP 429,
            gRPC RESOURCE_EXHAUSTED), > 0.
        max_n: Most completions one request may ask for (``n``), > 0.
        max_open_episodes: Most episodes with recorded calls and no reward yet; a call that would open one more
            is refused as overloaded, > 0.
        max_calls_per_episode: Most calls recorded per episode and agent; one more is refused (HTTP 400,
            INVALID_ARGUMENT), > 0.
        episode_timeout_s: Seconds after its last call or report an open episode is abandoned (dropped with its
            group, never trained), > 0.
        resident_versions: Policy versions per agent kept loaded for ``name@VERSION`` requests (the current one
            included), >= 1.
        max_request_bytes: Largest HTTP request body and gRPC request message, bytes (HTTP 413 / gRPC
            RESOURCE_EXHAUSTED beyond), > 0.
        max_stop: Most stop strings per request, > 0.
        max_stop_chars: Longest stop string, characters, > 0.
        max_id_chars: Longest episode or group id, characters (ids may not contain ``/``), > 0.
        max_group_size: Largest ``group_size`` a reward report may give (HTTP 400, INVALID_ARGUMENT beyond), > 0.
        max_backlog_episodes: Most released episodes waiting to be inserted into training (reports answered
            before their episodes were inserted); a report whose released episodes (one, or the whole group it
            completes) would take the backlog above this is refused before it changes anything (HTTP 429, gRPC
            RESOURCE_EXHAUSTED); only a group larger than this exceeds it, taken while the backlog is empty, > 0.
        report_wait_s: Most seconds a report waits for its released episodes to be inserted; after that it is
            answered as queued (HTTP 202) and they are inserted in the background, >= 0.
        max_tools_chars: Longest ``tools`` of one request, characters of its JSON (HTTP 400 naming ``tools``
            beyond), > 0.
        max_stored_responses: Most Responses API responses kept for ``previous_response_id`` per episode, and
            for untraced calls; the oldest is forgotten first, an episode's are freed when it closes, > 0.
    """

    max_batch: int = 32
    max_wait_ms: float = 5.0
    max_queue: int = 1024
    max_n: int = 16
    max_open_episodes: int = 10_000
    max_calls_per_episode: int = 256
    episode_timeout_s: float = 600.0
    resident_versions: int = 2
    max_request_bytes: int = 8 * 1024 * 1024
    max_stop: int = 16
    max_stop_chars: int = 256
    max_id_chars: int = 256
    max_group_size: int = 1024
    max_backlog_episodes: int = 1024
    report_wait_s: float = 5.0
    max_tools_chars: int = 65_536
    max_stored_responses: int = 256

    def __post_init__(self) -> None:
        """Raises InvalidArgumentError naming the first field out of range."""
        for name in (
            "max_batch",
            "max_queue",
            "max_n",
            "max_open_episodes",
            "max_calls_per_episode",
            "max_request_bytes",
            "max_stop",
            "max_stop_chars",
            "max_id_chars",
            "max_group_size",
            "max_backlog_episodes",
            "max_tools_chars",
            "max_stored_responses",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise InvalidArgumentError(f"gateway.{name} must be an int > 0, got {v!r}")
        if not (isinstance(self.report_wait_s, int | float) and 0 <= self.report_wait_s < float("inf")):
            raise InvalidArgumentError(
                f"gateway.report_wait_s must be a finite number >= 0, got {self.report_wait_s!r}"
            )
        if not self.max_wait_ms >= 0:
            raise InvalidArgumentError(f"gateway.max_wait_ms must be >= 0, got {self.max_wait_ms!r}")
        if not self.episode_timeout_s > 0:
            raise InvalidArgumentError(
                f"external.episode_timeout_s must be > 0, got {self.episode_timeout_s!r}"
            )
        if not isinstance(self.resident_versions, int) or self.resident_versions < 1:
            raise InvalidArgumentError(
                f"gateway.resident_versions must be an int >= 1, got {self.resident_versions!r}"
            )
