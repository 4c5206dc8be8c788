"""Domain errors shared by every marti service core and client.

This module imports nothing from grpc or protobuf: service cores raise these errors, the gRPC layer maps
each class to one status code in a single table (``marti.rpc.errors``), and clients turn status codes back
into the same classes, so callers catch the same exception whether they talk to a core in-process or to a
remote service.
"""

from __future__ import annotations


class MartiError(Exception):
    """Base class of every error marti raises on purpose.

    Args:
        message: Human-readable text that names the bad value and, where one applies, the limit it broke.
    """

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgumentError(MartiError, ValueError):
    """The caller sent a value that is malformed or out of the documented domain (gRPC INVALID_ARGUMENT)."""


class NotFoundError(MartiError, LookupError):
    """A named session, agent, table, env id, job or model does not exist (gRPC NOT_FOUND)."""


class AlreadyExistsError(MartiError):
    """Creating something whose name is taken (gRPC ALREADY_EXISTS)."""


class ResourceExhaustedError(MartiError):
    """A configured limit was reached: queue length, bytes, sessions, message size (gRPC RESOURCE_EXHAUSTED)."""


class FailedPreconditionError(MartiError):
    """The system is not in a state that allows the operation, e.g. step after episode end (FAILED_PRECONDITION)."""


class OutOfRangeError(MartiError):
    """A position or index beyond the valid range (gRPC OUT_OF_RANGE)."""


class DeadlineExceededError(MartiError, TimeoutError):
    """The caller's deadline passed before the operation could complete (gRPC DEADLINE_EXCEEDED)."""


class UnauthenticatedError(MartiError):
    """Missing or wrong credentials (gRPC UNAUTHENTICATED)."""


class PermissionDeniedError(MartiError):
    """Authenticated, but not allowed to touch this resource, e.g. another session's data (PERMISSION_DENIED)."""


class UnavailableError(MartiError, ConnectionError):
    """The service cannot be reached or is shutting down; safe to retry with backoff (gRPC UNAVAILABLE)."""


class AbortedError(MartiError):
    """A concurrency conflict such as a failed compare-and-set; retry at a higher level (gRPC ABORTED)."""


class CancelledError(MartiError):
    """The operation was cancelled by the caller (gRPC CANCELLED)."""


class InternalError(MartiError):
    """An invariant broke inside marti; a bug worth reporting (gRPC INTERNAL)."""


__all__ = [
    "AbortedError",
    "AlreadyExistsError",
    "CancelledError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "MartiError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
]
