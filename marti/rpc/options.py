"""Channel and server options that client and server agree on (message sizes, keepalive)."""

from __future__ import annotations

from marti.rpc.settings import DEFAULT_MAX_MESSAGE_BYTES

#: Keepalive ping interval both sides use, in milliseconds.
KEEPALIVE_TIME_MS = 30_000
#: How long to wait for a keepalive ack, in milliseconds.
KEEPALIVE_TIMEOUT_MS = 10_000


def common_options(
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    keepalive_time_ms: int = KEEPALIVE_TIME_MS,
    keepalive_timeout_ms: int = KEEPALIVE_TIMEOUT_MS,
) -> list[tuple[str, int]]:
    """Return the grpc channel arguments shared by servers and clients.

    Args:
        max_message_bytes: Largest message sent or received, bytes.
        keepalive_time_ms: Interval between HTTP/2 keepalive pings, ms.
        keepalive_timeout_ms: Time to wait for a ping ack before the connection is considered dead, ms.

    Returns:
        A list of ``(key, value)`` grpc channel arguments.
    """
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", min(keepalive_time_ms, 10_000)),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", min(keepalive_time_ms, 5_000)),
    ]
