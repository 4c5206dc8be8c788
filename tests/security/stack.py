"""All four services hosted by one real server, and a generic caller for any of their rpcs.

The generic caller drives any rpc of any service from its descriptor with raw bytes (identity serializers),
so a test can iterate over every method without knowing its request type.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import descriptor as _descriptor
from google.protobuf import message_factory

from marti.api.broker.v1 import broker_service_pb2
from marti.api.env.v1 import env_service_pb2
from marti.api.experience.v1 import experience_service_pb2
from marti.api.trainer.v1 import trainer_service_pb2
from marti.rpc.serving.server import ServiceSpec

#: Descriptors of every marti service (the suite iterates over all of their methods).
SERVICES: tuple[_descriptor.ServiceDescriptor, ...] = tuple(
    s
    for m in (broker_service_pb2, env_service_pb2, experience_service_pb2, trainer_service_pb2)
    for s in m.DESCRIPTOR.services_by_name.values()
)
#: Every (service, method) pair; ids like ``BrokerService/Send``.
METHODS = [(s, m) for s in SERVICES for m in s.methods]
METHOD_IDS = [f"{s.name}/{m.name}" for s, m in METHODS]


def all_specs(tmp_dir: str) -> list[ServiceSpec]:
    """Specs of broker, env server, store and trainer (store on SQLite under ``tmp_dir``).

    Args:
        tmp_dir: Folder for the store's data.

    Returns:
        The four service specs, ready for ``serve_in_thread``.
    """
    from services.comm_broker.servicer import broker_service
    from services.comm_broker.settings import BrokerSettings
    from services.env_server.servicer import env_service
    from services.env_server.settings import EnvServerSettings
    from services.experience_store.__main__ import make_spec
    from services.experience_store.settings import StoreSettings
    from services.trainer.__main__ import build_specs
    from services.trainer.job.service.settings import TrainerSettings

    store_spec, _ = make_spec(StoreSettings(port=0, data_dir=f"{tmp_dir}/store", default_timeout_ms=500))
    return [
        broker_service(BrokerSettings(port=0)),
        env_service(EnvServerSettings(port=0, reap_interval_s=0.5)),
        store_spec,
        *build_specs(TrainerSettings(port=0, stream_poll_s=0.1)),
    ]


def request_class(method: _descriptor.MethodDescriptor):
    """The generated request message class of ``method``."""
    return message_factory.GetMessageClass(method.input_type)


def call_raw(
    channel: grpc.Channel,
    service: _descriptor.ServiceDescriptor,
    method: _descriptor.MethodDescriptor,
    requests: Sequence[bytes],
    *,
    metadata: Sequence[tuple[str, str | bytes]] = (),
    timeout_s: float = 2.0,
    max_responses: int = 4,
) -> tuple[grpc.StatusCode, str]:
    """Call ``method`` with serialized requests and return the final status.

    Unary-request methods get ``requests[0]``; client-streaming ones get all of ``requests``. A server stream
    is read for at most ``max_responses`` messages, then cancelled (status OK: the stream was healthy).

    Returns:
        ``(status code, details)``.
    """
    path = f"/{service.full_name}/{method.name}"
    try:
        if not method.client_streaming and not method.server_streaming:
            channel.unary_unary(path)(requests[0], timeout=timeout_s, metadata=metadata)
            return grpc.StatusCode.OK, ""
        if method.client_streaming and not method.server_streaming:
            channel.stream_unary(path)(iter(requests), timeout=timeout_s, metadata=metadata)
            return grpc.StatusCode.OK, ""
        if method.server_streaming and not method.client_streaming:
            call = channel.unary_stream(path)(requests[0], timeout=timeout_s, metadata=metadata)
        else:
            call = channel.stream_stream(path)(iter(requests), timeout=timeout_s, metadata=metadata)
        for n, _ in enumerate(call, 1):
            if n >= max_responses:
                call.cancel()
                break
        return grpc.StatusCode.OK, ""
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.CANCELLED:
            return grpc.StatusCode.OK, ""
        return err.code(), err.details() or ""
