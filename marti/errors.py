"""Domain errors shared by every marti service core and client.

This module imports nothing from grpc or protobuf: service cores raise these errors, the gRPC layer maps
each class to one status code in a single table (``marti.rpc.errors``), and clients turn status codes back
into the same classes, so callers catch the same exception whether they talk to a core in-process or to a
remote service.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import ClassVar

#: Domain of the ``google.rpc.ErrorInfo`` details marti attaches to errors that carry a :attr:`MartiError.reason`.
ERROR_DOMAIN = "marti.ai"


class MartiError(Exception):
    """Base class of every error marti raises on purpose.

    A subclass that sets :attr:`reason` travels over gRPC as its class's status code plus a
    ``google.rpc.ErrorInfo`` detail (``reason``, ``domain`` :data:`ERROR_DOMAIN`, ``metadata``), and clients
    rebuild that exact subclass from the detail, never from the message text (see ``marti.rpc.errors``).

    Args:
        message: Human-readable text that names the bad value and, where one applies, the limit it broke.
        metadata: Machine-readable facts about the error (string to string), sent as ``ErrorInfo.metadata``
            by errors that have a :attr:`reason`.
    """

    #: Machine-readable reason (``UPPER_SNAKE_CASE``) sent as ``google.rpc.ErrorInfo.reason``; ``""`` = none.
    reason: ClassVar[str] = ""

    def __init__(self, message: str = "", *, metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.metadata: dict[str, str] = {str(k): str(v) for k, v in (metadata or {}).items()}

    def __reduce__(self) -> tuple:
        """Pickle with every attribute (``metadata`` and subclass fields), whatever the subclass's signature."""
        return _rebuild, (type(self), self.message), self.__dict__

    def __str__(self) -> str:
        return self.message


def with_context(exc: MartiError, context: str) -> MartiError:
    """A copy of ``exc`` (same class, same ``metadata`` and attributes) whose message starts with ``context``:
    ``"reward.model (--reward_model): " + exc.message``; raise it ``from exc``."""
    err = type(exc).__new__(type(exc))
    err.__dict__.update(exc.__dict__)
    err.message = f"{context}: {exc.message}"
    Exception.__init__(err, err.message)
    return err


@contextlib.contextmanager
def in_context(context: str) -> Iterator[None]:
    """A :class:`MartiError` raised inside is raised again (same class) with ``context`` first in its message
    (:func:`with_context`): ``with in_context("reward.model (--reward_model)"): load(path)``."""
    try:
        yield
    except MartiError as exc:
        raise with_context(exc, context) from exc


def _rebuild(cls: type[MartiError], message: str) -> MartiError:
    """Unpickle a :class:`MartiError` without calling its ``__init__`` (attributes come from the state)."""
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    return err


class InvalidArgumentError(MartiError, ValueError):
    """The caller sent a value that is malformed or out of the documented domain (gRPC INVALID_ARGUMENT)."""


class UnknownConfigKeyError(InvalidArgumentError):
    """An env config (or other schema-checked mapping) holds a key its schema does not know. gRPC INVALID_ARGUMENT
    with a ``google.rpc.ErrorInfo`` detail whose reason is ``UNKNOWN_CONFIG_KEY`` and ``metadata["config_key"]``
    the key, so a caller that added keys itself (the trainer adds the job's keys to every env's config) can tell
    which one, from a remote env server too.

    Args:
        message: The error (names the key and lists the known keys).
        key: The unknown key.
    """

    reason: ClassVar[str] = "UNKNOWN_CONFIG_KEY"

    def __init__(self, message: str = "", *, key: str = "") -> None:
        super().__init__(message, metadata={"config_key": key})


class NotFoundError(MartiError, LookupError):
    """A named session, agent, table, env id, job or model does not exist (gRPC NOT_FOUND)."""


class SessionLostError(NotFoundError):
    """The server no longer knows a session it handed out: closed, reaped when idle, or lost when the server
    restarted (sessions live in memory). gRPC NOT_FOUND with a ``google.rpc.ErrorInfo`` detail whose reason
    is ``SESSION_LOST`` (domain ``marti.ai``, ``metadata["session_id"]`` the lost id).

    A subclass of :class:`NotFoundError`, so handlers of that class still catch it. Retrying the same call
    cannot succeed; create a new session (an env from ``marti.make(address=...)``: call ``reset()``, which
    re-creates the session by itself).

    Args:
        message: What was lost and what to do.
        session_id: The lost session's id (also ``metadata["session_id"]``).
        metadata: Further ``ErrorInfo`` metadata.
    """

    reason: ClassVar[str] = "SESSION_LOST"

    def __init__(
        self, message: str = "", *, session_id: str = "", metadata: Mapping[str, str] | None = None
    ) -> None:
        merged = dict(metadata or {})
        if session_id:
            merged["session_id"] = session_id
        super().__init__(message, metadata=merged)

    @property
    def session_id(self) -> str:
        """The lost session's id (``""`` when the server did not say)."""
        return self.metadata.get("session_id", "")


class AlreadyExistsError(MartiError):
    """Creating something whose name is taken (gRPC ALREADY_EXISTS)."""


class ResourceExhaustedError(MartiError):
    """A configured limit was reached: queue length, bytes, sessions, message size (gRPC RESOURCE_EXHAUSTED)."""


class BatchTooLargeError(ResourceExhaustedError):
    """A batch refused for its size alone, before any of it was applied: by the broker, a Send or Broadcast of
    more envelopes than its ``max_batch_messages`` or a frame of more uncompressed bytes than its
    ``max_frame_bytes``; by the env server, a ``BatchStep`` of more steps than its ``max_batch_steps``. gRPC
    RESOURCE_EXHAUSTED with a ``google.rpc.ErrorInfo`` detail whose reason is ``BATCH_TOO_LARGE`` (domain
    ``marti.ai``; ``metadata["max_batch_messages"]``, ``["max_frame_bytes"]`` or ``["max_batch_steps"]``, the
    limit the batch broke), which the SDK's broker clients and ``RemoteParallelEnv.step_batch`` (so
    ``marti.env.make.step_many``) read to send the batch again in parts.

    Args:
        message: What was refused (the size and the limit are named).
        max_batch_messages: The broker's count limit, when the count broke it (0: not this limit).
        max_frame_bytes: The broker's frame limit in bytes, when the bytes broke it (0: not this limit).
        max_batch_steps: The env server's steps per ``BatchStep``, when the count broke it (0: not this limit).
    """

    reason: ClassVar[str] = "BATCH_TOO_LARGE"

    def __init__(
        self,
        message: str = "",
        *,
        max_batch_messages: int = 0,
        max_frame_bytes: int = 0,
        max_batch_steps: int = 0,
    ) -> None:
        limits = {
            "max_batch_messages": max_batch_messages,
            "max_frame_bytes": max_frame_bytes,
            "max_batch_steps": max_batch_steps,
        }
        super().__init__(message, metadata={k: str(v) for k, v in limits.items() if v})

    @property
    def max_batch_messages(self) -> int:
        """The broker's ``max_batch_messages`` when the count was refused (0 otherwise, or unsaid)."""
        return _metadata_int(self, "max_batch_messages")

    @property
    def max_frame_bytes(self) -> int:
        """The broker's ``max_frame_bytes`` when the frame's bytes were refused (0 otherwise, or unsaid)."""
        return _metadata_int(self, "max_frame_bytes")

    @property
    def max_batch_steps(self) -> int:
        """The env server's ``max_batch_steps`` when a ``BatchStep`` was refused for its count (0 otherwise)."""
        return _metadata_int(self, "max_batch_steps")


def _metadata_int(exc: MartiError, key: str) -> int:
    raw = exc.metadata.get(key, "")
    return int(raw) if raw.isdigit() else 0


class FailedPreconditionError(MartiError):
    """The system is not in a state that allows the operation, e.g. step after episode end (FAILED_PRECONDITION)."""


class ForkedAioError(FailedPreconditionError):
    """A ``grpc.aio`` call in a process forked while its parent had ``grpc.aio`` channels open.

    gRPC's asyncio stack does not survive ``fork`` (its poller thread is gone in the child while its state says
    it runs), so the SDK's async clients refuse every call in such a child at once, before anything is sent or
    taken out of a client's buffers: messages an async broker client holds stay buffered (the message names
    how many and their ids), and a message the call was about to buffer is not buffered. Start such workers
    with the ``spawn`` or ``forkserver`` start method of :mod:`multiprocessing`, use the sync clients in the
    child, or ``await client.close()`` every async client in the parent before forking: gRPC's asyncio stack
    then stops, and the child may use sync clients and async clients it makes itself. A subclass of
    :class:`FailedPreconditionError` (FAILED_PRECONDITION).
    """


class OutOfRangeError(MartiError):
    """A position or index beyond the valid range (gRPC OUT_OF_RANGE)."""


class DeadlineExceededError(MartiError, TimeoutError):
    """The caller's deadline passed before the operation could complete (gRPC DEADLINE_EXCEEDED)."""


class RateLimitedError(DeadlineExceededError):
    """An insert waited for room and the table stayed full (or its rate limiter never let it in) until the
    wait ran out: the consumer is not taking items as fast as they are inserted. Not a service outage: the
    store answered. gRPC DEADLINE_EXCEEDED with a ``google.rpc.ErrorInfo`` detail whose reason is
    ``RATE_LIMITED`` (domain ``marti.ai``; ``metadata``: ``table``, ``size`` and ``max_size``, the table's item
    count and limit when the wait ran out).

    A subclass of :class:`DeadlineExceededError`, so handlers of that class still catch it. Retrying can succeed
    once the consumer takes items; waiting longer does not help while it does not.

    Args:
        message: What was refused and why (the table and its limits are named).
        table: The full table's name (also ``metadata["table"]``).
        size: Items in the table when the wait ran out (also ``metadata["size"]``); -1 = unknown.
        max_size: The table's item limit (also ``metadata["max_size"]``); -1 = unknown.
        metadata: Further ``ErrorInfo`` metadata.
    """

    reason: ClassVar[str] = "RATE_LIMITED"

    def __init__(
        self,
        message: str = "",
        *,
        table: str = "",
        size: int = -1,
        max_size: int = -1,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        merged = dict(metadata or {})
        if table:
            merged["table"] = table
        if size >= 0:
            merged["size"] = str(size)
        if max_size >= 0:
            merged["max_size"] = str(max_size)
        super().__init__(message, metadata=merged)

    @property
    def table(self) -> str:
        """The full table's name (``""`` when the server did not say)."""
        return self.metadata.get("table", "")

    @property
    def size(self) -> int:
        """Items in the table when the wait ran out (-1 when the server did not say)."""
        return int(self.metadata.get("size", -1))

    @property
    def max_size(self) -> int:
        """The table's item limit (-1 when the server did not say)."""
        return int(self.metadata.get("max_size", -1))


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


class UnimplementedError(MartiError):
    """The server does not serve the method called: most often the address belongs to another service, e.g. an
    env client dialing a broker (gRPC UNIMPLEMENTED). The message names the method and, when the server is a
    marti server, the server's address and the services it does serve."""


class InternalError(MartiError):
    """An invariant broke inside marti; a bug worth reporting (gRPC INTERNAL)."""


__all__ = [
    "in_context",
    "with_context",
    "BatchTooLargeError",
    "ERROR_DOMAIN",
    "AbortedError",
    "AlreadyExistsError",
    "CancelledError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "ForkedAioError",
    "InternalError",
    "InvalidArgumentError",
    "MartiError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "RateLimitedError",
    "ResourceExhaustedError",
    "SessionLostError",
    "UnknownConfigKeyError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
]
