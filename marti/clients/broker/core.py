"""The broker SDK's client state, shared by the sync and async clients (no I/O): :class:`_Core` holds what both
need between calls: the outgoing buffers and their batching rules (the broker's limits, once a refusal told them),
framing and compression, message ids and sequence numbers, pending auto-acks, the memory of delivered ids that
drops redeliveries, the counters behind :class:`~.types.CommunicationStats`, the refusals that the flush timer met
and that the client's next call must raise, and the count of batches in flight (``send_when_idle``: a message
buffered while none is goes out at once). :func:`_message` decodes a delivered envelope.
"""

from __future__ import annotations

import collections
import itertools
import logging
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
from marti.errors import (
    BatchTooLargeError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)
from marti.rpc.paging import item_bytes, pages

from .args import (
    MAX_TTL_S,
    content_type_arg,
    seconds_arg,
)
from .types import (
    BatchRefusedError,
    CommunicationStats,
    Message,
    batch_refused,
)

#: Errors after which a batch stays buffered and the next flush retries it (same ids: delivered once).
TRANSIENT_ERRORS = (UnavailableError, DeadlineExceededError)

_LOG = logging.getLogger("marti.broker.client")


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
        send_when_idle: bool = True,
    ) -> None:
        self.agent_id = agent_id
        self.session = session
        self.batching_size = batching_size
        # The broker's max_batch_messages, once a refusal told it (learn_batch_limit); None: not known.
        self.broker_batch_limit: int | None = None
        # The broker's max_frame_bytes, once a refusal told it (learn_batch_limit); None: not known.
        self.broker_frame_limit: int | None = None
        self.max_batch_bytes = max_batch_bytes
        self.update_frequency_s = update_frequency_s
        # Nagle's rule: a message buffered while no batch is in flight is due at once (no linger).
        self.send_when_idle = send_when_idle
        # Send/Broadcast batch rpcs of this client under way (begin_send / end_send).
        self.in_flight = 0
        self.level = compression_level
        self.auto_ack = auto_ack
        self.max_frame_bytes = max_frame_bytes
        self.dictionary: zstandard.ZstdCompressionDict | None = None
        self.lock = threading.Lock()
        self.buffer: list[tuple[broker_pb2.Envelope, float]] = []
        self.broadcast_buffer: list[tuple[broker_pb2.Envelope, float]] = []
        self.buffer_bytes = 0
        # time.perf_counter() at which the oldest buffered message was buffered (the linger counts from it).
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
        # Errors about delivered messages that did not decode, for the receiving calls to raise (_decode).
        self.undecodable: collections.deque[InvalidArgumentError] = collections.deque()
        # Set by close(): buffer_add refuses from then on, so nothing lands in a buffer no flush will send.
        self.closed = False

    def after_fork(self) -> None:
        """Re-makes, in a forked child, what it cannot share with its parent: the lock (a thread of the
        parent may have held it at fork time) and the message-id prefix (the child's new messages must not
        reuse the ids the parent goes on making, or the broker would drop them as duplicates), and the count
        of batches in flight (a parent's send under way at fork time never ends in the child). Buffered
        messages keep their ids."""
        self.lock = threading.Lock()
        self.id_prefix = os.urandom(8).hex() + "-"
        self.in_flight = 0

    def closed_error(self) -> FailedPreconditionError:
        """The error of every call on a closed client (naming the agent and session)."""
        return FailedPreconditionError(
            f"the broker client of agent {self.agent_id!r} (session {self.session!r}) is closed; make a new one"
        )

    def close(self) -> bool:
        """Marks the client closed: :meth:`buffer_add` raises from now on (the caller flushes what is
        buffered). Returns False if it was closed already."""
        with self.lock:
            was_open, self.closed = not self.closed, True
            return was_open

    def set_dictionary(self, data: bytes) -> None:
        self.dictionary = broker_codec.load_dictionary(data) if data else None

    def envelope(
        self, message: Any, receivers: Sequence[str], topic: str, content_type: str | None, ttl_s: float
    ) -> broker_pb2.Envelope:
        ttl_s = seconds_arg("ttl_s", ttl_s, MAX_TTL_S)
        payload, ctype = encode_payload(message, content_type_arg(content_type))
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

    def buffer_add(self, env: broker_pb2.Envelope, broadcast: bool) -> tuple[bool, bool]:
        """Buffers an envelope.

        Returns:
            ``(full, first)``: ``full`` if the batch is full (by count or bytes) and must be sent now;
            ``first`` if the buffers were empty before (this message starts the linger).

        Raises:
            FailedPreconditionError: The client is closed (:meth:`close`); nothing was buffered.
        """
        now = time.perf_counter()
        with self.lock:
            if self.closed:
                raise self.closed_error()
            first = not self.buffer and not self.broadcast_buffer
            if first:
                self.first_buffered_at = now
            (self.broadcast_buffer if broadcast else self.buffer).append((env, now))
            self.buffer_bytes += len(env.payload)
            n = len(self.buffer) + len(self.broadcast_buffer)
            return n >= self.batching_size or self.buffer_bytes >= self.max_batch_bytes, first

    def has_buffered(self) -> bool:
        """Whether any message is buffered (not sent yet)."""
        return bool(self.buffer or self.broadcast_buffer)

    def buffered_ids(self) -> list[str]:
        """Ids of the buffered messages, unicast then broadcast, in send order."""
        with self.lock:
            return [e.message_id for e, _ in self.buffer + self.broadcast_buffer]

    def flush_delay(self) -> float | None:
        """Seconds until the buffers are due (<= 0: due now), or None if nothing is buffered.

        They are due when the oldest buffered message has waited ``update_frequency_s``, and, with
        ``send_when_idle``, at once while no batch of this client is in flight.
        """
        with self.lock:
            if not self.buffer and not self.broadcast_buffer:
                return None
            if self.send_when_idle and not self.in_flight:
                return 0.0
            return self.first_buffered_at + self.update_frequency_s - time.perf_counter()

    def begin_send(self) -> None:
        """Counts a Send or Broadcast batch rpc of this client as in flight (until :meth:`end_send`)."""
        with self.lock:
            self.in_flight += 1

    def end_send(self) -> bool:
        """Counts a batch rpc begun by :meth:`begin_send` as ended (sent or failed).

        Returns:
            Whether the flush timer must be woken: with ``send_when_idle``, no other batch is in flight now
            and messages were buffered meanwhile (their batch is due at once).
        """
        with self.lock:
            self.in_flight -= 1
            return self.send_when_idle and not self.in_flight and bool(self.buffer or self.broadcast_buffer)

    def batch_count(self, items: list) -> int:
        """How many of ``items`` (a flush's messages, in order) go in the next Send or Broadcast rpc: all of
        them, or fewer once a refusal told the broker's limits (:meth:`learn_batch_limit`): at most its
        ``max_batch_messages``, and as many as fit its ``max_frame_bytes`` (the serialized ``EnvelopeBatch``,
        :func:`marti.rpc.paging.pages`; at least one, which the broker refuses if it alone is too large)."""
        n = min(len(items), self.broker_batch_limit or len(items))
        if self.broker_frame_limit is None:
            return n
        return len(pages([item_bytes(env) for env, _ in items[:n]], n, self.broker_frame_limit)[0])

    def learn_batch_limit(self, exc: BaseException, sent: int) -> bool:
        """Whether ``exc`` is the broker refusing a batch of ``sent`` messages (more than one) for its size
        alone: its :class:`~marti.errors.BatchTooLargeError` names a ``max_batch_messages`` below ``sent``, or
        the ``max_frame_bytes`` the batch's frame broke. If so, later batches keep under that limit
        (``batching_size`` or ``max_batch_bytes`` is lowered to it, with a warning), and the refused batch is to
        be sent again in parts (same message ids: nothing was delivered from a refused batch)."""
        if not isinstance(exc, BatchTooLargeError) or sent < 2:
            return False
        if 0 < exc.max_batch_messages < sent:
            self._warn_limit("messages a batch (max_batch_messages); batching_size", exc.max_batch_messages)
            self.broker_batch_limit = exc.max_batch_messages
            self.batching_size = min(self.batching_size, exc.max_batch_messages)
            return True
        if exc.max_frame_bytes > 0:
            self._warn_limit(
                "uncompressed bytes a batch (max_frame_bytes); max_batch_bytes", exc.max_frame_bytes
            )
            self.broker_frame_limit = exc.max_frame_bytes
            self.max_batch_bytes = min(self.max_batch_bytes, exc.max_frame_bytes)
            return True
        return False

    def _warn_limit(self, what: str, limit: int) -> None:
        _LOG.warning(
            "broker client %r: the broker takes at most %d %s is lowered to it", self.agent_id, limit, what
        )

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
            items = self.buffer + self.broadcast_buffer
            self.buffer_bytes = sum(len(e.payload) for e, _ in items)
            if items:  # the linger counts from the oldest message still buffered
                self.first_buffered_at = min(t for _, t in items)

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

    def remember(self, message_ids: Sequence[str]) -> None:
        """Adds acked message ids to the dedup memory (the oldest forgotten past ``dedup_memory``); the caller
        holds :attr:`lock`."""
        seen, memory = self.seen, self.dedup_memory
        if not memory:
            return
        for mid in message_ids:
            seen[mid] = None
            seen.move_to_end(mid)
        while len(seen) > memory:
            seen.popitem(last=False)

    def acked(self, message_ids: Sequence[str]) -> None:
        """Records ids the caller acked itself (``auto_ack=False``): their redeliveries are dropped from now on."""
        with self.lock:
            self.remember(message_ids)

    def handled(self, message_id: str) -> None:
        """With ``auto_ack``, queues the ack of a message the caller is done with and remembers its id (a
        redelivery is dropped from now on); does nothing with ``auto_ack=False``. ``subscribe`` calls it when
        the caller asks for the message after it."""
        if self.auto_ack:
            with self.lock:
                self.pending_acks.append(message_id)
                self.remember((message_id,))

    def unpack(self, frame: common_pb2.CompressedFrame, ack_all: bool = True) -> list[Message]:
        """Decodes a delivered frame, drops redeliveries of acked messages (acking them again), and, if
        ``ack_all`` (``get_messages``: the whole list is handed out at once), queues the auto-acks of the
        others. ``subscribe`` passes ``ack_all=False`` and acks each message with :meth:`handled` once the
        caller asks for the next: a message it never handed out, or the one the caller left the loop on, stays
        unacked and the broker delivers it again after its ``ack_timeout_s``.

        The dedup memory holds acked ids only: with ``auto_ack`` every message handed out (its ack is queued
        here), with ``auto_ack=False`` those the caller acked (:meth:`acked`). So the broker's redelivery of a
        message the caller has not acked (after its ``ack_timeout_s``) reaches the caller again, while one
        that crossed the ack on the wire (or whose piggybacked auto-ack had not left yet) is dropped.
        """
        if frame.uncompressed_bytes == 0 and not frame.data:
            return []
        codec = broker_codec.CODEC_NONE if frame.codec == common_pb2.CODEC_NONE else broker_codec.CODEC_ZSTD
        dictionary = self.dictionary if frame.dictionary_id else None
        raw = broker_codec.decode(
            frame.data, codec, frame.uncompressed_bytes, self.max_frame_bytes, dictionary
        )
        batch = broker_pb2.EnvelopeBatch.FromString(raw)
        messages = self._decode(batch.envelopes)
        now_us = time.time() * 1e6
        out = []
        with self.lock:
            self.recv_raw += frame.uncompressed_bytes
            self.recv_wire += len(frame.data)
            seen, memory, acks = self.seen, self.dedup_memory, self.pending_acks
            auto_ack = self.auto_ack and ack_all
            lat_us = 0.0
            for m in messages:
                mid = m.message_id
                if mid in seen:  # acked already: ack the redelivery again, hand nothing out
                    acks.append(mid)
                    continue
                if auto_ack:
                    acks.append(mid)
                    if memory:  # remember(), inlined on this hot path
                        seen[mid] = None
                        if len(seen) > memory:
                            seen.popitem(last=False)
                if now_us > m.sent_at * 1e6:
                    lat_us += now_us - m.sent_at * 1e6
                out.append(m)
            self.received += len(out)
            self.recv_lat_sum += lat_us / 1e6
        return out

    def _decode(self, envelopes) -> list[Message]:
        """The :class:`Message` of each delivered envelope that decodes. One that does not (a payload declared
        JSON that does not parse) is left out, neither handed out nor acked (the broker delivers it again,
        then dead-letters it): the error naming it is kept for :meth:`take_undecodable`."""
        out, bad = [], []
        for e in envelopes:
            try:
                out.append(_message(e))
            except InvalidArgumentError as exc:
                bad.append(str(exc))
        if bad:
            more = f" (and {len(bad) - 1} more message(s) of that delivery)" if len(bad) > 1 else ""
            err = InvalidArgumentError(
                f"{bad[0]}{more}; not handed out nor acked (the broker delivers it again, and dead-letters it "
                "after max_delivery_attempts); the other messages of its delivery were handed out"
            )
            with self.lock:
                self.undecodable.append(err)
        return out

    def take_undecodable(self) -> InvalidArgumentError | None:
        """Pops the oldest error about delivered messages that did not decode (:meth:`_decode`), or None."""
        with self.lock:
            return self.undecodable.popleft() if self.undecodable else None

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

    def refusal(
        self, exc: BaseException, items: list, background: bool, keep: bool = False
    ) -> BatchRefusedError:
        """Records a batch the broker refused and returns the error that reports it.

        Args:
            exc: What sending the batch raised (not a transient error).
            items: The batch's ``(envelope, buffered_at)`` pairs.
            background: The flush timer sent it: the error says so and is kept for the client's next call.
            keep: Keep the error for the client's next call (:meth:`take_refusal`) even if not ``background``.

        Returns:
            A :class:`BatchRefusedError` that is also an instance of ``type(exc)``.
        """
        err = batch_refused(exc, [e.message_id for e, _ in items], background)
        with self.lock:
            self.refused_batches += 1
            self.refused_messages += len(items)
            if background or keep:
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


def _message(e: broker_pb2.Envelope) -> Message:
    """The :class:`Message` of a delivered envelope.

    Raises:
        InvalidArgumentError: Its payload is declared JSON and does not parse (the message and sender named).
    """
    payload, ctype = e.payload, e.content_type
    try:
        content = decode_payload(payload, ctype)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"message {e.message_id!r} from {e.sender!r}: {exc}") from None
    return Message(
        e.message_id, e.sender, content, ctype, payload, e.sequence, e.sent_at_unix_us / 1e6,
        tuple(e.receivers), e.topic, e.broadcast, e.delivery_attempt,
    )  # fmt: skip
