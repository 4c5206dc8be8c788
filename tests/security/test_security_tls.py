"""TLS and mutual TLS with a self-signed CA made by ``openssl``, over the real server bootstrap.

Certificates: a test CA signs the server certificate (SAN ``IP:127.0.0.1``, ``DNS:localhost``) and a client
certificate; a second, unrelated CA signs a rogue client certificate. Every check goes through
:func:`marti.rpc.client.channel.make_channel` and the SDK, as users would.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from marti.api.broker.v1 import broker_service_pb2 as bpb
from marti.api.broker.v1 import broker_service_pb2_grpc as bgrpc
from marti.rpc.client.channel import make_channel
from marti.rpc.settings import ServerSettings

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
TOKEN = "tls-token"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d)  # fmt: skip


def _leaf(d: Path, name: str, ca: str, san: str | None) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=d)  # fmt: skip
    ext = []
    if san:
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\n")
        ext = ["-extfile", f"{name}.ext"]
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "2", "-out", f"{name}.pem", *ext, cwd=d)  # fmt: skip


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """Folder with ca, server, client (signed by ca) and rogue-ca, rogue (signed by rogue-ca) PEM files."""
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "rogue-ca")
    _leaf(d, "server", "ca", "IP:127.0.0.1,DNS:localhost")
    _leaf(d, "client", "ca", None)
    _leaf(d, "rogue", "rogue-ca", None)
    return d


def _tls_settings(pki: Path, mtls: bool, token: str | None = None) -> ServerSettings:
    return ServerSettings(
        host="127.0.0.1",
        port=0,
        token=token,
        tls_cert_file=str(pki / "server.pem"),
        tls_key_file=str(pki / "server.key"),
        tls_client_ca_file=str(pki / "ca.pem") if mtls else None,
    )


def _session(channel: grpc.Channel, timeout_s: float = 3.0) -> grpc.StatusCode:
    try:
        bgrpc.BrokerServiceStub(channel).CreateSession(
            bpb.CreateSessionRequest(session="s"), timeout=timeout_s
        )
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        return err.code()


def test_tls_server_accepts_clients_that_trust_its_ca(stack_factory, pki):
    address = stack_factory(_tls_settings(pki, mtls=False, token=TOKEN))
    good = make_channel(address, tls_ca_file=str(pki / "ca.pem"), token=TOKEN)
    assert _session(good) == grpc.StatusCode.OK
    # TLS and the token are independent: the right CA without the token is still refused
    no_token = make_channel(address, tls_ca_file=str(pki / "ca.pem"))
    assert _session(no_token) == grpc.StatusCode.UNAUTHENTICATED
    # a client that trusts another CA cannot complete the handshake
    wrong_ca = make_channel(address, tls_ca_file=str(pki / "rogue-ca.pem"), token=TOKEN)
    assert _session(wrong_ca, 2) == grpc.StatusCode.UNAVAILABLE
    # a plaintext client cannot talk to a TLS port
    plain = grpc.insecure_channel(address)
    assert _session(plain, 2) == grpc.StatusCode.UNAVAILABLE
    health = health_pb2_grpc.HealthStub(good).Check(health_pb2.HealthCheckRequest(), timeout=3)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    for ch in (good, no_token, wrong_ca, plain):
        ch.close()


def test_mtls_requires_a_client_certificate_from_the_trusted_ca(stack_factory, pki):
    address = stack_factory(_tls_settings(pki, mtls=True))
    ca = str(pki / "ca.pem")
    good = make_channel(address, tls_ca_file=ca, tls_cert_file=str(pki / "client.pem"),
                        tls_key_file=str(pki / "client.key"))  # fmt: skip
    assert _session(good) == grpc.StatusCode.OK
    no_cert = make_channel(address, tls_ca_file=ca)
    assert _session(no_cert, 2) == grpc.StatusCode.UNAVAILABLE
    rogue = make_channel(address, tls_ca_file=ca, tls_cert_file=str(pki / "rogue.pem"),
                         tls_key_file=str(pki / "rogue.key"))  # fmt: skip
    assert _session(rogue, 2) == grpc.StatusCode.UNAVAILABLE
    for ch in (good, no_cert, rogue):
        ch.close()


async def test_mtls_aio_channel(stack_factory, pki):
    address = stack_factory(_tls_settings(pki, mtls=True))
    channel = make_channel(address, aio=True, tls_ca_file=str(pki / "ca.pem"),
                           tls_cert_file=str(pki / "client.pem"), tls_key_file=str(pki / "client.key"))  # fmt: skip
    resp = await bgrpc.BrokerServiceStub(channel).CreateSession(
        bpb.CreateSessionRequest(session="a"), timeout=3
    )
    assert resp.session == "a"
    await channel.close()


def test_tls_with_unreadable_key_file_is_a_named_error(pki, tmp_path):
    from marti.errors import InvalidArgumentError
    from marti.rpc.testing import ServerThread

    settings = ServerSettings(
        port=0, tls_cert_file=str(pki / "server.pem"), tls_key_file=str(tmp_path / "nope")
    )
    thread = ServerThread([], settings)
    with pytest.raises(InvalidArgumentError, match="nope"):
        thread.start()
    thread.stop()


def _tls_job(address: str, ca: str | None):
    """A TrainingLoop wired the way ``marti train`` wires it for a config naming TLS services."""
    import argparse

    from marti.config import config_from_dict
    from services.trainer.job.cli.train_cli import service_addresses
    from services.trainer.job.run.loop import TrainingLoop

    services = {"broker": address, "env": address, "store": address, "token": TOKEN, "tls_ca_file": ca}
    cfg = config_from_dict(
        {
            "training_name": "tls",
            "agents": [{"name": "a", "pretrain_model": "tiny-llama", "role": "executor"}],
            "services": services,
        }
    )
    args = argparse.Namespace(broker=None, env=None, store=None, token=None)
    with service_addresses(cfg, args) as addresses:  # every address given: nothing embedded is started
        return TrainingLoop(cfg, addresses, show_progress=False), addresses


def test_the_training_job_reaches_tls_services_with_services_tls_ca_file(stack_factory, pki):
    """``services.tls_ca_file`` is the CA of the job's env, broker and store channels; without it the job's
    plaintext channels cannot reach a TLS server."""
    from marti.errors import UnavailableError

    address = stack_factory(_tls_settings(pki, mtls=False, token=TOKEN))
    loop, _ = _tls_job(address, str(pki / "ca.pem"))
    try:
        env = loop._make_env(3)
        obs, _ = env.reset(seed=3)
        assert set(obs) == set(env.agents)
        env.close()
        comm = loop._comm("a", "tls-session")
        comm.send_message("a", {"text": "over tls"})
        comm.flush()
        assert [m.content["text"] for m in comm.get_messages()] == ["over tls"]
        comm.close()
        store = loop._store_client()
        assert isinstance(store.list_tables(), list)
        store.close()
    finally:
        loop.close_channels()
    plain, _ = _tls_job(address, None)
    try:
        with pytest.raises(UnavailableError):
            env = plain._make_env(3)
            env.reset(seed=3)
    finally:
        plain.close_channels()
