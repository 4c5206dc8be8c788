"""The closed state of an SDK client, kept by the channel its stubs call through (one place for every client).

Every client (broker, store, env, gateway, trainer; sync and ``grpc.aio``) makes its stubs on a
:class:`ClientChannel` that wraps its real channel and knows the client's name:

* after :meth:`ClientChannel.mark_closed` (the client's ``close``) every call raises, at once and before
  touching gRPC, the closed-client :class:`marti.errors.FailedPreconditionError` naming the client -- never
  gRPC's raw ``ValueError: Cannot invoke RPC on closed channel!``;
* a call that was waiting when the client was closed (its channel closed under it) raises that same error
  instead of what the closed channel makes it raise (``asyncio.CancelledError`` in an aio client, a
  cancelled status in a sync one). A task that is itself being cancelled (``Task.cancel``) still gets its
  ``asyncio.CancelledError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator
from contextlib import contextmanager
from typing import Any

import grpc

from marti.errors import FailedPreconditionError, MartiError

__all__ = ["ClientChannel", "task_cancelling"]

#: What a call raises when its channel is closed under it (a ``grpc.aio`` call cancelled, a write after the
#: end, gRPC's ``ValueError`` of a closed sync channel, :class:`marti.rpc.client.transport.ChannelClosedError`).
_CLOSED_CHANNEL_ERRORS = (
    MartiError, grpc.RpcError, asyncio.CancelledError, asyncio.InvalidStateError, ValueError, RuntimeError,
)  # fmt: skip


def task_cancelling() -> bool:
    """Whether the running asyncio task (if any) is being cancelled (``Task.cancel`` was called on it)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no event loop in this thread: a sync call
        return False
    return task is not None and task.cancelling() > 0


class ClientChannel:
    """A client's channel (sync ``grpc.Channel`` or ``grpc.aio``-like) that raises once the client is closed.

    Stubs take it where they take the channel it wraps; other attributes (``close``, ``get_state``,
    ``channel_ready``, ...) are the wrapped channel's.

    Args:
        channel: The real channel (a :class:`ClientChannel` is unwrapped: clients sharing a channel each keep
            their own closed state).
        name: What the client is, for the message (``"the store client of agent 'a' at host:port"``).
    """

    def __init__(self, channel: Any, name: str) -> None:
        self.inner = channel.inner if isinstance(channel, ClientChannel) else channel
        self.name = name
        self._marked = False

    @property
    def client_closed(self) -> bool:
        """Whether the client using this channel is closed."""
        return self._marked

    def closed_error(self) -> FailedPreconditionError:
        """The error of every call on the closed client (naming it)."""
        return FailedPreconditionError(f"{self.name} is closed; make a new one")

    def mark_closed(self) -> None:
        """Mark the client closed: every later call raises :meth:`closed_error` (the channel stays as it is)."""
        self._marked = True

    def check_open(self) -> None:
        """Raise :meth:`closed_error` if the client is closed.

        Raises:
            FailedPreconditionError: The client is closed (naming it).
        """
        if self.client_closed:
            raise self.closed_error()

    @contextmanager
    def closing_guard(self) -> Generator[None, None, None]:
        """Around a call that may be waiting when the client is closed: what the closed channel makes it raise
        (``asyncio.CancelledError``, a ``grpc.RpcError`` or a cancelled :class:`MartiError`) becomes
        :meth:`closed_error`, unless the running task is itself being cancelled."""
        try:
            yield
        except _CLOSED_CHANNEL_ERRORS as exc:
            if not self.client_closed or task_cancelling() or isinstance(exc, FailedPreconditionError):
                raise
            raise self.closed_error() from exc

    def unary_unary(self, *args: Any, **kwargs: Any) -> _Guarded:  # noqa: D102 -- as grpc.Channel's
        return _Guarded(self, self.inner.unary_unary(*args, **kwargs))

    def unary_stream(self, *args: Any, **kwargs: Any) -> _Guarded:  # noqa: D102
        return _Guarded(self, self.inner.unary_stream(*args, **kwargs))

    def stream_unary(self, *args: Any, **kwargs: Any) -> _Guarded:  # noqa: D102
        return _Guarded(self, self.inner.stream_unary(*args, **kwargs))

    def stream_stream(self, *args: Any, **kwargs: Any) -> _Guarded:  # noqa: D102
        return _Guarded(self, self.inner.stream_stream(*args, **kwargs))

    def close(self, *args: Any) -> Any:
        """Close the wrapped channel (returns what its ``close`` returns: a coroutine for ``grpc.aio``)."""
        return self.inner.close(*args)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.inner, name)


class _Guarded:
    """A multi-callable that refuses calls on a closed client and maps a close under a waiting call."""

    __slots__ = ("_inner", "_owner")

    def __init__(self, owner: ClientChannel, inner: Any) -> None:
        self._owner = owner
        self._inner = inner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._owner.check_open()
        with self._owner.closing_guard():
            result = self._inner(*args, **kwargs)
        if hasattr(result, "__await__") or hasattr(result, "__aiter__"):
            return _AioCall(self._owner, result)
        return result

    def __getattr__(self, name: str) -> Any:  # with_call, future, ...
        return getattr(self._inner, name)


class _AioCall:
    """A ``grpc.aio`` call whose awaiting, iteration and reads map a close of the client under them."""

    __slots__ = ("_call", "_owner")

    def __init__(self, owner: ClientChannel, call: Any) -> None:
        self._owner = owner
        self._call = call

    def __await__(self) -> Generator[Any, None, Any]:
        with self._owner.closing_guard():
            return (yield from self._call.__await__())

    async def __aiter__(self) -> AsyncIterator[Any]:
        with self._owner.closing_guard():
            async for msg in self._call:
                yield msg

    async def read(self) -> Any:
        """The call's next message (``grpc.aio`` ``read``)."""
        with self._owner.closing_guard():
            return await self._call.read()

    async def write(self, request: Any) -> None:
        """Send one request (``grpc.aio`` ``write``)."""
        with self._owner.closing_guard():
            await self._call.write(request)

    async def done_writing(self) -> None:
        """End the request stream (``grpc.aio`` ``done_writing``)."""
        with self._owner.closing_guard():
            await self._call.done_writing()

    def __getattr__(self, name: str) -> Any:  # cancel, initial_metadata, code, ...
        return getattr(self._call, name)
