"""The one table that maps marti domain errors to gRPC status codes, and back.

Servers never build status codes by hand: a servicer raises a :class:`marti.errors.MartiError` subclass and
the error interceptor (:mod:`marti.rpc.serving.interceptors`) aborts the call with the code from :data:`ERROR_CODES`
and a ``google.rpc.Status`` detail. Clients call :func:`from_rpc_error` to get the same class back.

Errors whose class sets :attr:`marti.errors.MartiError.reason` (e.g. :class:`marti.errors.SessionLostError`,
reason ``SESSION_LOST``) also carry a ``google.rpc.ErrorInfo`` in the status details (the gRPC rich error
model: trailer ``grpc-status-details-bin`` for a failed call, ``Status.details`` for an in-band status on a
stream). Clients pick the class from that detail's reason, never from the message text, so any service core
that raises such an error gets the typed error on the client with no per-service code.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from marti import errors

#: Trailing-metadata key of the serialized ``google.rpc.Status`` (the gRPC rich error model).
STATUS_DETAILS_KEY = "grpc-status-details-bin"

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
    errors.UnimplementedError: grpc.StatusCode.UNIMPLEMENTED,
    errors.InternalError: grpc.StatusCode.INTERNAL,
}

#: What gRPC itself answers for a method no handler serves (a server that is not a marti server, or an old one).
GRPC_METHOD_NOT_FOUND = "Method not found!"
#: What gRPC says when a message is over the receiver's limit, by the side that refused it; what the error adds to
#: say so and what a caller can set (a bare "Received message larger than max" named neither side nor the setting):
#: the experience-store clients take ``max_message_bytes=``, the others (env, broker, inference) the channel
#: arguments ``options=``.
GRPC_MESSAGE_TOO_LARGE = {
    "CLIENT: Received message larger than max": (
        "a response was larger than this client's receive limit (64 MiB by default); raise it up to the "
        "server's max_message_bytes: max_message_bytes=N of an experience-store client, "
        'options=[("grpc.max_receive_message_length", N)] of an env, broker or inference client'
    ),
    "SERVER: Received message larger than max": (
        "a request was larger than the server's max_message_bytes (64 MiB by default); send less per call, or "
        "give this client the server's limit so that it fits its requests to it: max_message_bytes=N of an "
        "experience-store client (it cuts them), "
        'options=[("grpc.max_send_message_length", N)] of an env client (its Session stream refuses a larger '
        "one before sending it)"
    ),
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


def error_info_for(exc: BaseException) -> error_details_pb2.ErrorInfo | None:
    """The ``google.rpc.ErrorInfo`` detail of an error, or ``None`` when its class has no reason.

    Args:
        exc: Any exception; only :class:`MartiError` subclasses with a non-empty ``reason`` get one.

    Returns:
        ``ErrorInfo(reason=cls.reason, domain=marti.errors.ERROR_DOMAIN, metadata=exc.metadata)`` or ``None``.
    """
    reason = getattr(type(exc), "reason", "") if isinstance(exc, errors.MartiError) else ""
    if not reason:
        return None
    metadata = getattr(exc, "metadata", None) or {}
    return error_details_pb2.ErrorInfo(reason=reason, domain=errors.ERROR_DOMAIN, metadata=metadata)


def to_status_proto(exc: BaseException) -> status_pb2.Status:
    """Build a ``google.rpc.Status`` for an error (in-band on long-lived streams, and the rich status of a
    failed call).

    Args:
        exc: The error to encode.

    Returns:
        A ``google.rpc.Status`` whose ``code`` is the numeric gRPC code and ``message`` names the problem;
        ``details`` holds a packed ``google.rpc.ErrorInfo`` when the error's class has a ``reason``.
    """
    code = status_code_for(exc)
    status = status_pb2.Status(code=code.value[0], message=message_for(exc))
    info = error_info_for(exc)
    if info is not None:
        status.details.add().Pack(info)
    return status


def ok_status() -> status_pb2.Status:
    """Return a ``google.rpc.Status`` meaning success (code OK, empty message)."""
    return status_pb2.Status(code=code_pb2.OK, message="")


def _reason_classes(root: type[errors.MartiError]) -> Iterable[type[errors.MartiError]]:
    for sub in root.__subclasses__():
        yield sub
        yield from _reason_classes(sub)


def class_for_reason(reason: str, code: grpc.StatusCode) -> type[errors.MartiError] | None:
    """The :class:`MartiError` subclass whose ``reason`` is ``reason`` and whose status code is ``code``.

    Every imported subclass takes part (a service may define its own), so the table needs no upkeep.

    Args:
        reason: ``ErrorInfo.reason`` from a status detail in the ``marti.ai`` domain.
        code: The call's status code; a reason only counts with its class's own code.

    Returns:
        The class, or ``None`` when no class with that reason and code is known here.
    """
    for cls in _reason_classes(errors.MartiError):
        if cls.__dict__.get("reason") == reason and ERROR_CODES.get(_mapped_base(cls)) == code:
            return cls
    return None


def _mapped_base(cls: type[errors.MartiError]) -> type[errors.MartiError]:
    for base in cls.__mro__:
        if base in ERROR_CODES:
            return base  # type: ignore[return-value]
    return errors.InternalError


def _error_info(details: Iterable[object]) -> error_details_pb2.ErrorInfo | None:
    """The first ``ErrorInfo`` of the ``marti.ai`` domain among packed ``google.protobuf.Any`` details."""
    for detail in details:
        if not detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):  # type: ignore[attr-defined]
            continue
        info = error_details_pb2.ErrorInfo()
        detail.Unpack(info)  # type: ignore[attr-defined]
        if info.domain == errors.ERROR_DOMAIN:
            return info
    return None


def error_for_code(code: grpc.StatusCode, message: str, details: Iterable[object] = ()) -> errors.MartiError:
    """Build the domain error for a status code, message and rich-status details.

    Args:
        code: A gRPC status code; codes with no domain class become :class:`marti.errors.InternalError`.
        message: The server's message.
        details: The ``google.rpc.Status.details`` (packed ``Any``); a ``marti.ai`` ``ErrorInfo`` among them
            selects the subclass with that reason (e.g. ``SESSION_LOST`` -> :class:`SessionLostError`) and
            fills its ``metadata``.

    Returns:
        An instance of the mapped :class:`MartiError` subclass.
    """
    cls = _CLASSES_BY_CODE.get(code, errors.InternalError)
    if code == grpc.StatusCode.UNKNOWN:
        cls = errors.InternalError
    if code == grpc.StatusCode.UNIMPLEMENTED and message == GRPC_METHOD_NOT_FOUND:
        message = (
            "the server at this address does not serve the method called (gRPC: Method not found!): "
            "probably a different service listens on that port"
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        message = next(
            (f"{message}: {why}" for said, why in GRPC_MESSAGE_TOO_LARGE.items() if said in message), message
        )
    info = _error_info(details)
    if info is None:
        return cls(message)
    cls = class_for_reason(info.reason, code) or cls
    err = cls.__new__(cls)
    errors.MartiError.__init__(err, message, metadata=dict(info.metadata))
    return err


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
    return error_for_code(code, status.message, status.details)


def _status_details(err: grpc.RpcError) -> Iterable[object]:
    """The ``google.rpc.Status.details`` a server attached to a failed call (empty when none or unreadable)."""
    trailing = getattr(err, "trailing_metadata", None)
    try:
        metadata = trailing() if callable(trailing) else ()
    except Exception:  # noqa: BLE001 - a call that never reached a server has no trailers
        return ()
    for key, value in metadata or ():
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
            try:
                return status_pb2.Status.FromString(value).details
            except Exception:  # noqa: BLE001 - a malformed trailer is ignored, the code still maps
                return ()
    return ()


def from_rpc_error(err: grpc.RpcError) -> errors.MartiError:
    """Turn a ``grpc.RpcError`` raised by a stub into the domain error the server raised.

    Args:
        err: The error from a sync or aio call.

    Returns:
        The mapped :class:`MartiError`; transport failures become :class:`UnavailableError`, expired
        deadlines :class:`DeadlineExceededError`; a ``marti.ai`` ``ErrorInfo`` in the rich status picks the
        subclass with that reason (:class:`SessionLostError` for ``SESSION_LOST``).
    """
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return error_for_code(code, details or code.name, _status_details(err))


def abort_status(exc: BaseException) -> grpc.Status:
    """Build the rich ``grpc.Status`` used to abort a call for ``exc`` (with a ``google.rpc.Status`` detail)."""
    return rpc_status.to_status(to_status_proto(exc))
