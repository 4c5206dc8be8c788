"""zstd frames that claim or expand to huge sizes, oversized and non-ASCII metadata.

A bomb is refused at the configured limit (broker ``max_frame_bytes``, store ``max_item_bytes``) without
inflating it: the test process's peak RSS (server in-process) grows by far less than the bomb's size.
"""

from __future__ import annotations

import resource

import grpc
import pytest
import zstandard
from grpc_health.v1 import health_pb2, health_pb2_grpc
from security.stack import all_specs

from marti.api.broker.v1 import broker_pb2
from marti.api.broker.v1 import broker_service_pb2 as bpb
from marti.api.broker.v1 import broker_service_pb2_grpc as bgrpc
from marti.api.common.v1 import common_pb2
from marti.api.experience.v1 import experience_pb2 as xpb
from marti.api.experience.v1 import experience_service_pb2 as xspb
from marti.api.experience.v1 import experience_service_pb2_grpc as xgrpc
from marti.rpc.settings import ServerSettings
from marti.rpc.testing import serve_in_thread

#: Size the bombs expand to, bytes (1 GiB: far over every limit and over what the test may allocate).
BOMB_BYTES = 1 << 30


@pytest.fixture(scope="module")
def address(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits")
    with serve_in_thread(lambda: all_specs(str(tmp)), ServerSettings(host="127.0.0.1", port=0)) as server:
        yield server.address


def _bomb(with_size: bool) -> bytes:
    """A zstd frame of ``BOMB_BYTES`` zeros (about 64 KiB compressed), streamed so nothing big is held."""
    cctx = zstandard.ZstdCompressor(level=1, write_content_size=with_size)
    chunk = b"\0" * (1 << 24)
    obj = cctx.compressobj(size=BOMB_BYTES if with_size else -1)
    out = [obj.compress(chunk) for _ in range(BOMB_BYTES // len(chunk))]
    out.append(obj.flush())
    return b"".join(out)


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    return {"header": _bomb(True), "streamed": _bomb(False)}


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _code(fn) -> tuple[grpc.StatusCode, str]:
    try:
        fn()
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as err:
        return err.code(), err.details()


def _envelope_frame(data: bytes, declared: int) -> common_pb2.CompressedFrame:
    return common_pb2.CompressedFrame(codec=common_pb2.CODEC_ZSTD, uncompressed_bytes=declared, data=data)


def test_broker_refuses_zstd_bombs_at_max_frame_bytes(address, bombs):
    stub = bgrpc.BrokerServiceStub(grpc.insecure_channel(address))
    before = _peak_rss_bytes()
    cases = {
        "header claims 1 GiB, request claims 1 GiB": (
            bombs["header"],
            BOMB_BYTES,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
        "header claims 1 GiB, request claims 100": (bombs["header"], 100, grpc.StatusCode.RESOURCE_EXHAUSTED),
        "no header size, request claims 100": (bombs["streamed"], 100, grpc.StatusCode.INVALID_ARGUMENT),
        "request claims 2**63": (b"", 2**63, grpc.StatusCode.RESOURCE_EXHAUSTED),
        "magic only": (b"(\xb5/\xfd", 10, grpc.StatusCode.INVALID_ARGUMENT),
    }
    for label, (data, declared, expected) in cases.items():
        req = bpb.SendRequest(session="bomb", sender="a", frame=_envelope_frame(data, declared))
        code, details = _code(lambda r=req: stub.Send(r, timeout=10))
        assert code == expected, (label, code, details)
        if expected == grpc.StatusCode.RESOURCE_EXHAUSTED:
            assert "max_frame_bytes" in details, (label, details)
    assert _peak_rss_bytes() - before < 256 << 20
    # a frame just at the limit is fine: the broker's default max_frame_bytes
    from services.comm_broker.core.limits import BrokerLimits

    limit = BrokerLimits().max_frame_bytes
    batch = broker_pb2.EnvelopeBatch(
        envelopes=[broker_pb2.Envelope(message_id="m1", sender="a", receivers=["b"])]
    )
    raw = batch.SerializeToString()
    ok = stub.Send(
        bpb.SendRequest(session="bomb", sender="a", frame=_envelope_frame(zstandard.compress(raw), len(raw)))
    )
    assert ok.accepted == 1 and len(raw) <= limit


def test_store_refuses_zstd_bombs_at_max_item_bytes(address, bombs):
    stub = xgrpc.ExperienceServiceStub(grpc.insecure_channel(address))
    before = _peak_rss_bytes()
    for label, bomb in bombs.items():
        item = xpb.InsertItem(
            table="default",
            priority=1.0,
            encoded=xpb.EncodedTrajectory(chunks=[bomb], encoding=1),
            client_seq=7,
        )
        try:
            responses = list(stub.Insert(iter([xspb.InsertRequest(items=[item])]), timeout=20))
            statuses = [c.status for r in responses for c in r.confirmations]
            assert len(statuses) == 1 and statuses[0].code == grpc.StatusCode.INVALID_ARGUMENT.value[0], label
            # a header-declared size is refused naming the limit; a streamed frame stops at the limit
            # (zstd's max_output_size) and is refused as over it, naming the limit too
            expected = "declares" if label == "header" else "decompresses to more than"
            assert expected in statuses[0].message, (label, statuses)
            assert "max_item_bytes (MARTI_STORE_MAX_ITEM_BYTES)" in statuses[0].message, (label, statuses)
        except grpc.RpcError as err:
            assert err.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), (
                label,
                err,
            )
    assert _peak_rss_bytes() - before < 256 << 20


def test_oversized_and_non_ascii_metadata(address):
    channel = grpc.insecure_channel(address)
    stub = bgrpc.BrokerServiceStub(channel)
    req = bpb.CreateSessionRequest(session="meta")
    # 1 MiB of metadata: over gRPC's header list limit (16 KiB by default); refused, server unharmed
    code, _ = _code(lambda: stub.CreateSession(req, metadata=(("x-junk", "a" * (1 << 20)),), timeout=5))
    assert code in (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
    ), code
    # many small entries
    many = tuple((f"x-k{i}", "v" * 100) for i in range(500))
    code, _ = _code(lambda: stub.CreateSession(req, metadata=many, timeout=5))
    assert code in (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
    ), code
    # binary metadata with arbitrary bytes, and a weird request id, are accepted
    ok = stub.CreateSession(
        req, metadata=(("x-request-id-bin", "\u00e9\U0001f600".encode() + b"\xff\x00"),), timeout=5
    )
    assert ok.session == "meta"
    ok = stub.CreateSession(req, metadata=(("x-request-id", "id with spaces ~!@"),), timeout=5)
    assert ok.session == "meta"
    # non-ASCII text in a text header is refused by the client library before it reaches the wire
    code, _ = _code(lambda: stub.CreateSession(req, metadata=(("x-request-id", "\u00e9t\u00e9"),), timeout=5))
    assert code != grpc.StatusCode.OK
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    channel.close()
