"""The JSON body parsing every route of the gateway's HTTP app shares: a body holding a non-finite number
(``NaN``, ``Infinity``, ``-Infinity``, ``1e999``; JSON has none, Python's parser accepts them) is refused with a
400 naming where it is (``tools[0].parameters.x``) before the route runs, so nothing is generated or recorded
for it, and no response ever has to write one."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from services.gateway.core.json_text import NonFiniteNumberError, loads_finite, non_finite_path
from services.gateway.http.common.errors import request_error


class FiniteJSONRequest(Request):
    """A request whose JSON body is read by :func:`~services.gateway.core.json_text.loads_finite` (once; FastAPI
    reads it through :meth:`json`)."""

    async def json(self) -> Any:
        """The body as JSON.

        Raises:
            json.JSONDecodeError: The body is not JSON.
            InvalidArgumentError: The body holds a non-finite number (``param``: where it is).
        """
        if not hasattr(self, "_finite_json"):
            body = await self.body()
            try:
                self._finite_json = loads_finite(body)
            except NonFiniteNumberError as exc:
                where = non_finite_path(json.loads(body))
                raise request_error(
                    f"{where or 'the request body'}: {exc.token} is not a finite number; JSON has no NaN or "
                    "Infinity (send a finite number, or null)",
                    where or None,
                ) from None
        return self._finite_json


class FiniteJSONRoute(APIRoute):
    """A route that reads its body as a :class:`FiniteJSONRequest` and refuses a non-finite number in it
    (400 naming where) before FastAPI validates the body; a body that is not JSON is left to FastAPI's own
    answer (400 ``not valid JSON``)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler of this route, given the request as a :class:`FiniteJSONRequest` read first."""
        handler = super().get_route_handler()

        async def finite_json_handler(request: Request) -> Response:
            request = FiniteJSONRequest(request.scope, request.receive)
            if await request.body():
                try:
                    await request.json()
                except json.JSONDecodeError:
                    pass  # FastAPI reads it again and answers its own 400
            return await handler(request)

        return finite_json_handler
