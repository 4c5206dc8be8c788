"""Given only an address (and the token), a generic gRPC client discovers every marti service through server
reflection, describes every method and message, and calls methods with messages built from the reflected
descriptors alone, as grpcurl and other generic tools do. Nothing here uses the generated marti code except
the final cross-check against it."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from marti.rpc.settings import ServerSettings
from marti.rpc.testing import serve_in_thread
from services.comm_broker.servicer import broker_service
from services.comm_broker.settings import BrokerSettings
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings
from services.experience_store.__main__ import make_spec
from services.experience_store.settings import StoreSettings

TOKEN = "reflection-token"
MARTI_SERVICES = {
    "marti.api.broker.v1.BrokerService",
    "marti.api.env.v1.EnvService",
    "marti.api.experience.v1.ExperienceService",
}


@pytest.fixture(scope="module")
def address():
    """One server hosting broker, env server and store (plus health and reflection), token required."""

    def specs():
        return [
            broker_service(BrokerSettings(port=0)),
            env_service(EnvServerSettings(port=0)),
            make_spec(StoreSettings(port=0))[0],
        ]

    with serve_in_thread(specs, ServerSettings(port=0, token=TOKEN)) as server:
        yield server.address


class ReflectionClient:
    """A generic client: lists services and loads their descriptors into a fresh pool via reflection.

    Args:
        address: ``host:port``.
        token: Bearer token sent as ``authorization`` metadata.
    """

    def __init__(self, address: str, token: str | None) -> None:
        self.channel = grpc.insecure_channel(address)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.stub = reflection_pb2_grpc.ServerReflectionStub(self.channel)
        self.pool = descriptor_pool.DescriptorPool()
        self._protos: dict[str, descriptor_pb2.FileDescriptorProto] = {}
        self._added: set[str] = set()

    def _ask(self, **kw: Any) -> reflection_pb2.ServerReflectionResponse:
        req = reflection_pb2.ServerReflectionRequest(**kw)
        resp = next(iter(self.stub.ServerReflectionInfo(iter([req]), metadata=self.metadata, timeout=10)))
        if resp.HasField("error_response"):
            raise LookupError(f"{kw}: {resp.error_response.error_message}")
        return resp

    def list_services(self) -> list[str]:
        """Names of every service the server exposes."""
        return sorted(s.name for s in self._ask(list_services="").list_services_response.service)

    def _remember(self, resp: reflection_pb2.ServerReflectionResponse) -> None:
        for raw in resp.file_descriptor_response.file_descriptor_proto:
            fdp = descriptor_pb2.FileDescriptorProto.FromString(raw)
            self._protos.setdefault(fdp.name, fdp)

    def _add(self, name: str) -> None:
        if name in self._added:
            return
        if name not in self._protos:
            self._remember(self._ask(file_by_filename=name))
        fdp = self._protos[name]
        for dep in fdp.dependency:
            self._add(dep)
        self.pool.Add(fdp)
        self._added.add(name)

    def load_service(self, service: str):
        """Fetch the file defining ``service`` (and its imports) and return the service descriptor."""
        before = set(self._protos)
        self._remember(self._ask(file_containing_symbol=service))
        for name in sorted(set(self._protos) - before):
            self._add(name)
        return self.pool.FindServiceByName(service)

    def describe(self, service: str) -> dict[str, dict[str, Any]]:
        """Every method of ``service``: request/response types, streaming flags and request field names."""
        desc = self.load_service(service)
        out = {}
        for m in desc.methods:
            out[m.name] = {
                "request": m.input_type.full_name,
                "response": m.output_type.full_name,
                "client_streaming": m.client_streaming,
                "server_streaming": m.server_streaming,
                "request_fields": [f.name for f in m.input_type.fields],
                "response_fields": [f.name for f in m.output_type.fields],
            }
        return out

    def call_unary(self, service: str, method: str, fields: dict[str, Any] | None = None):
        """Call a unary method with a request built from the reflected descriptor; returns the response."""
        m = self.pool.FindServiceByName(service).methods_by_name[method]
        req_cls = message_factory.GetMessageClass(m.input_type)
        resp_cls = message_factory.GetMessageClass(m.output_type)
        call = self.channel.unary_unary(
            f"/{service}/{method}",
            request_serializer=req_cls.SerializeToString,
            response_deserializer=resp_cls.FromString,
        )
        return call(req_cls(**(fields or {})), metadata=self.metadata, timeout=10)


def test_lists_services_and_describes_every_method(address):
    client = ReflectionClient(address, TOKEN)
    services = client.list_services()
    assert MARTI_SERVICES <= set(services)
    assert "grpc.health.v1.Health" in services
    assert any(s.startswith("grpc.reflection.") for s in services)
    described = {s: client.describe(s) for s in services}

    env = described["marti.api.env.v1.EnvService"]
    assert env["Session"]["client_streaming"] and env["Session"]["server_streaming"]
    assert env["CreateSession"]["request"] == "marti.api.env.v1.CreateSessionRequest"
    assert {"env_id", "config", "seed", "request_id"} <= set(env["CreateSession"]["request_fields"])
    store = described["marti.api.experience.v1.ExperienceService"]
    assert (
        store["GetAllExperiences"]["server_streaming"] and not store["GetAllExperiences"]["client_streaming"]
    )
    broker = described["marti.api.broker.v1.BrokerService"]
    assert broker["Subscribe"]["server_streaming"] and broker["Send"]["response_fields"][0] == "accepted"

    # every nested message type reachable from a method resolves in the reflected pool (imports included)
    seen: set[str] = set()

    def walk(desc) -> None:
        if desc.full_name in seen:
            return
        seen.add(desc.full_name)
        for f in desc.fields:
            if f.message_type is not None:
                walk(f.message_type)

    for name in MARTI_SERVICES:
        for m in client.pool.FindServiceByName(name).methods:
            walk(m.input_type)
            walk(m.output_type)
    assert "google.rpc.Status" in seen and "marti.api.common.v1.CompressedFrame" in seen
    assert "marti.api.experience.v1.Trajectory" in seen

    # the same methods and types as the generated code
    import marti.api.broker.v1.broker_service_pb2 as b
    import marti.api.env.v1.env_service_pb2 as e
    import marti.api.experience.v1.experience_service_pb2 as x

    for mod in (b, e, x):
        for sname, sdesc in mod.DESCRIPTOR.services_by_name.items():
            full = f"{mod.DESCRIPTOR.package}.{sname}"
            assert set(described[full]) == {m.name for m in sdesc.methods}, full
            for m in sdesc.methods:
                assert described[full][m.name]["request"] == m.input_type.full_name
                assert described[full][m.name]["response"] == m.output_type.full_name


def test_calls_methods_with_reflected_types_only(address):
    client = ReflectionClient(address, TOKEN)
    for name in MARTI_SERVICES:
        client.load_service(name)
    envs = client.call_unary("marti.api.env.v1.EnvService", "ListEnvs")
    assert "collaborative_task_solving-v1" in [d.env_id for d in envs.envs]
    created = client.call_unary(
        "marti.api.broker.v1.BrokerService", "CreateSession", {"session": "reflect", "agents": ["a", "b"]}
    )
    assert created.created and list(created.agents) == ["a", "b"]
    tables = client.call_unary("marti.api.experience.v1.ExperienceService", "ListTables")
    assert "default" in [t.name for t in tables.tables]
    with pytest.raises(grpc.RpcError) as err:
        client.call_unary("marti.api.env.v1.EnvService", "CreateSession", {"env_id": "no_such_env"})
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "no_such_env" in err.value.details()


def test_reflection_needs_the_token(address):
    with pytest.raises(grpc.RpcError) as err:
        ReflectionClient(address, None).list_services()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as err:
        ReflectionClient(address, "wrong").list_services()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
