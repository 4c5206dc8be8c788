"""Real servers for SDK tests: broker, env server and store (plus an inference servicer, optionally an idle
trainer) hosted by one server on a free port (:func:`serve_sdk_services`), and :func:`once_reachable` to call a
server that is restarting.

Importable from any test as ``sdk_servers`` (``tests/`` is on ``sys.path``: pytest puts the directory of the
root ``tests/conftest.py`` there, as it does for ``security.stack`` and ``faults.procs``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import grpc

from marti.api.inference.v1 import inference_pb2 as ipb
from marti.api.inference.v1 import inference_service_pb2_grpc as igrpc
from marti.errors import UnavailableError
from marti.rpc.serving.server import ServiceSpec
from marti.rpc.settings import ServerSettings
from marti.rpc.testing import serve_in_thread

#: The inference service's full name.
INFERENCE = "marti.api.inference.v1.InferenceService"

T = TypeVar("T")


class ScriptedInference(igrpc.InferenceServiceServicer):
    """Answers ``Generate`` with the prompt's text reversed for model ``a1``; other models are unknown."""

    async def Generate(self, request, context):  # noqa: N802 - gRPC method name
        if request.model != "a1":
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown model {request.model!r}")
        if request.n > 8:  # the real gateway's max_n check
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"n is {request.n}, above max_n 8")
        return ipb.GenerateResponse(
            choices=[
                ipb.Choice(
                    call_id=f"c{i}",
                    text=request.text[::-1],
                    token_ids=[7, 8],
                    logprobs=[-0.5, -0.25],
                    finish_reason=ipb.FINISH_REASON_LENGTH,
                    policy_version=2,
                    index=i,
                )
                for i in range(request.n)
            ],
            prompt_token_ids=[1, 2, 3],
            agent="a1",
        )

    async def ListModels(self, request, context):  # noqa: N802 - gRPC method name
        return ipb.ListModelsResponse(
            models=[ipb.ModelInfo(id="a1", agent="a1", policy_version=2, pinned=False, max_model_len=64)]
        )


@contextmanager
def serve_sdk_services(
    data_dir: str | Path,
    token: str,
    inference: igrpc.InferenceServiceServicer,
    *,
    trainer: bool = False,
) -> Iterator[str]:
    """Host the broker, env server, store, ``inference`` and, if ``trainer``, an idle trainer on one server.

    Args:
        data_dir: The store's data directory.
        token: Token the server requires on every call.
        inference: Servicer of the inference service (a scripted one: no model is loaded).
        trainer: Also host the trainer service (no job running).

    Yields:
        The server's ``host:port``.
    """
    from services.comm_broker.servicer import broker_service
    from services.comm_broker.settings import BrokerSettings
    from services.env_server.servicer import env_service
    from services.env_server.settings import EnvServerSettings
    from services.experience_store.__main__ import make_spec
    from services.experience_store.settings import StoreSettings

    def specs() -> list[ServiceSpec]:
        store_spec, _ = make_spec(StoreSettings(port=0, data_dir=str(data_dir), default_timeout_ms=500))
        out = [
            broker_service(BrokerSettings(port=0)),
            env_service(EnvServerSettings(port=0)),
            store_spec,
            ServiceSpec(INFERENCE, lambda s: igrpc.add_InferenceServiceServicer_to_server(inference, s)),
        ]
        if trainer:
            from services.trainer.__main__ import build_specs
            from services.trainer.job.service.settings import TrainerSettings

            out += build_specs(TrainerSettings(port=0))
        return out

    with serve_in_thread(specs, ServerSettings(host="127.0.0.1", port=0, token=token)) as server:
        yield server.address


def once_reachable(fn: Callable[[], T], timeout_s: float = 20.0, interval_s: float = 0.1) -> T:
    """Call ``fn`` until it stops raising ``UnavailableError`` (the channel reconnecting to a restarted server);
    any other outcome, error or value, is returned or raised as is.

    Args:
        fn: The call to make.
        timeout_s: After this many seconds the last ``UnavailableError`` is raised.
        interval_s: Pause between tries, seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(interval_s)
