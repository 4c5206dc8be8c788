"""Integration tests of the shared server bootstrap over real gRPC on loopback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from marti import errors
from marti.rpc.client.channel import make_channel
from marti.rpc.client.health import check_health
from marti.rpc.errors import from_rpc_error
from marti.rpc.serving.server import ServiceSpec
from marti.rpc.settings import ServerSettings
from marti.rpc.testing import ServerThread, serve_in_thread

ECHO_SERVICE = "marti.test.Echo"


def _echo_spec() -> ServiceSpec:
    """A test-only service: echoes bytes, or raises the domain error named in the request."""

    async def echo(request: bytes, context) -> bytes:
        if request.startswith(b"raise:"):
            raise getattr(errors, request[6:].decode())("bad value 'x' broke limit 7")
        if request == b"crash":
            raise RuntimeError("boom")
        return request

    async def count(request: bytes, context):
        for i in range(int(request or b"3")):
            if request == b"2" and i == 1:
                raise errors.NotFoundError("stream item 1 missing")
            yield str(i).encode()

    handler = grpc.method_handlers_generic_handler(
        ECHO_SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Count": grpc.unary_stream_rpc_method_handler(count),
        },
    )
    return ServiceSpec(ECHO_SERVICE, lambda server: server.add_generic_rpc_handlers((handler,)))


def _echo(channel, payload: bytes, timeout_s: float = 5.0) -> bytes:
    return channel.unary_unary(f"/{ECHO_SERVICE}/Echo")(payload, timeout=timeout_s)


def _list_services(channel) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    return [s.name for r in responses for s in r.list_services_response.service]


def test_health_serving_then_not_serving_on_stop():
    thread = ServerThread([_echo_spec()])
    server = thread.start()
    assert check_health(server.address) == "SERVING"
    assert check_health(server.address, ECHO_SERVICE) == "SERVING"
    assert check_health(server.address, "no.such.Service") == "SERVICE_UNKNOWN"
    channel = make_channel(server.address)
    stub = health_pb2_grpc.HealthStub(channel)
    watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    thread.stop(grace_s=1.0)
    # The watcher sees the NOT_SERVING flip before the server goes away.
    assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
    channel.close()
    assert check_health(server.address, timeout_s=1.0).startswith("UNREACHABLE")


def test_reflection_lists_services():
    with serve_in_thread([_echo_spec()]) as server:
        channel = make_channel(server.address)
        names = _list_services(channel)
        channel.close()
    assert ECHO_SERVICE in names
    assert "grpc.health.v1.Health" in names
    assert "grpc.reflection.v1alpha.ServerReflection" in names


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("NotFoundError", grpc.StatusCode.NOT_FOUND),
        ("InvalidArgumentError", grpc.StatusCode.INVALID_ARGUMENT),
        ("ResourceExhaustedError", grpc.StatusCode.RESOURCE_EXHAUSTED),
        ("FailedPreconditionError", grpc.StatusCode.FAILED_PRECONDITION),
        ("AbortedError", grpc.StatusCode.ABORTED),
    ],
)
def test_domain_errors_map_to_status_codes_and_back(name, code):
    with serve_in_thread([_echo_spec()]) as server:
        channel = make_channel(server.address)
        with pytest.raises(grpc.RpcError) as info:
            _echo(channel, f"raise:{name}".encode())
        channel.close()
    assert info.value.code() == code
    assert "bad value 'x' broke limit 7" in info.value.details()
    assert type(from_rpc_error(info.value)).__name__ == name


def test_unexpected_exception_is_internal_and_server_keeps_serving():
    with serve_in_thread([_echo_spec()]) as server:
        channel = make_channel(server.address)
        with pytest.raises(grpc.RpcError) as info:
            _echo(channel, b"crash")
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert _echo(channel, b"still here") == b"still here"
        channel.close()


def test_error_inside_server_stream_maps_code():
    with serve_in_thread([_echo_spec()]) as server:
        channel = make_channel(server.address)
        call = channel.unary_stream(f"/{ECHO_SERVICE}/Count")(b"2", timeout=5)
        got = []
        with pytest.raises(grpc.RpcError) as info:
            for item in call:
                got.append(item)
        channel.close()
    assert got == [b"0"]
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_auth_rejects_missing_and_wrong_token_on_unary_and_stream():
    settings = ServerSettings(token="s3cret")
    with serve_in_thread([_echo_spec()], settings) as server:
        bare = make_channel(server.address)
        wrong = make_channel(server.address, token="nope")
        right = make_channel(server.address, token="s3cret")
        for channel, expected in ((bare, "missing"), (wrong, "invalid")):
            with pytest.raises(grpc.RpcError) as info:
                _echo(channel, b"hi")
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert expected in info.value.details()
            with pytest.raises(grpc.RpcError) as info:
                list(channel.unary_stream(f"/{ECHO_SERVICE}/Count")(b"3", timeout=5))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as info:
                _list_services(channel)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert _echo(right, b"hi") == b"hi"
        assert list(right.unary_stream(f"/{ECHO_SERVICE}/Count")(b"3", timeout=5)) == [b"0", b"1", b"2"]
        # Health stays open for probes.
        assert check_health(server.address) == "SERVING"
        for c in (bare, wrong, right):
            c.close()


def test_oversized_message_is_resource_exhausted_naming_limit():
    limit = 64 * 1024
    with serve_in_thread([_echo_spec()], ServerSettings(max_message_bytes=limit)) as server:
        channel = make_channel(server.address)  # client allows 64 MiB, server only 64 KiB
        assert _echo(channel, b"x" * (limit - 100)) == b"x" * (limit - 100)
        with pytest.raises(grpc.RpcError) as info:
            _echo(channel, b"x" * (limit + 1))
        channel.close()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(limit) in info.value.details()


def test_deadline_exceeded_maps_to_domain_error():
    with serve_in_thread([]) as server:
        channel = make_channel(server.address)
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=0.3)
        with pytest.raises(grpc.RpcError) as info:
            list(watch)
        channel.close()
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert isinstance(from_rpc_error(info.value), errors.DeadlineExceededError)


def _make_certs(tmp: Path) -> dict[str, str]:
    """A self-signed CA, a server cert for localhost and a client cert, made with openssl."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=marti-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    )
    for name in ("server", "client"):
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
        )
        (tmp / f"{name}.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            f"{name}.pem",
            "-extfile",
            f"{name}.ext",
        )
    return {k: str(tmp / k) for k in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


def test_tls_and_mtls(tmp_path):
    certs = _make_certs(tmp_path)
    tls = ServerSettings(tls_cert_file=certs["server.pem"], tls_key_file=certs["server.key"])
    with serve_in_thread([_echo_spec()], tls) as server:
        address = f"localhost:{server.port}"
        secure = make_channel(address, tls_ca_file=certs["ca.pem"])
        assert _echo(secure, b"tls") == b"tls"
        plain = make_channel(address)
        with pytest.raises(grpc.RpcError) as info:
            _echo(plain, b"tls", timeout_s=2)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        secure.close()
        plain.close()
    mtls = tls.model_copy(update={"tls_client_ca_file": certs["ca.pem"]})
    with serve_in_thread([_echo_spec()], mtls) as server:
        address = f"localhost:{server.port}"
        with_cert = make_channel(
            address,
            tls_ca_file=certs["ca.pem"],
            tls_cert_file=certs["client.pem"],
            tls_key_file=certs["client.key"],
        )
        assert _echo(with_cert, b"mtls") == b"mtls"
        no_cert = make_channel(address, tls_ca_file=certs["ca.pem"])
        with pytest.raises(grpc.RpcError):
            _echo(no_cert, b"mtls", timeout_s=2)
        with_cert.close()
        no_cert.close()


def test_metrics_endpoint_counts_calls_and_access_log_has_request_id(caplog):
    import logging
    import urllib.request

    caplog.set_level(logging.INFO, logger="marti.access")
    with serve_in_thread([_echo_spec()], ServerSettings(metrics_port=0)) as server:
        assert server.metrics_port
        channel = make_channel(server.address)
        call = channel.unary_unary(f"/{ECHO_SERVICE}/Echo")
        call(b"hi", timeout=5, metadata=(("x-request-id", "req-42"),))
        with pytest.raises(grpc.RpcError):
            call(b"raise:NotFoundError", timeout=5)
        channel.close()
        body = (
            urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5)
            .read()
            .decode()
        )
    assert f'marti_rpc_total{{code="OK",method="Echo",service="{ECHO_SERVICE}"}}' in body
    assert f'marti_rpc_total{{code="NOT_FOUND",method="Echo",service="{ECHO_SERVICE}"}}' in body
    assert "marti_rpc_latency_seconds_bucket" in body
    assert any("request_id=req-42" in r.getMessage() for r in caplog.records)


def test_undecodable_request_is_invalid_argument_and_long_messages_are_cut():
    from marti.api.trainer.v1 import trainer_service_pb2, trainer_service_pb2_grpc
    from services.trainer.job.connections.addresses import Addresses
    from services.trainer.job.service.jobs import JobManager
    from services.trainer.job.service.servicer import TrainerServicer

    servicer = TrainerServicer(JobManager(Addresses("", "", "")))
    spec = ServiceSpec(
        "marti.api.trainer.v1.TrainerService",
        lambda s: trainer_service_pb2_grpc.add_TrainerServiceServicer_to_server(servicer, s),
    )
    with serve_in_thread([spec]) as server:
        channel = make_channel(server.address)
        raw = channel.unary_unary("/marti.api.trainer.v1.TrainerService/GetJob")
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\xff\xff\xff\xff", timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a valid GetJobRequest" in info.value.details()
        stub = trainer_service_pb2_grpc.TrainerServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.GetJob(trainer_service_pb2.GetJobRequest(job_id="x" * 200_000), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert len(info.value.details()) <= 1024 and info.value.details().endswith("(truncated)")
        channel.close()
