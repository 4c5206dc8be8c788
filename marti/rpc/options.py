"""Channel and server options: what client and server agree on (message sizes, keepalive), how fast a client
channel redials a server that went away (:func:`reconnect_options`), and how a server binds its port
(:func:`server_options`)."""

from __future__ import annotations

from marti.rpc.settings import DEFAULT_MAX_MESSAGE_BYTES

#: Keepalive ping interval both sides use, in milliseconds.
KEEPALIVE_TIME_MS = 30_000
#: How long to wait for a keepalive ack, in milliseconds.
KEEPALIVE_TIMEOUT_MS = 10_000
#: First wait before a client channel redials a server it lost, in milliseconds (gRPC's default: 1 s).
INITIAL_RECONNECT_BACKOFF_MS = 200
#: Shortest wait between two redials, in milliseconds (gRPC's default: 20 s for the first connection attempt).
MIN_RECONNECT_BACKOFF_MS = 200
#: Longest wait between two redials, in milliseconds (gRPC's default: 120 s). The wait grows from
#: :data:`INITIAL_RECONNECT_BACKOFF_MS` by x1.6 per failed attempt up to this cap, with +-20% jitter, so a client
#: redials a server that is back at most ``MAX_RECONNECT_BACKOFF_MS * 1.2`` (2.4 s) after it returned, however
#: long it was gone.
MAX_RECONNECT_BACKOFF_MS = 2_000


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


def reconnect_options() -> list[tuple[str, int]]:
    """Return the grpc channel arguments that cap a client channel's reconnect backoff.

    Every SDK channel (:func:`marti.rpc.client.channel.make_channel`) carries them, so a client whose server restarted
    finds it again within ``MAX_RECONNECT_BACKOFF_MS * 1.2`` ms (2.4 s) of its return instead of gRPC's default
    backoff, which grows to 120 s during a long outage.

    Returns:
        ``grpc.initial_reconnect_backoff_ms``, ``grpc.min_reconnect_backoff_ms`` and
        ``grpc.max_reconnect_backoff_ms`` as ``(key, milliseconds)`` pairs.
    """
    return [
        ("grpc.initial_reconnect_backoff_ms", INITIAL_RECONNECT_BACKOFF_MS),
        ("grpc.min_reconnect_backoff_ms", MIN_RECONNECT_BACKOFF_MS),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ]


def server_options() -> list[tuple[str, int]]:
    """Return the grpc server arguments of every marti server beyond :func:`common_options`.

    ``grpc.so_reuseport`` is 0: gRPC sets ``SO_REUSEPORT`` by default, which lets a second server bind a port
    that one already listens on and splits the clients between the two. Without it, a second server on a taken
    port fails to bind (``marti.rpc.serving.server`` then says "address in use", naming the port).

    Returns:
        ``(key, value)`` grpc server arguments.
    """
    return [("grpc.so_reuseport", 0)]
