"""The one table that maps marti domain errors to gRPC status codes, and back.

Servers never build status codes by hand: a servicer raises a :class:`marti.errors.MartiError` subclass and
the error interceptor (:mod:`marti.rpc.interceptors`) aborts the call with the code from :data:`ERROR_CODES`
and a ``google.rpc.Status`` detail. Clients call :func:`from_rpc_error` to get the same class back.
"""

from __future__ import annotations

import grpc
from google.rpc import code_pb2, status_pb2
from grpc_status import rpc_status

from marti import errors

#: Domain error class -> gRPC status code. The only place this mapping is written.
ERROR_CODES: dict[type[errors.MartiError], grpc.StatusCode] = {
    errors.InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFoundError: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    errors.ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.FailedPreconditionError: grpc.StatusCode.FAILED_PRECONDITION,
    errors.OutOfRangeError: grpc.StatusCode.OUT_OF_RANGE,
    errors.DeadlineExceededError: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    errors.PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    errors.UnavailableError: grpc.StatusCode.UNAVAILABLE,
    errors.AbortedError: grpc.StatusCode.ABORTED,
    errors.CancelledError: grpc.StatusCode.CANCELLED,
    errors.InternalError: grpc.StatusCode.INTERNAL,
}

_CLASSES_BY_CODE: dict[grpc.StatusCode, type[errors.MartiError]] = {v: k for k, v in ERROR_CODES.items()}


def status_code_for(exc: BaseException) -> grpc.StatusCode:
    """Return the gRPC status code for an exception.

    Args:
        exc: Any exception. Subclasses of a mapped class take the code of the nearest mapped ancestor.

    Returns:
        The mapped code, or ``INTERNAL`` for anything that is not a :class:`MartiError`.
    """
    for cls in type(exc).__mro__:
        code = ERROR_CODES.get(cls)  # type: ignore[arg-type]
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


#: Longest error message sent to a client, characters (gRPC metadata must stay under its header limit).
MAX_MESSAGE_CHARS = 1024


def message_for(exc: BaseException) -> str:
    """Return the text sent to the client: the domain message, or a generic one for unexpected errors,
    cut to :data:`MAX_MESSAGE_CHARS` (a message quoting a huge bad value must not break the status header)."""
    text = (
        exc.message if isinstance(exc, errors.MartiError) else f"internal error: {type(exc).__name__}: {exc}"
    )
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[: MAX_MESSAGE_CHARS - 15] + "... (truncated)"
    return text


def to_status_proto(exc: BaseException) -> status_pb2.Status:
    """Build an in-band ``google.rpc.Status`` for an error (used on long-lived streams).

    Args:
        exc: The error to encode.

    Returns:
        A ``google.rpc.Status`` whose ``code`` is the numeric gRPC code and ``message`` names the problem.
    """
    code = status_code_for(exc)
    return status_pb2.Status(code=code.value[0], message=message_for(exc))


def ok_status() -> status_pb2.Status:
    """Return a ``google.rpc.Status`` meaning success (code OK, empty message)."""
    return status_pb2.Status(code=code_pb2.OK, message="")


def error_for_code(code: grpc.StatusCode, message: str) -> errors.MartiError:
    """Build the domain error for a status code and message.

    Args:
        code: A gRPC status code; codes with no domain class become :class:`marti.errors.InternalError`.
        message: The server's message.

    Returns:
        An instance of the mapped :class:`MartiError` subclass.
    """
    cls = _CLASSES_BY_CODE.get(code, errors.InternalError)
    if code == grpc.StatusCode.UNKNOWN:
        cls = errors.InternalError
    return cls(message)


def from_status_proto(status: status_pb2.Status) -> errors.MartiError | None:
    """Turn an in-band ``google.rpc.Status`` back into a domain error.

    Args:
        status: The status carried inside a stream response.

    Returns:
        ``None`` when ``status.code`` is OK (0), else the mapped :class:`MartiError`.
    """
    if status.code == code_pb2.OK:
        return None
    code = next((c for c in grpc.StatusCode if c.value[0] == status.code), grpc.StatusCode.UNKNOWN)
    return error_for_code(code, status.message)


def from_rpc_error(err: grpc.RpcError) -> errors.MartiError:
    """Turn a ``grpc.RpcError`` raised by a stub into the domain error the server raised.

    Args:
        err: The error from a sync or aio call.

    Returns:
        The mapped :class:`MartiError`; transport failures become :class:`UnavailableError`, expired
        deadlines :class:`DeadlineExceededError`.
    """
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return error_for_code(code, details or code.name)


def abort_status(exc: BaseException) -> grpc.Status:
    """Build the rich ``grpc.Status`` used to abort a call for ``exc`` (with a ``google.rpc.Status`` detail)."""
    return rpc_status.to_status(to_status_proto(exc))
