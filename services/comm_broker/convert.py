"""The only bridge between broker protobufs and core domain types (and the frame codec).

Units: the protocol carries microseconds (``*_unix_us``) and milliseconds (``ttl_ms``); the core uses
float seconds.
"""

from __future__ import annotations

import zstandard
from google.protobuf.message import DecodeError

from marti.api.broker.v1 import broker_pb2
from marti.api.common.v1 import common_pb2
from marti.codec import broker as broker_codec
from marti.errors import BatchTooLargeError, InvalidArgumentError

from .core.types import AgentState, DeadLetter, Delivery, Envelope, SendResult, StatsSnapshot

_CODEC_NAMES = {
    common_pb2.CODEC_NONE: broker_codec.CODEC_NONE,
    common_pb2.CODEC_ZSTD: broker_codec.CODEC_ZSTD,
}


def codec_name(codec: int) -> str:
    """Maps the proto ``Codec`` enum to a codec name.

    Raises:
        InvalidArgumentError: ``CODEC_UNSPECIFIED`` or an unknown value.
    """
    name = _CODEC_NAMES.get(codec)
    if name is None:
        raise InvalidArgumentError(f"frame codec {codec} is not CODEC_NONE (1) or CODEC_ZSTD (2)")
    return name


def envelope_from_proto(pb: broker_pb2.Envelope, wire: bytes = b"") -> Envelope:
    """Converts a proto envelope into the core type (``sent_at`` and ``ttl`` become seconds).

    Args:
        pb: The parsed envelope.
        wire: Its serialized bytes, kept in ``Envelope.wire`` so delivery can reuse them (see
            :func:`encode_deliveries`); pass ``b""`` when they are not at hand. Ignored (left empty) when
            the proto lacks a content type, because the core then fills in the default.
    """
    content_type = pb.content_type
    return Envelope(
        pb.message_id,
        pb.sender,
        pb.payload,
        content_type or "application/octet-stream",
        tuple(pb.receivers),
        pb.topic,
        pb.broadcast,
        pb.sequence,
        pb.sent_at_unix_us / 1e6,
        pb.ttl_ms / 1000.0,
        wire if content_type else b"",
    )


def envelope_to_proto(env: Envelope, attempt: int = 0) -> broker_pb2.Envelope:
    """Converts a core envelope into a proto (``attempt`` goes to ``delivery_attempt``)."""
    return broker_pb2.Envelope(
        message_id=env.message_id,
        sender=env.sender,
        receivers=env.receivers,
        topic=env.topic,
        broadcast=env.broadcast,
        sequence=env.sequence,
        sent_at_unix_us=round(env.sent_at * 1e6),
        content_type=env.content_type,
        payload=env.payload,
        ttl_ms=round(env.ttl_s * 1000),
        delivery_attempt=attempt,
    )


def _varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]
#: Tag of ``EnvelopeBatch.envelopes`` (field 1, length-delimited).
_BATCH_TAG = b"\x0a"
#: Tag of ``Envelope.delivery_attempt`` (field 11, varint).
_ATTEMPT_TAG = b"\x58"


def split_batch(raw: bytes) -> list[bytes] | None:
    """Splits a serialized ``EnvelopeBatch`` into the serialized bytes of each envelope, without parsing them.

    A protobuf message is a sequence of (tag, value) records; a batch holding only field 1 is
    ``0x0A <varint length> <envelope bytes>`` repeated. Call this after the batch parsed successfully
    (so the bytes are known to be well formed).

    Args:
        raw: The serialized batch.

    Returns:
        One ``bytes`` per envelope, in order, or None if the batch holds anything but field 1 records
        (unknown fields): the caller then serializes the parsed envelopes instead.
    """
    out = []
    pos, end = 0, len(raw)
    while pos < end:
        if raw[pos] != 0x0A:
            return None
        pos += 1
        length = shift = 0
        while True:
            b = raw[pos]
            pos += 1
            length |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
        out.append(raw[pos : pos + length])
        pos += length
    return out


def decode_frame(
    frame: common_pb2.CompressedFrame,
    max_frame_bytes: int,
    dictionary: zstandard.ZstdCompressionDict | None,
) -> list[Envelope]:
    """Decompresses and parses a frame of envelopes.

    Args:
        frame: The frame from a Send or Broadcast request.
        max_frame_bytes: Decompression limit (bytes).
        dictionary: The session's dictionary, required if the frame declares a dictionary id.

    Returns:
        The envelopes in order.

    Raises:
        InvalidArgumentError: Bad codec, unknown dictionary id, corrupt or truncated frame, bad protobuf.
        BatchTooLargeError: Declared size over ``max_frame_bytes`` (a ResourceExhaustedError whose ErrorInfo
            names the limit: the SDK sends such a batch again in parts).
        ResourceExhaustedError: A zstd header that declares more than ``max_frame_bytes``.
    """
    if frame.uncompressed_bytes > max_frame_bytes:
        raise BatchTooLargeError(
            f"frame of {frame.uncompressed_bytes} uncompressed bytes is over max_frame_bytes={max_frame_bytes}",
            max_frame_bytes=max_frame_bytes,
        )
    codec = codec_name(frame.codec)
    if frame.dictionary_id:
        if dictionary is None or dictionary.dict_id() != frame.dictionary_id:
            raise InvalidArgumentError(
                f"frame uses zstd dictionary id {frame.dictionary_id}, which is not this session's dictionary"
            )
    else:
        dictionary = None
    raw = broker_codec.decode(frame.data, codec, frame.uncompressed_bytes, max_frame_bytes, dictionary)
    batch = broker_pb2.EnvelopeBatch()
    try:
        batch.ParseFromString(raw)
    except DecodeError as exc:
        raise InvalidArgumentError(f"frame does not hold a valid EnvelopeBatch: {exc}") from None
    envelopes = batch.envelopes
    wires = split_batch(raw)
    if wires is None or len(wires) != len(envelopes):
        wires = [e.SerializeToString() for e in envelopes]
    return [envelope_from_proto(e, w) for e, w in zip(envelopes, wires, strict=True)]


def encode_deliveries(
    deliveries: list[Delivery],
    codec: str,
    level: int,
    dictionary: zstandard.ZstdCompressionDict | None,
) -> common_pb2.CompressedFrame:
    """Serializes deliveries as an EnvelopeBatch and compresses it into one frame.

    Envelopes that carry their received bytes (``Envelope.wire``) are copied, not rebuilt: each becomes
    ``0x0A <length> <wire> 0x58 <attempt>``; the trailing ``delivery_attempt`` record overrides any value
    inside ``wire`` (for a scalar field the last record wins), so the result parses exactly as a batch of
    ``envelope_to_proto(envelope, attempt)`` would. Others are built and serialized.

    Returns:
        The frame (``uncompressed_bytes`` = serialized batch size, ``data`` = compressed bytes).
    """
    parts = []
    for d in deliveries:
        env = d.envelope
        wire = env.wire
        if not wire:
            wire = envelope_to_proto(env).SerializeToString()
        attempt = _varint(d.attempt)
        parts += (_BATCH_TAG, _varint(len(wire) + 1 + len(attempt)), wire, _ATTEMPT_TAG, attempt)
    raw = b"".join(parts)
    data = broker_codec.encode(raw, codec, level, dictionary)
    if codec == broker_codec.CODEC_ZSTD and len(data) >= len(raw):  # incompressible (tiny) batch: send raw
        codec, data = broker_codec.CODEC_NONE, raw
    return common_pb2.CompressedFrame(
        codec=common_pb2.CODEC_ZSTD if codec == broker_codec.CODEC_ZSTD else common_pb2.CODEC_NONE,
        uncompressed_bytes=len(raw),
        data=data,
        dictionary_id=dictionary.dict_id()
        if dictionary is not None and codec == broker_codec.CODEC_ZSTD
        else 0,
    )


def send_result_fields(result: SendResult) -> dict:
    """Keyword arguments for SendResponse / BroadcastResponse."""
    return {
        "accepted": result.accepted,
        "duplicates": result.duplicates,
        "enqueued": result.enqueued,
        "sequences": list(result.sequences),
    }


def state_to_proto(state: AgentState) -> broker_pb2.AgentState:
    """Converts a board entry (``updated_at`` becomes microseconds)."""
    return broker_pb2.AgentState(
        agent_id=state.agent_id,
        content_type=state.content_type,
        value=state.value,
        version=state.version,
        updated_at_unix_us=round(state.updated_at * 1e6),
    )


def dead_letter_to_proto(dead: DeadLetter) -> broker_pb2.DeadLetter:
    """Converts a dead letter."""
    return broker_pb2.DeadLetter(
        envelope=envelope_to_proto(dead.envelope, dead.attempts),
        receiver=dead.receiver,
        attempts=dead.attempts,
        reason=dead.reason,
        dead_at_unix_us=round(dead.dead_at * 1e6),
    )


def stats_to_proto(snap: StatsSnapshot) -> broker_pb2.BrokerStats:
    """Converts a stats snapshot (averages computed from sums and counts; 0 before any sample)."""
    c = snap.counters
    return broker_pb2.BrokerStats(
        sent=c.sent,
        enqueued=c.enqueued,
        delivered=c.delivered,
        redelivered=c.redelivered,
        acked=c.acked,
        expired=c.expired,
        dead_lettered=c.dead_lettered,
        duplicates=c.duplicates,
        rejected=c.rejected,
        bytes_in_raw=c.bytes_in_raw,
        bytes_in_wire=c.bytes_in_wire,
        bytes_out_raw=c.bytes_out_raw,
        bytes_out_wire=c.bytes_out_wire,
        compression_ratio=c.compression_ratio,
        avg_send_latency_s=c.send_latency_s_sum / c.send_count if c.send_count else 0.0,
        avg_delivery_latency_s=c.delivery_latency_s_sum / c.delivery_count if c.delivery_count else 0.0,
        sessions=snap.sessions,
        agents=snap.agents,
        pending=snap.pending,
        in_flight=snap.in_flight,
        mailbox_bytes=snap.mailbox_bytes,
        dead_letters=snap.dead_letters,
    )
