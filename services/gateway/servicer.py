"""gRPC adapter of the inference gateway: ``marti.api.inference.v1.InferenceService`` over :class:`Gateway`.

Every rpc validates its request (:mod:`services.gateway.convert`), calls the gateway and converts the result; it
raises :mod:`marti.errors` types only, which the shared server interceptor maps to status codes. Episode and group
ids go to the gateway unchanged, so its rules for them (``gateway.max_id_chars``, no ``/``) hold for both
protocols. A request message larger than ``gateway.max_request_bytes`` is refused with RESOURCE_EXHAUSTED by the
rpc (a message over the server's own limit, 64 MiB by default, never gets that far: the transport refuses it with
the same status). The servicer is a ``grpc.aio`` servicer, so it must run on the event loop the gateway serves on
(its batcher and sweeper live there).

Hosting it:

* gRPC only: ``start_server([service_spec(gateway)], settings)`` (or ``run_server`` / ``serve_in_thread``); the
  spec starts and closes the gateway with the server.
* Next to other services on one ``grpc.aio`` server whose owner starts and closes the gateway itself (the HTTP
  plus gRPC gateway server): ``service_spec(gateway, own_gateway=False)``, or call
  ``InferenceServicer(gateway).add_to_server(server)`` and register :data:`SERVICE_NAME` for health and
  reflection yourself.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import grpc
from google.protobuf.message import Message

from marti.api.inference.v1 import inference_pb2 as pb
from marti.api.inference.v1 import inference_service_pb2_grpc as sgrpc
from marti.errors import InvalidArgumentError, ResourceExhaustedError
from marti.rpc.serving.server import ServiceSpec
from marti.types.inference import ChatMessages
from services.gateway import convert
from services.gateway.core.gateway import Gateway, Served

SERVICE_NAME = "marti.api.inference.v1.InferenceService"

#: ``detokenize(agent, token_ids) -> text`` without special tokens; used to give each streamed token its text.
Detokenize = Callable[[str, list[int]], str]


def backend_detokenizer(gateway: Gateway) -> Detokenize:
    """The gateway backend's :meth:`~services.gateway.core.backend.InferenceBackend.decode` (text without special
    tokens)."""
    return gateway.backend.decode


class InferenceServicer(sgrpc.InferenceServiceServicer):
    """Serves a :class:`Gateway` as ``InferenceService`` (see the proto for each rpc's semantics and errors).

    Args:
        gateway: The gateway (its lifecycle belongs to whoever hosts it; see :func:`service_spec`).
        detokenize: Gives streamed tokens their text; default :func:`backend_detokenizer`. Without one each
            streamed completion's whole text arrives with its last token.
    """

    def __init__(self, gateway: Gateway, *, detokenize: Detokenize | None = None) -> None:
        self.gateway = gateway
        self.detokenize = detokenize if detokenize is not None else backend_detokenizer(gateway)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register this servicer on a ``grpc.aio`` server (before it starts)."""
        sgrpc.add_InferenceServiceServicer_to_server(self, server)

    def _check_size(self, request: Message) -> None:
        """ResourceExhaustedError for a request over ``gateway.max_request_bytes`` (the server's receive limit
        is larger: it also bounds responses)."""
        limit = self.gateway.limits.max_request_bytes
        size = request.ByteSize()
        if size > limit:
            raise ResourceExhaustedError(
                f"the request message has {size} bytes, more than the limit of {limit} bytes "
                "(gateway.max_request_bytes)"
            )

    async def _prompt_ids(self, agent: str, prompt: ChatMessages | str | list[int]) -> list[int]:
        try:  # tokenizing a long prompt takes a while: not on the event loop
            return await asyncio.to_thread(self.gateway.prompt_ids, agent, prompt)
        except Exception as exc:  # a chat template that refuses the conversation (jinja2's raise_exception)
            if type(exc).__module__.startswith("jinja2"):
                raise InvalidArgumentError(
                    f"the chat template of {agent!r} refused the messages: {exc}"
                ) from exc
            raise

    async def _serve(self, req: pb.GenerateRequest) -> Served:
        """Validate, resolve, tokenize, size ``max_tokens`` and generate. A traced call cancelled by its client
        (deadline, cancel: grpc.aio cancels this handler) before the answer is ready is not recorded;
        ``idempotency_key`` makes a retry get the first answer (:meth:`Gateway.generate`)."""
        self._check_size(req)
        args = convert.generate_args(req)
        agent, _ = self.gateway.resolve(args.model)
        ids = await self._prompt_ids(agent, args.prompt)
        sampling = args.sampling
        if args.max_tokens is None:
            limit = self.gateway.backend.max_model_len(agent)
            sampling = replace(sampling, max_new_tokens=convert.default_max_tokens(len(ids), limit))

        return await self.gateway.generate(
            args.model,
            ids,
            sampling,
            n=args.n,
            episode_id=args.episode_id,
            group_id=args.group_id,
            idempotency_key=args.idempotency_key,
        )

    async def Generate(self, request: pb.GenerateRequest, context) -> pb.GenerateResponse:  # noqa: N802
        """Serve ``n`` completions of one prompt."""
        return convert.generate_response(await self._serve(request))

    def _pieces(self, served: Served) -> list[list[str]]:
        decode = None
        if self.detokenize is not None:
            detok, agent = self.detokenize, served.agent

            def decode(ids: list[int]) -> str:
                return detok(agent, ids)

        return [convert.token_texts(g.response_token_ids, g.text, decode) for g in served.generations]

    async def GenerateStream(  # noqa: N802
        self, request: pb.GenerateStreamRequest, context
    ) -> AsyncIterator[pb.GenerateStreamResponse]:
        """Serve like Generate, then stream the header, each token and each completion's end."""
        if not request.HasField("request"):
            raise InvalidArgumentError("request is required (the GenerateRequest to stream)")
        served = await self._serve(request.request)
        pieces = await asyncio.to_thread(self._pieces, served)
        for msg in convert.stream_responses(served, pieces):
            yield msg

    async def ListModels(self, request: pb.ListModelsRequest, context) -> pb.ListModelsResponse:  # noqa: N802
        """Every servable model name with its agent, version and context length."""
        backend = self.gateway.backend
        return pb.ListModelsResponse(
            models=[convert.model_info(c, backend.max_model_len(c.agent)) for c in self.gateway.models()]
        )

    async def ReportReward(  # noqa: N802
        self, request: pb.ReportRewardRequest, context
    ) -> pb.ReportRewardResponse:
        """End an episode and release what became final (``queued``: those not inserted yet; ``stale``: calls
        already past their agent's staleness bound; see :meth:`Gateway.report`)."""
        self._check_size(request)
        reported = await self.gateway.report(**convert.report_args(request))
        return convert.reported_to_proto(reported)

    async def GetStats(self, request: pb.GetStatsRequest, context) -> pb.GetStatsResponse:  # noqa: N802
        """The gateway's counters."""
        return pb.GetStatsResponse(counters=self.gateway.stats())


def add_to_server(gateway: Gateway, server: grpc.aio.Server, **kwargs) -> InferenceServicer:
    """Register an :class:`InferenceServicer` of ``gateway`` on ``server`` and return it.

    Args:
        gateway: The gateway to serve.
        server: A ``grpc.aio`` server that has not started.
        **kwargs: Passed to :class:`InferenceServicer` (``detokenize``).
    """
    servicer = InferenceServicer(gateway, **kwargs)
    servicer.add_to_server(server)
    return servicer


def service_spec(gateway: Gateway, *, own_gateway: bool = True, **kwargs) -> ServiceSpec:
    """The :class:`ServiceSpec` hosting ``gateway`` as ``InferenceService`` (for ``start_server`` and friends).

    Args:
        gateway: The gateway to serve (it is used on the server's event loop only).
        own_gateway: True: the server starts the gateway (its abandoned-episode sweeper) after it starts and
            closes it (queued requests fail) after it stops. False: the caller does both, e.g. a server that
            also serves the gateway over HTTP.
        **kwargs: Passed to :class:`InferenceServicer` (``detokenize``).
    """
    servicer = InferenceServicer(gateway, **kwargs)
    return ServiceSpec(
        name=SERVICE_NAME,
        add_to_server=servicer.add_to_server,
        on_start=gateway.start if own_gateway else None,
        on_stop=gateway.close if own_gateway else None,
    )
