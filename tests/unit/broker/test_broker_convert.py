"""convert.py: received envelope bytes are delivered verbatim, and parse exactly like rebuilt envelopes."""

from __future__ import annotations

import pytest

from marti.api.broker.v1 import broker_pb2
from marti.api.common.v1 import common_pb2
from marti.codec import broker as broker_codec
from services.comm_broker import convert
from services.comm_broker.core import Broker, Delivery, Envelope


def _pb(mid: str, **kw) -> broker_pb2.Envelope:
    fields = dict(
        message_id=mid,
        sender="ä-sender",
        receivers=["b", "ç"],
        sequence=7,
        sent_at_unix_us=1_700_000_000_123_457,
        content_type="application/json",
        payload='{"text": "héllo"}'.encode(),
        ttl_ms=1500,
    )
    fields.update(kw)
    return broker_pb2.Envelope(**fields)


def _frame(envelopes: list[broker_pb2.Envelope], extra: bytes = b"") -> common_pb2.CompressedFrame:
    raw = broker_pb2.EnvelopeBatch(envelopes=envelopes).SerializeToString() + extra
    return common_pb2.CompressedFrame(
        codec=common_pb2.CODEC_ZSTD, uncompressed_bytes=len(raw), data=broker_codec.encode(raw)
    )


def _delivered(frame: common_pb2.CompressedFrame) -> list[broker_pb2.Envelope]:
    raw = broker_codec.decode(frame.data, "zstd" if frame.codec == common_pb2.CODEC_ZSTD else "none",
                              frame.uncompressed_bytes, 1 << 20)  # fmt: skip
    return list(broker_pb2.EnvelopeBatch.FromString(raw).envelopes)


@pytest.mark.parametrize("attempt", [1, 2, 127, 128, 300_000])
def test_wire_passthrough_equals_rebuilt_envelope(attempt):
    sent = [_pb("m1"), _pb("m2", payload=b"", topic="t", receivers=[]), _pb("m3", delivery_attempt=9)]
    envs = convert.decode_frame(_frame(sent), 1 << 20, None)
    assert [e.wire for e in envs] == [p.SerializeToString() for p in sent]  # the received bytes, verbatim
    fast = _delivered(convert.encode_deliveries([Delivery(e, "b", attempt) for e in envs], "zstd", 3, None))
    slow_envs = [e._replace(wire=b"") for e in envs]
    slow = _delivered(
        convert.encode_deliveries([Delivery(e, "b", attempt) for e in slow_envs], "zstd", 3, None)
    )
    assert fast == slow
    assert [e.delivery_attempt for e in fast] == [attempt] * 3  # overrides the sender's value (m3)
    assert fast[0].sent_at_unix_us == 1_700_000_000_123_457


def test_unknown_batch_fields_fall_back_to_reserialization():
    sent = [_pb("m1"), _pb("m2")]
    unknown = b"\x10\x05"  # field 2 (varint 5): not part of EnvelopeBatch
    envs = convert.decode_frame(_frame(sent, extra=unknown), 1 << 20, None)
    assert convert.split_batch(broker_pb2.EnvelopeBatch(envelopes=sent).SerializeToString() + unknown) is None
    assert [e.message_id for e in envs] == ["m1", "m2"]
    assert [e.wire for e in envs] == [p.SerializeToString() for p in sent]


def test_missing_content_type_is_defaulted_and_not_passed_through():
    (env,) = convert.decode_frame(_frame([_pb("m1", content_type="")]), 1 << 20, None)
    assert env.content_type == "application/octet-stream" and env.wire == b""
    (out,) = _delivered(convert.encode_deliveries([Delivery(env, "b", 1)], "zstd", 3, None))
    assert out.content_type == "application/octet-stream"


def test_broker_assigned_sequence_drops_stale_wire_bytes():
    (env,) = convert.decode_frame(_frame([_pb("m1", sequence=0)]), 1 << 20, None)
    assert env.wire  # as received ...
    broker = Broker()
    broker.send("s", "ä-sender", [env])
    (d,) = broker.receive("s", "b", 10)
    assert d.envelope.sequence == 1 and d.envelope.wire == b""  # ... but the broker changed a field
    (out,) = _delivered(convert.encode_deliveries([d], "zstd", 3, None))
    assert out.sequence == 1 and out.message_id == "m1"


def test_wire_size_counts_against_mailbox_bytes():
    env = Envelope(message_id="m", sender="a", payload=b"x", receivers=("b",), wire=b"z" * 500)
    assert env.size_bytes == 532
    assert env._replace(wire=b"").size_bytes == 1 + 1 + 1 + len("application/octet-stream") + 32
