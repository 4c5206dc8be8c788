"""The one call layer of the SDK clients: unary calls and server streams, errors mapped once.

Every client (sync and ``grpc.aio``) makes its rpcs through these helpers instead of calling stubs itself, so
the deadline default and the ``grpc.RpcError`` -> :class:`marti.errors.MartiError` mapping
(:func:`marti.rpc.errors.from_rpc_error`) are written here only:

* :func:`call` / :func:`acall`: one unary call with a deadline.
* :func:`iterate` / :func:`aiterate`: the messages of a server stream; the call is cancelled when the
  iteration stops early.
* :func:`rpc_errors`: a ``with`` block that maps errors for code driving a call by hand (reading a stream's
  header, a bidirectional stream).

Layering: :mod:`marti.rpc.client.channel` makes channels, :mod:`marti.rpc.client.transport` binds aio channels to loops,
this module makes calls over them, :mod:`marti.codec` converts messages, and :mod:`marti.clients` builds the
public API from the three.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import grpc

from marti.rpc.client.channel import DEFAULT_TIMEOUT_S
from marti.rpc.errors import from_rpc_error

__all__ = ["DEFAULT_TIMEOUT_S", "acall", "aiterate", "call", "iterate", "rpc_errors"]

#: What gRPC's fork handling says of a call it cut in a forked child (status CANCELLED).
CLOSED_ON_FORK = "Closed on fork"
#: The pid of the process this module was imported in; a process with another pid is a forked child.
_IMPORTED_IN = os.getpid()


def _closed_on_fork(err: grpc.RpcError) -> bool:
    """Whether ``err`` is gRPC's fork handling cutting a call in a forked child: status CANCELLED, details
    "... (Closed on fork)". In a child, gRPC closes the connections it inherited; a call started in the child
    while that happens fails so, before any of it is sent (about 1 call in 100 right after a fork, measured in
    docs/operations.md), and the same call made again goes over a new connection."""
    return (
        os.getpid() != _IMPORTED_IN
        and err.code() == grpc.StatusCode.CANCELLED
        and CLOSED_ON_FORK in (err.details() or "")
    )


def call(
    method: Callable[..., Any],
    request: Any,
    timeout_s: float | None = None,
    metadata: Sequence[tuple[str, str]] = (),
) -> Any:
    """Make one sync unary call.

    Args:
        method: A stub's multi-callable (``stub.GetJob``).
        request: The request message.
        timeout_s: Deadline, seconds; ``None`` or ``0`` means :data:`DEFAULT_TIMEOUT_S`.
        metadata: Call metadata to send, ``(key, value)`` pairs (none by default).

    Returns:
        The response message.

    A call that gRPC's fork handling cut in a forked child (:func:`_closed_on_fork`) is made once more.

    Raises:
        MartiError: The subclass of the call's status (:func:`marti.rpc.errors.from_rpc_error`).
    """
    meta = {"metadata": metadata} if metadata else {}  # a method without metadata is called as before
    try:
        return method(request, timeout=timeout_s or DEFAULT_TIMEOUT_S, **meta)
    except grpc.RpcError as e:
        if not _closed_on_fork(e):
            raise from_rpc_error(e) from None
    try:
        return method(request, timeout=timeout_s or DEFAULT_TIMEOUT_S, **meta)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None


async def acall(
    method: Callable[..., Awaitable[Any]],
    request: Any,
    timeout_s: float | None = None,
    metadata: Sequence[tuple[str, str]] = (),
) -> Any:
    """Make one ``grpc.aio`` unary call: the awaitable twin of :func:`call` (same arguments and errors)."""
    try:
        meta = {"metadata": metadata} if metadata else {}
        return await method(request, timeout=timeout_s or DEFAULT_TIMEOUT_S, **meta)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None


def _ends_stream(err: grpc.RpcError, end_on_cancel: bool) -> bool:
    return end_on_cancel and hasattr(err, "code") and err.code() == grpc.StatusCode.CANCELLED


def iterate(stream: Any, *, end_on_cancel: bool = False) -> Iterator[Any]:
    """Yield the messages of a sync server stream; cancel the call when the caller stops early.

    Args:
        stream: The call object a stub's unary-stream method returned.
        end_on_cancel: Treat a ``CANCELLED`` status as the end of the stream (for streams the client
            cancels itself to stop them) instead of raising it.

    Raises:
        MartiError: The stream's error status, mapped.
    """
    try:
        yield from stream
    except grpc.RpcError as e:
        if not _ends_stream(e, end_on_cancel):
            raise from_rpc_error(e) from None
    finally:
        stream.cancel()


async def aiterate(stream: Any, *, end_on_cancel: bool = False) -> AsyncIterator[Any]:
    """Yield the messages of a ``grpc.aio`` server stream: the async twin of :func:`iterate`."""
    try:
        async for msg in stream:
            yield msg
    except grpc.RpcError as e:
        if not _ends_stream(e, end_on_cancel):
            raise from_rpc_error(e) from None
    finally:
        stream.cancel()


@contextmanager
def rpc_errors() -> Iterator[None]:
    """Map a ``grpc.RpcError`` raised in the block to its :class:`marti.errors.MartiError` subclass.

    For code that drives a call object itself (``next(call)``, ``await call.read()``, a request queue).
    """
    try:
        yield
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None
