"""SDK for the comm_broker: ``MartiCommClient`` (sync) and ``AsyncMartiCommClient`` (asyncio).

Both speak the BrokerService protocol, batch outgoing messages into zstd frames, and return domain
types (:class:`Message`, :class:`AgentStateEntry`, :class:`CommunicationStats`, :class:`DeadLetter`); gRPC errors become
:mod:`marti.errors` exceptions. Messages are JSON-able values (sent as ``application/json``) or ``bytes``
with a content type; nothing is ever pickled.

Delivery semantics seen by the caller: the broker delivers at least once; the client drops redeliveries of
message ids already acked (a bounded memory of ``dedup_memory`` ids), so within that memory the caller sees
each message once. Acks are automatic by default: the ids returned by one ``get_messages`` call are acked
with the next call (piggybacked on the Receive request), or by ``flush()`` / ``close()``. With
``auto_ack=False`` only ids passed to ``ack`` count as acked: a message not acked yet is handed out again when
the broker redelivers it.

Membership: a client joins its session as its agent when it connects (the sync constructor, the asyncio
client's ``connect``), so a ``broadcast`` sent afterwards reaches it before its first ``get_messages``. A
closed client raises ``FailedPreconditionError`` on every call.

Batching: ``send_message`` buffers, and the client's flush timer follows Nagle's rule
(``send_when_idle=True``, the default, as the NATS clients' flusher): a message buffered while no batch of
this client is in flight goes out at once; messages buffered while one is wait for it to end and then go out
together as the next batch. A batch also closes (into one compressed frame) at ``batching_size`` messages
(default 128), or ``max_batch_bytes`` of payload (default 1 MiB), or ``update_frequency_s`` seconds after its
first message (the linger, default 0.001, like a Kafka producer's ``linger.ms``: the upper bound of any
wait), or on ``flush()``, ``close()``, ``get_messages``, ``publish``, ``broadcast`` or ``broadcast_state``, whichever comes
first. Another agent thus gets a lone message one Send rpc after ``send_message``, while a tight send loop
still fills batches; ``send_when_idle=False`` makes every batch wait the linger (a lone message then arrives
about 1 ms later). Once ``flush()`` returns, the broker has every message sent before it. ``batching_size=1``
sends every message at once in its own Send rpc. ``publish`` and ``broadcast`` do not batch: they send at once
and return a :class:`PublishResult` with the number of agents reached, because topic messages and broadcasts
are not stored for agents that subscribe or join later.

Nothing is dropped silently: a batch the broker refuses raises :class:`BatchRefusedError` (with the
message ids) from the call that sent it, or, if the flush timer sent it, from the client's next call; it
is also counted (``refused_batches`` / ``refused_messages``) and passed to the ``on_error`` callback.

Modules: :mod:`.types` (domain types and errors), :mod:`marti.codec.broker` (payloads and frames), :mod:`.protocol` (batching,
acks, dedup and counters shared by both clients), :mod:`.sync_client`, :mod:`.async_client`.
"""

from __future__ import annotations

from marti.codec.broker import JSON, OCTET_STREAM, decode_payload, encode_payload

from .async_client import AsyncMartiCommClient
from .core import TRANSIENT_ERRORS, _Core
from .protocol import (
    _IDEMPOTENT,
    DEFAULT_BATCHING_SIZE,
    DEFAULT_LINGER_S,
    DEFAULT_MAX_BATCH_BYTES,
    IDEMPOTENT_METHODS,
    SERVICE_NAME,
    _state_entry,
)
from .sync_client import MartiCommClient, open_channel, whole_broker_stats
from .types import (
    AgentStateEntry,
    BatchRefusedError,
    CommunicationStats,
    DeadLetter,
    Message,
    NoSubscribersError,
    PublishResult,
    batch_refused,
)

__all__ = [
    "DEFAULT_BATCHING_SIZE",
    "DEFAULT_LINGER_S",
    "DEFAULT_MAX_BATCH_BYTES",
    "IDEMPOTENT_METHODS",
    "JSON",
    "OCTET_STREAM",
    "SERVICE_NAME",
    "TRANSIENT_ERRORS",
    "AgentStateEntry",
    "AsyncMartiCommClient",
    "BatchRefusedError",
    "CommunicationStats",
    "DeadLetter",
    "MartiCommClient",
    "Message",
    "NoSubscribersError",
    "PublishResult",
    "batch_refused",
    "decode_payload",
    "encode_payload",
    "open_channel",
    "whole_broker_stats",
]

# Private names kept importable from their old home (benchmarks and soak tests use _Core directly).
_PRIVATE = (_Core, _IDEMPOTENT, _state_entry)
