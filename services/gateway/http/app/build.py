"""The FastAPI app of the gateway's HTTP adapter (vLLM's ``api_server.py``): its middleware, error handlers and
routes over one :class:`~services.gateway.core.gateway.Gateway` (what the app serves: the docstring of
:mod:`services.gateway.http`)."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from marti.errors import InvalidArgumentError, MartiError
from services.gateway.core.gateway import Gateway
from services.gateway.http.anthropic.protocol import MessagesRequest
from services.gateway.http.app.middleware import BearerAuth, BodyLimit, CatchAllMiddleware
from services.gateway.http.app.reward import RewardRequest
from services.gateway.http.app.routes import add_routes
from services.gateway.http.common.context import EPISODE_HEADER, GROUP_HEADER, IDEMPOTENCY_HEADER
from services.gateway.http.common.errors import exception_response, http_error_response, validation_response
from services.gateway.http.completions.protocol import ChatCompletionRequest, CompletionRequest
from services.gateway.http.responses.protocol import ResponsesRequest

__all__ = ["build_app", "install_error_handlers"]

#: Request fields an error message may name (``param``; see
#: :func:`~services.gateway.http.common.errors.named_param`): body fields, path ids and the episode headers; ``n`` and
#: ``failed`` are left out, as words of ordinary text, and ``function_call`` (chat's refused legacy field, which
#: names itself), as the Responses API's item type.
_FIELDS = tuple(
    name
    for name in dict.fromkeys(
        [
            *(
                n
                for m in (
                    ChatCompletionRequest,
                    CompletionRequest,
                    RewardRequest,
                    MessagesRequest,
                    ResponsesRequest,
                )
                for n in m.model_fields
            ),
            *("episode_id", "group_id", "idempotency_key", EPISODE_HEADER, GROUP_HEADER, IDEMPOTENCY_HEADER),
        ]
    )
    if name not in ("n", "failed", "function_call")
)


def build_app(gateway: Gateway, token: str | None = None) -> FastAPI:
    """Build the OpenAI-compatible HTTP app over ``gateway`` (routes and fields: :mod:`services.gateway.http`).

    Args:
        gateway: The gateway; the app does not start or close it (see :mod:`services.gateway.http`).
        token: When set, every route requires ``Authorization: Bearer <token>``; None = no authentication.

    Raises:
        InvalidArgumentError: ``token`` is an empty string (use None for no authentication).
    """
    if token is not None and not token:
        raise InvalidArgumentError("token must be a non-empty string, or None for no authentication")
    app = FastAPI(title="marti inference gateway", docs_url=None, redoc_url=None)
    # middleware added later runs first: errors (catch-all), then authentication, then the body size
    app.add_middleware(BodyLimit, max_bytes=gateway.limits.max_request_bytes)
    if token is not None:
        app.add_middleware(BearerAuth, token=token)
    install_error_handlers(app, _FIELDS)
    add_routes(app, gateway)
    return app


def install_error_handlers(app: FastAPI, fields: Iterable[str] = ()) -> None:
    """Make every error of ``app`` an OpenAI-style JSON response: the handlers of marti errors, validation and
    HTTP errors, and :class:`~services.gateway.http.app.middleware.CatchAllMiddleware` for anything else. Call it
    after adding the app's other middleware, so that the catch-all wraps them too.

    Args:
        app: The app.
        fields: Every request field, path parameter and header name of the app's routes: an error raised without
            a ``param`` gets the first one its message names, and unknown body keys get did-you-mean hints.
    """
    names = tuple(fields)

    async def on_marti(request: Request, exc: Exception) -> JSONResponse:
        return exception_response(exc, names, request.scope["path"])

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        route = getattr(request.scope.get("route"), "path", "")  # the matched route's template
        return validation_response(exc, names, request.scope["path"], route)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return http_error_response(request, exc)

    app.add_exception_handler(MartiError, on_marti)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    # The outermost middleware of the app's own (only Starlette's last-resort handler is outside it).
    app.add_middleware(CatchAllMiddleware)
