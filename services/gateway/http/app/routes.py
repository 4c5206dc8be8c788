"""The routes of the gateway's HTTP app (see :mod:`services.gateway.http` for what each one does): the inference
routes, also served under the traced prefixes ``/episodes/{episode_id}[/groups/{group_id}]``, the reward route
(and its traced forms) and the stats."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from marti.errors import NotFoundError
from services.gateway.core.gateway import Gateway, ModelCard
from services.gateway.http.anthropic import serving as anthropic_serving
from services.gateway.http.anthropic.protocol import MessagesRequest
from services.gateway.http.app.json_body import FiniteJSONRoute
from services.gateway.http.app.reward import RewardRequest, report, report_under_prefix
from services.gateway.http.common.context import check_path
from services.gateway.http.completions import serving as completions_serving
from services.gateway.http.completions.protocol import ChatCompletionRequest, CompletionRequest
from services.gateway.http.responses import serving as responses_serving
from services.gateway.http.responses.protocol import ResponsesRequest
from services.gateway.http.responses.store import ResponseStore

#: The prefixes a client's ``base_url`` may carry to trace its inference calls.
TRACED_PREFIXES = ("/episodes/{episode_id}", "/episodes/{episode_id}/groups/{group_id}")


def model_object(card: ModelCard, created: int) -> dict[str, Any]:
    """OpenAI's Model object of a model card, with the ``agent`` and ``policy_version`` extensions."""
    return {
        "id": card.id,
        "object": "model",
        "created": created,
        "owned_by": "marti",
        "agent": card.agent,
        "policy_version": card.version,
    }


def inference_router(gateway: Gateway) -> APIRouter:
    """The model and completion routes over ``gateway`` (served bare and under each traced prefix)."""
    created = int(time.time())
    api = APIRouter(route_class=FiniteJSONRoute)
    stored = ResponseStore(gateway.tracker.on_close, gateway.limits.max_stored_responses)

    @api.get("/v1/models")
    async def list_models() -> JSONResponse:
        """Every servable model name with its agent and policy version."""
        return JSONResponse({"object": "list", "data": [model_object(m, created) for m in gateway.models()]})

    @api.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> JSONResponse:
        """One servable model name (OpenAI's Model object, as in ``GET /v1/models``); 404 for a name that is
        not served now (an unknown agent, or a version that is not resident)."""
        check_path(request)
        for m in gateway.models():
            if m.id == model_id:
                return JSONResponse(model_object(m, created))
        gateway.resolve(model_id)  # raises NotFoundError naming what is served
        raise NotFoundError(f"model {model_id!r} does not exist")  # resolvable but not listed: not servable

    @api.post("/v1/chat/completions", response_model=None)
    async def chat_completions(
        body: ChatCompletionRequest, request: Request
    ) -> JSONResponse | StreamingResponse:
        """One chat completion request (``n`` choices), traced when it names an episode."""
        return await completions_serving.chat_completion(gateway, body, request)

    @api.post("/v1/completions", response_model=None)
    async def completions(body: CompletionRequest, request: Request) -> JSONResponse | StreamingResponse:
        """One text completion request (``n`` choices), traced when it names an episode."""
        return await completions_serving.completion(gateway, body, request)

    @api.post("/v1/responses", response_model=None)
    async def responses(body: ResponsesRequest, request: Request) -> JSONResponse | StreamingResponse:
        """OpenAI's Responses API: one response (``message`` and ``function_call`` output items), traced when it
        names an episode; stored for ``previous_response_id`` within its episode."""
        return await responses_serving.create_response(gateway, stored, body, request)

    @api.post("/v1/messages", response_model=None)
    async def messages(body: MessagesRequest, request: Request) -> JSONResponse | StreamingResponse:
        """Anthropic's Messages API: one assistant message (``text`` and ``tool_use`` blocks), traced when it
        names an episode; errors in Anthropic's shape."""
        return await anthropic_serving.messages(gateway, body, request)

    return api


def add_routes(app: FastAPI, gateway: Gateway) -> None:
    """Add every route of the gateway's HTTP adapter to ``app``, served by ``gateway``; each refuses a JSON body
    holding a non-finite number (:class:`FiniteJSONRoute`; ``app``'s router makes its later routes so too)."""
    app.router.route_class = FiniteJSONRoute
    api = inference_router(gateway)

    @app.post("/v1/episodes/{episode_id}/reward")
    async def report_reward(episode_id: str, body: RewardRequest, request: Request) -> JSONResponse:
        """End an episode with its rewards (or as failed); returns how many episodes were released and dropped.
        The ids follow the rules of calls (valid UTF-8, ``gateway.max_id_chars``, no ``/``)."""
        return await report(gateway, request, episode_id, body)

    @app.post("/episodes/{prefix_episode}/v1/episodes/{episode_id}/reward", include_in_schema=False)
    @app.post(
        "/episodes/{prefix_episode}/groups/{prefix_group}/v1/episodes/{episode_id}/reward",
        include_in_schema=False,
    )
    async def report_reward_under_prefix(
        prefix_episode: str, episode_id: str, body: RewardRequest, request: Request
    ) -> JSONResponse:
        """The reward route under a traced ``base_url`` (:func:`report_under_prefix`)."""
        return await report_under_prefix(gateway, request, prefix_episode, episode_id, body)

    @app.get("/v1/gateway/stats")
    async def stats() -> JSONResponse:
        """The gateway's counters (:meth:`Gateway.stats`)."""
        return JSONResponse(gateway.stats())

    app.include_router(api)
    for prefix in TRACED_PREFIXES:
        app.include_router(api, prefix=prefix, include_in_schema=False)
