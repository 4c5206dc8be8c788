"""The one place the gateway's HTTP adapter turns exceptions into OpenAI-style error responses.

Every error body has the shape of the OpenAI API::

    {"error": {"message": str, "type": str, "param": str | None, "code": str | None}}

``type`` is the OpenAI error type, ``param`` the request field at fault when one is known (``messages[0].content``,
``temperature``), and ``code`` the gRPC status name in lower case (the gRPC adapter reports the same status for
the same failure). A 400, 404 or 409 raised without a ``param`` gets the first of the app's request fields (body
fields, path ids, ``X-Marti-*`` headers; given to :func:`~services.gateway.http.app.install_error_handlers`) its
message names, so an error about a field never says ``param: null``. Unknown body keys of a model that forbids
them are named all at once, with the field each one most resembles. An unknown route's 404 lists the routes that exist.

=============================  ======  ============================  ======================
exception                      status  ``type``                      ``code``
=============================  ======  ============================  ======================
InvalidArgumentError           400     invalid_request_error         invalid_argument
OutOfRangeError                400     invalid_request_error         out_of_range
request validation (FastAPI)   400     invalid_request_error         invalid_argument
UnauthenticatedError           401     authentication_error          unauthenticated
PermissionDeniedError          403     permission_error              permission_denied
NotFoundError / no such route  404     not_found_error               not_found
FailedPreconditionError        409     conflict_error                failed_precondition
AlreadyExistsError             409     conflict_error                already_exists
AbortedError                   409     conflict_error                aborted
body over max_request_bytes    413     invalid_request_error         resource_exhausted
ResourceExhaustedError         429     rate_limit_error              resource_exhausted
CancelledError                 499     cancelled_error               cancelled
InternalError, anything else   500     server_error                  internal
UnavailableError               503     service_unavailable_error     unavailable
cancelled by the server        503     service_unavailable_error     unavailable
DeadlineExceededError          504     timeout_error                 deadline_exceeded
=============================  ======  ============================  ======================

**Anthropic's shape.** On the Anthropic Messages route (``/v1/messages`` and what is under it, also under the
traced prefixes; :func:`anthropic_route`) the same status comes with Anthropic's error body, so the ``anthropic``
client raises its typed error (``BadRequestError``, ``NotFoundError``, ...) with the gateway's message::

    {"type": "error", "error": {"type": str, "message": str, "param": str | None, "code": str | None}}

``type`` is the OpenAI type above where Anthropic has the same one, else ``api_error`` (500, 503, 499) or
``request_too_large`` (413); ``param`` and ``code`` are the gateway's, as above.

``FailedPreconditionError`` (a call or report for an episode that was already reported) is 409 Conflict: the
request is well formed but conflicts with the episode's state, and retrying it unchanged cannot succeed.
429 and 503 responses carry ``Retry-After: 1``. A 500 never shows the exception's text or traceback to the
client; it is logged here, once, with a reference id the response names. Unexpected exceptions are answered by
:class:`~services.gateway.http.app.middleware.CatchAllMiddleware` inside the app, so the connection stays usable for
the client's next request (Starlette's own last-resort handler re-raises, and the server then drops the connection). A request the server cancels before
it is answered (uvicorn does when its graceful-shutdown time is over) gets the 503 ``the gateway is shutting down``.
"""

from __future__ import annotations

import difflib
import logging
import re
import uuid
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from marti.errors import (
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    MartiError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)

_LOG = logging.getLogger("marti.gateway.http")

#: marti error class -> (HTTP status, OpenAI error type, code); looked up along the exception's MRO.
ERROR_TABLE: dict[type[MartiError], tuple[int, str, str]] = {
    InvalidArgumentError: (400, "invalid_request_error", "invalid_argument"),
    OutOfRangeError: (400, "invalid_request_error", "out_of_range"),
    UnauthenticatedError: (401, "authentication_error", "unauthenticated"),
    PermissionDeniedError: (403, "permission_error", "permission_denied"),
    NotFoundError: (404, "not_found_error", "not_found"),
    FailedPreconditionError: (409, "conflict_error", "failed_precondition"),
    AlreadyExistsError: (409, "conflict_error", "already_exists"),
    AbortedError: (409, "conflict_error", "aborted"),
    ResourceExhaustedError: (429, "rate_limit_error", "resource_exhausted"),
    CancelledError: (499, "cancelled_error", "cancelled"),
    UnavailableError: (503, "service_unavailable_error", "unavailable"),
    DeadlineExceededError: (504, "timeout_error", "deadline_exceeded"),
}
_INTERNAL = (500, "server_error", "internal")
_RETRY_AFTER = {429, 503}
#: Non-marti HTTP errors Starlette raises itself (unknown route, wrong method).
_HTTP_TYPES = {
    400: ("invalid_request_error", "invalid_argument"),
    404: ("not_found_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
}


def request_error(message: str, param: str | None = None) -> InvalidArgumentError:
    """An :class:`InvalidArgumentError` that names the request field at fault (reported as ``param``).

    Args:
        message: What is wrong, naming the value and the limit.
        param: The request field, e.g. ``"temperature"`` or ``"messages[0].content"``.
    """
    err = InvalidArgumentError(message)
    err.param = param  # type: ignore[attr-defined]
    return err


def _utf8(text: str | None) -> str | None:
    """``text`` with what UTF-8 cannot encode (lone surrogates) written as backslash escapes."""
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


#: The paths of the Anthropic Messages route (bare or under a traced prefix, and anything under it).
_ANTHROPIC_PATH = re.compile(r"/v1/messages(?:/|$)")
#: Error types of Anthropic's API that the gateway's OpenAI types map to (other types: by status).
_ANTHROPIC_TYPES = {
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "conflict_error",
    "rate_limit_error",
    "timeout_error",
}


def anthropic_route(path: str) -> bool:
    """Whether ``path`` (the request's path) is the Anthropic Messages route, whose errors have Anthropic's shape."""
    return _ANTHROPIC_PATH.search(path) is not None


def _anthropic_type(status: int, type_: str) -> str:
    """Anthropic's error type for an OpenAI-style ``type_`` of a ``status`` response."""
    if status == 413:
        return "request_too_large"
    return type_ if type_ in _ANTHROPIC_TYPES else ("api_error" if status >= 499 else "invalid_request_error")


def error_response(
    status: int,
    message: str,
    type_: str,
    param: str | None = None,
    code: str | None = None,
    *,
    path: str = "",
) -> JSONResponse:
    """An error response (see the module docstring for the body): OpenAI's shape, or Anthropic's when ``path``
    (the request's path) is the Anthropic Messages route; text that UTF-8 cannot encode (a lone surrogate the
    request sent) is written as its backslash escape."""
    headers = {"Retry-After": "1"} if status in _RETRY_AFTER else None
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer"}
    error = {"message": _utf8(message), "type": type_, "param": _utf8(param), "code": code}
    if anthropic_route(path):
        body = {"type": "error", "error": {**error, "type": _anthropic_type(status, type_)}}
    else:
        body = {"error": error}
    return JSONResponse(body, status_code=status, headers=headers)


#: Statuses whose error is about the request: their ``param`` is read from the message when not set.
_FIELD_STATUSES = {400, 404, 409}


def named_param(message: str, fields: Iterable[str]) -> str | None:
    """The request field ``message`` names first (as a whole word, with any ``[i]`` / ``.key`` after it:
    ``messages[0].content``), among ``fields``; None when it names none."""
    best: tuple[int, str] | None = None
    for name in fields:
        m = re.search(rf"(?<![\w.\-]){re.escape(name)}(?![\w\-])((?:\[\d+\])*(?:\.\w+)*)", message)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), name + m.group(1))
    return None if best is None else best[1]


def exception_response(exc: BaseException, fields: Iterable[str] = (), path: str = "") -> JSONResponse:
    """Map any exception to its response by the table in the module docstring (Anthropic's shape when ``path``,
    the request's path, is the Anthropic Messages route).

    A marti error's message goes to the client (a 400/404/409 without a ``param`` gets the first of ``fields``
    its message names); anything else is logged with its traceback and the client gets a generic 500 naming a
    reference id.
    """
    if isinstance(exc, MartiError):  # InternalError is not in the table: it is a bug, answered as one
        for cls in type(exc).__mro__:
            if cls in ERROR_TABLE:
                status, type_, code = ERROR_TABLE[cls]  # type: ignore[index]
                param = getattr(exc, "param", None)
                if param is None and status in _FIELD_STATUSES:
                    param = named_param(exc.message, fields)
                return error_response(status, exc.message, type_, param, code, path=path)
    ref = uuid.uuid4().hex[:12]
    _LOG.error("internal error serving an HTTP request (ref %s)", ref, exc_info=exc)
    status, type_, code = _INTERNAL
    return error_response(
        status, f"internal server error (ref {ref}; see the gateway's log)", type_, None, code, path=path
    )


def _param(loc: tuple[Any, ...]) -> str | None:
    """``("body", "messages", 0, "content")`` -> ``"messages[0].content"``; None for the body itself."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc)
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or None


def _unknown_key_hint(key: str, known: list[str], route: str) -> str:
    """``key`` (an unknown body key) quoted, with where it belongs when it is a path parameter of ``route`` (the
    route's path template) or else the other field of ``known`` it most resembles (never itself)."""
    name = key.rsplit(".", 1)[-1]
    if "{" + name + "}" in route:
        return f"{key!r} (it belongs in the path: {route})"
    close = difflib.get_close_matches(name, [k for k in known if k != name], n=1)
    return f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key)


def _unknown_keys(errors: list[Any], fields: Iterable[str], path: str, route: str) -> JSONResponse | None:
    """400 naming every unknown key of a body that forbids them (with :func:`_unknown_key_hint`), or None when
    no error is about an unknown key."""
    unknown = [_param(tuple(e.get("loc", ()))) for e in errors if e.get("type") == "extra_forbidden"]
    unknown = [u for u in unknown if u]
    if not unknown:
        return None
    known = sorted(set(fields))
    hints = [_unknown_key_hint(key, known, route) for key in unknown]
    msg = f"unknown field{'s' if len(unknown) > 1 else ''} in the request body: {', '.join(hints)}"
    return error_response(400, msg, "invalid_request_error", unknown[0], "invalid_argument", path=path)


def validation_response(
    exc: RequestValidationError, fields: Iterable[str] = (), path: str = "", route: str = ""
) -> JSONResponse:
    """400 for a request FastAPI could not parse or validate, naming the first bad field and its value (every
    unknown key at once, when the body forbids them; ``fields`` give the did-you-mean hints, and a key that is
    a path parameter of ``route``, the matched route's path template, is said to belong in the path); Anthropic's
    shape when ``path``, the request's path, is the Anthropic Messages route. A validator that raises a
    ``PydanticCustomError`` whose context has ``param_suffix`` names a part of its field (``messages[0].content``
    + ``[1].text``)."""
    errors = list(exc.errors())
    if not errors:
        return error_response(
            400, "invalid request", "invalid_request_error", None, "invalid_argument", path=path
        )
    unknown = _unknown_keys(errors, fields, path, route)
    if unknown is not None:
        return unknown
    err = errors[0]
    kind, loc = err.get("type", ""), tuple(err.get("loc", ()))
    if kind == "json_invalid":
        reason = (err.get("ctx") or {}).get("error", "malformed JSON")
        where = f" at character {loc[1]}" if len(loc) > 1 else ""
        msg = f"the request body is not valid JSON: {reason}{where}"
        return error_response(400, msg, "invalid_request_error", None, "invalid_argument", path=path)
    param = _param(loc)
    suffix = (err.get("ctx") or {}).get("param_suffix")  # a validator naming a part of its field: "[1].text"
    if param and isinstance(suffix, str):
        param += suffix
    text = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "missing":
        msg = f"{param} is required" if param else "the request body is required (a JSON object)"
    else:
        got = repr(err.get("input"))
        got = got if len(got) <= 120 else got[:117] + "..."
        msg = f"{param}: {text} (got {got})" if param else f"the request body: {text} (got {got})"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return error_response(400, msg + more, "invalid_request_error", param, "invalid_argument", path=path)


def _routes(app: Any) -> list[str]:
    """``"METHOD /path"`` of every documented route of ``app`` (the paths of its OpenAPI schema, which FastAPI
    builds once and keeps)."""
    paths = app.openapi().get("paths", {})
    return [f"{m.upper()} {path}" for path, ops in paths.items() for m in ops]


def _no_route(request: Request, status: int) -> str:
    """The message of a 404 / 405 for a route the app does not have: what exists instead."""
    path = request.url.path
    known = "; ".join(_routes(request.app))
    if status == 405:
        return f"{request.method} is not allowed on {path}; the routes are: {known}"
    return (
        f"no route {request.method} {path}; the routes are: {known}. The inference routes are also served under "
        "/episodes/{episode_id}/ and /episodes/{episode_id}/groups/{group_id}/ (a traced base_url), and so is "
        "POST /v1/episodes/{episode_id}/reward"
    )


#: An id segment of a path (``/episodes/ID``, ``/groups/ID``, ``/v1/episodes/ID/reward``) holding an encoded ``/``.
_SLASH_ID = re.compile(r"/(episodes|groups)/([^/]*%2[fF][^/]*)(?:/|$)")


def _slash_in_id(request: Request) -> JSONResponse | None:
    """The 400 for a path whose episode or group id holds a percent-encoded ``/`` (the server decodes it, so the
    path matches no route), naming the id; None for any other path."""
    raw = request.scope.get("raw_path")
    m = _SLASH_ID.search(raw.decode("latin-1")) if isinstance(raw, bytes) else None
    if m is None:
        return None
    param = "episode_id" if m.group(1) == "episodes" else "group_id"
    msg = (
        f"{param} {unquote(m.group(2))!r} contains '/', which ids may not contain (even percent-encoded as %2F: "
        "it would split the path)"
    )
    return error_response(400, msg, "invalid_request_error", param, "invalid_argument", path=request.url.path)


def http_error_response(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """The answer to an HTTP error Starlette raised itself (OpenAI's shape, or Anthropic's on the Messages route);
    a route that does not exist (404) or a method it does not take (405) gets a message listing the routes that
    exist, unless its path has an episode or group id holding a percent-encoded ``/`` (400 naming the id)."""
    type_, code = _HTTP_TYPES.get(exc.status_code, ("invalid_request_error", None))
    detail = str(exc.detail)
    if exc.status_code in (404, 405) and detail in ("Not Found", "Method Not Allowed"):  # no such route
        bad_id = _slash_in_id(request)
        if bad_id is not None:
            return bad_id
        detail = _no_route(request, exc.status_code)
    return error_response(exc.status_code, detail, type_, None, code, path=request.scope["path"])
