"""The ASGI middleware of the gateway's HTTP app: bearer authentication (and Anthropic's ``x-api-key`` on the
Messages route), the request body limit, and the catch-all that answers any exception with its error response (see
:mod:`services.gateway.http.common.errors`)."""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any

from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.http.common.errors import anthropic_route, error_response, exception_response

_LOG = logging.getLogger("marti.gateway.http")


class BearerAuth:
    """ASGI middleware: 401 unless ``Authorization: Bearer <token>`` matches (constant-time comparison); on the
    Anthropic Messages route ``x-api-key: <token>`` (what the ``anthropic`` client sends as its ``api_key``) is
    accepted as well."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    def _allowed(self, headers: dict[bytes, bytes], anthropic: bool) -> bool:
        """Whether the request's ``headers`` carry the token (``x-api-key`` counts only when ``anthropic``)."""
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token):
            return True
        return anthropic and hmac.compare_digest(headers.get(b"x-api-key", b"").strip(), self.token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            anthropic = anthropic_route(path)
            if not self._allowed(dict(scope["headers"]), anthropic):
                how = "'x-api-key: <token>' or " if anthropic else ""
                msg = f"missing or wrong API key: send {how}'Authorization: Bearer <token>' (the client's api_key)"
                response = error_response(
                    401, msg, "authentication_error", None, "unauthenticated", path=path
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware: 413 for a request body over ``max_bytes`` (by ``Content-Length``, or by counting what
    arrives), before the app parses it; a body within the limit is read here and handed on whole."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _refuse(self, size: str, path: str) -> Any:
        msg = (
            f"the request body has {size} bytes, more than the limit of {self.max_bytes} bytes "
            "(gateway.max_request_bytes)"
        )
        return error_response(413, msg, "invalid_request_error", None, "resource_exhausted", path=path)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.strip().isdigit() and int(length) > self.max_bytes:
            await self._refuse(str(int(length)), scope["path"])(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(f"at least {size}", scope["path"])(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: Message | None = {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        async def replay() -> Message:
            nonlocal body
            if body is not None:
                message, body = body, None
                return message
            return await receive()

        await self.app(scope, replay, send)


class CatchAllMiddleware:
    """ASGI middleware that answers any exception a request raises with its error response (OpenAI's shape, or
    Anthropic's on the Messages route).

    Unlike Starlette's catch-all handler it does not re-raise, so the server keeps the connection (keep-alive)
    and logs nothing more: an unexpected exception is logged once, by :func:`exception_response`. A request
    cancelled before its response started (the server's graceful-shutdown time ran out) is answered 503
    ``unavailable``. An exception after the response started is re-raised (the server ends the connection, the
    only way left to tell the client the response is incomplete).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except asyncio.CancelledError:
            if started:
                raise
            msg = "the gateway is shutting down: the request was cancelled before it was answered; retry it"
            response = error_response(
                503, msg, "service_unavailable_error", None, "unavailable", path=scope["path"]
            )
            await _send_quietly(response, scope, receive, send)
        except Exception as exc:  # noqa: BLE001 - every error becomes its response
            if started:
                raise
            await _send_quietly(exception_response(exc, path=scope["path"]), scope, receive, send)


async def _send_quietly(response: JSONResponse, scope: Scope, receive: Receive, send: Send) -> None:
    """Send ``response``; a client that is gone already is not an error."""
    try:
        await response(scope, receive, send)
    except Exception as exc:  # noqa: BLE001 - nothing more can be told to the client
        _LOG.debug("could not send the error response: %s", exc)
