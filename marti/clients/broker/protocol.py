"""Protocol state of the broker SDK shared by the sync and async clients (no I/O).

:class:`_Core` holds what both clients need between calls: the outgoing buffers and their batching
rules, framing and compression, message ids and sequence numbers, pending auto-acks, the memory of
delivered ids that drops redeliveries, the counters behind :class:`CommunicationStats`, and the refusals
that the flush timer met and that the client's next call must raise.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import zstandard

from marti.api.broker.v1 import broker_pb2
from marti.api.common.v1 import common_pb2
from marti.codec import broker as broker_codec
from marti.codec.broker import decode_payload, encode_payload
from marti.errors import DeadlineExceededError, InvalidArgumentError, UnavailableError

from .types import AgentStateEntry, BatchRefusedError, CommunicationStats, Message, batch_refused

SERVICE_NAME = "marti.api.broker.v1.BrokerService"
_IDEMPOTENT = tuple(
    (SERVICE_NAME, m) for m in ("CreateSession", "Send", "Broadcast", "Ack", "GetStates", "GetStats")
)
#: Methods the SDK's channels retry on UNAVAILABLE (safe: the broker deduplicates by message id).
IDEMPOTENT_METHODS = _IDEMPOTENT
#: Errors after which a batch stays buffered and the next flush retries it (same ids: delivered once).
TRANSIENT_ERRORS = (UnavailableError, DeadlineExceededError)


class _Core:
    """State and logic shared by the sync and async clients (no I/O)."""

    def __init__(
        self,
        agent_id: str,
        session: str,
        batching_size: int,
        max_batch_bytes: int,
        update_frequency_s: float,
        compression_level: int,
        auto_ack: bool,
        max_frame_bytes: int,
        dedup_memory: int,
    ) -> None:
        if not agent_id:
            raise InvalidArgumentError("agent_id must be a non-empty string")
        if not session:
            raise InvalidArgumentError("session must be a non-empty string")
        if batching_size < 1:
            raise InvalidArgumentError(f"batching_size={batching_size} must be >= 1")
        if max_batch_bytes < 1 or update_frequency_s < 0 or dedup_memory < 0:
            raise InvalidArgumentError(
                f"max_batch_bytes={max_batch_bytes} must be >= 1, update_frequency_s={update_frequency_s} and "
                f"dedup_memory={dedup_memory} >= 0"
            )
        if not broker_codec.MIN_LEVEL <= compression_level <= broker_codec.MAX_LEVEL:
            raise InvalidArgumentError(f"compression_level={compression_level} is outside [1, 22]")
        self.agent_id = agent_id
        self.session = session
        self.batching_size = batching_size
        self.max_batch_bytes = max_batch_bytes
        self.update_frequency_s = update_frequency_s
        self.level = compression_level
        self.auto_ack = auto_ack
        self.max_frame_bytes = max_frame_bytes
        self.dictionary: zstandard.ZstdCompressionDict | None = None
        self.lock = threading.Lock()
        self.buffer: list[tuple[broker_pb2.Envelope, float]] = []
        self.broadcast_buffer: list[tuple[broker_pb2.Envelope, float]] = []
        self.buffer_bytes = 0
        self.first_buffered_at = 0.0
        # Sequence numbers start at a microsecond clock so they keep increasing across client restarts;
        # next() on an itertools.count is atomic under the GIL (no lock needed).
        self.seq = itertools.count(int(time.time() * 1e6) + 1)
        # Message ids: 64 random bits per client plus a counter (unique within a session with
        # overwhelming probability, like a UUID, and about 10x cheaper to make than uuid4().hex).
        self.id_prefix = os.urandom(8).hex() + "-"
        self.id_counter = itertools.count(1)
        self.pending_acks: list[str] = []
        self.seen: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.dedup_memory = dedup_memory
        self.sent = self.received = 0
        self.sent_raw = self.sent_wire = self.recv_raw = self.recv_wire = 0
        self.send_lat_sum = self.recv_lat_sum = 0.0
        self.refused_batches = self.refused_messages = 0
        self.refused: collections.deque[BatchRefusedError] = collections.deque()

    def set_dictionary(self, data: bytes) -> None:
        self.dictionary = broker_codec.load_dictionary(data) if data else None

    def envelope(
        self, message: Any, receivers: Sequence[str], topic: str, content_type: str | None, ttl_s: float
    ) -> broker_pb2.Envelope:
        if ttl_s < 0:
            raise InvalidArgumentError(f"ttl_s={ttl_s} must be >= 0")
        payload, ctype = encode_payload(message, content_type)
        return broker_pb2.Envelope(
            message_id=f"{self.id_prefix}{next(self.id_counter):x}",
            sender=self.agent_id,
            receivers=receivers,
            topic=topic,
            sequence=next(self.seq),
            sent_at_unix_us=int(time.time() * 1e6),
            content_type=ctype,
            payload=payload,
            ttl_ms=round(ttl_s * 1000),
        )

    def buffer_add(self, env: broker_pb2.Envelope, broadcast: bool) -> bool:
        """Buffers an envelope; returns True if the buffer should be flushed now."""
        with self.lock:
            if not self.buffer and not self.broadcast_buffer:
                self.first_buffered_at = time.monotonic()
            (self.broadcast_buffer if broadcast else self.buffer).append((env, time.perf_counter()))
            self.buffer_bytes += len(env.payload)
            n = len(self.buffer) + len(self.broadcast_buffer)
            return n >= self.batching_size or self.buffer_bytes >= self.max_batch_bytes

    def take_buffers(self) -> tuple[list, list]:
        with self.lock:
            out = (self.buffer, self.broadcast_buffer)
            self.buffer, self.broadcast_buffer, self.buffer_bytes = [], [], 0
            return out

    def restore_buffers(self, unicast: list, broadcast: list) -> None:
        """Puts a batch that failed transiently back in front (a retry reuses message ids: dedup keeps one)."""
        with self.lock:
            self.buffer = unicast + self.buffer
            self.broadcast_buffer = broadcast + self.broadcast_buffer
            self.buffer_bytes = sum(len(e.payload) for e, _ in self.buffer + self.broadcast_buffer)

    def frame(self, items: list) -> common_pb2.CompressedFrame:
        raw = broker_pb2.EnvelopeBatch(envelopes=[e for e, _ in items]).SerializeToString()
        data = broker_codec.encode(raw, broker_codec.CODEC_ZSTD, self.level, self.dictionary)
        if len(data) >= len(raw):  # tiny batches do not compress; send them raw
            return common_pb2.CompressedFrame(
                codec=common_pb2.CODEC_NONE, uncompressed_bytes=len(raw), data=raw
            )
        return common_pb2.CompressedFrame(
            codec=common_pb2.CODEC_ZSTD,
            uncompressed_bytes=len(raw),
            data=data,
            dictionary_id=self.dictionary.dict_id() if self.dictionary is not None else 0,
        )

    def sent_ok(self, items: list, frame: common_pb2.CompressedFrame) -> None:
        now = time.perf_counter()
        with self.lock:
            self.sent += len(items)
            self.sent_raw += frame.uncompressed_bytes
            self.sent_wire += len(frame.data)
            self.send_lat_sum += sum(now - t for _, t in items)

    def unpack(self, frame: common_pb2.CompressedFrame) -> list[Message]:
        """Decodes a delivered frame, drops redeliveries already handed out, queues auto-acks."""
        if frame.uncompressed_bytes == 0 and not frame.data:
            return []
        codec = broker_codec.CODEC_NONE if frame.codec == common_pb2.CODEC_NONE else broker_codec.CODEC_ZSTD
        dictionary = self.dictionary if frame.dictionary_id else None
        raw = broker_codec.decode(
            frame.data, codec, frame.uncompressed_bytes, self.max_frame_bytes, dictionary
        )
        batch = broker_pb2.EnvelopeBatch.FromString(raw)
        now_us = time.time() * 1e6
        out = []
        with self.lock:
            self.recv_raw += frame.uncompressed_bytes
            self.recv_wire += len(frame.data)
            seen, memory, acks = self.seen, self.dedup_memory, self.pending_acks
            auto_ack = self.auto_ack
            lat_us = 0.0
            for e in batch.envelopes:
                mid = e.message_id
                if auto_ack:
                    acks.append(mid)
                if mid in seen:
                    continue
                if memory:
                    seen[mid] = None
                    if len(seen) > memory:
                        seen.popitem(last=False)
                sent_us = e.sent_at_unix_us
                if now_us > sent_us:
                    lat_us += now_us - sent_us
                payload, ctype = e.payload, e.content_type
                out.append(
                    Message(
                        mid,
                        e.sender,
                        decode_payload(payload, ctype),
                        ctype,
                        payload,
                        e.sequence,
                        sent_us / 1e6,
                        tuple(e.receivers),
                        e.topic,
                        e.broadcast,
                        e.delivery_attempt,
                    )
                )
            self.received += len(out)
            self.recv_lat_sum += lat_us / 1e6
        return out

    def take_acks(self) -> list[str]:
        with self.lock:
            acks, self.pending_acks = self.pending_acks, []
            return acks

    def stats(self) -> CommunicationStats:
        with self.lock:
            wire = self.sent_wire + self.recv_wire
            return CommunicationStats(
                total_sent=self.sent,
                total_received=self.received,
                compression_ratio=(self.sent_raw + self.recv_raw) / wire if wire else 1.0,
                avg_send_latency=self.send_lat_sum / self.sent if self.sent else 0.0,
                avg_receive_latency=self.recv_lat_sum / self.received if self.received else 0.0,
                bytes_sent_raw=self.sent_raw,
                bytes_sent_wire=self.sent_wire,
                bytes_received_raw=self.recv_raw,
                bytes_received_wire=self.recv_wire,
                refused_batches=self.refused_batches,
                refused_messages=self.refused_messages,
            )

    def refusal(self, exc: BaseException, items: list, background: bool) -> BatchRefusedError:
        """Records a batch the broker refused and returns the error that reports it.

        Args:
            exc: What sending the batch raised (not a transient error).
            items: The batch's ``(envelope, buffered_at)`` pairs.
            background: The flush timer sent it: the error is also kept for the client's next call.

        Returns:
            A :class:`BatchRefusedError` that is also an instance of ``type(exc)``.
        """
        err = batch_refused(exc, [e.message_id for e, _ in items], background)
        with self.lock:
            self.refused_batches += 1
            self.refused_messages += len(items)
            if background:
                self.refused.append(err)
        return err

    def take_refusal(self) -> BatchRefusedError | None:
        """Pops the oldest refusal the flush timer met and no call has raised yet (None if none)."""
        with self.lock:
            return self.refused.popleft() if self.refused else None

    def split_failed(self, exc: BaseException, unicast: list, bcast: list, background: bool):
        """Handles a failed flush of ``unicast`` (Send) then ``bcast`` (Broadcast); what is left in each
        list is what was not sent.

        Transient errors put both back in the buffers (the next flush retries them with the same ids).
        A refusal drops the refused batch (the first non-empty list) and keeps the other buffered.

        Returns:
            The error to raise: ``exc`` itself if transient, else a :class:`BatchRefusedError`.
        """
        if isinstance(exc, TRANSIENT_ERRORS):
            self.restore_buffers(unicast, bcast)
            return exc
        if unicast:
            self.restore_buffers([], bcast)
            return self.refusal(exc, unicast, background)
        return self.refusal(exc, bcast, background)


def _state_entry(s: broker_pb2.AgentState) -> AgentStateEntry:
    return AgentStateEntry(
        s.agent_id,
        decode_payload(s.value, s.content_type),
        s.content_type,
        s.version,
        s.updated_at_unix_us / 1e6,
    )
