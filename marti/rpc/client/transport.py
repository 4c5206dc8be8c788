"""Channels for the ``grpc.aio`` clients, bound lazily to the event loop (and process) that uses them.

A ``grpc.aio`` channel belongs to the event loop that was running (or current) when it was made; awaiting
one of its calls from any other loop fails with ``RuntimeError: ... attached to a different loop``. The SDK's
async clients are meant to be built anywhere (module level, a constructor, a sync ``__init__``) and used
from whichever loop runs them: ``asyncio.run(main(client))`` twice, a thread with its own loop, a forked
worker.

:class:`LoopBoundChannel` is a drop-in for ``grpc.aio.Channel`` as far as the generated stubs and the clients
need: it keeps the address, options and credentials (a factory), hands the stubs *lazy* multi-callables, and
makes the real ``grpc.aio`` channel on the first call inside a loop, one per ``(process, loop)``. Channels of
loops that have been closed are dropped (gRPC closes them when they are collected); after ``os.fork`` the
child never touches the parent's channels and makes its own.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import grpc
from grpc._cython import cygrpc

from marti.errors import ForkedAioError

__all__ = ["ChannelClosedError", "ForkedAioError", "LoopBoundChannel", "check_aio_usable"]

#: Channels inherited by a forked child: kept alive (never closed) so the child does not drive the parent's
#: transport state; they are gone when the child exits.
_INHERITED: list[Any] = []
_LIVE: weakref.WeakSet[LoopBoundChannel] = weakref.WeakSet()
#: Set in a forked child whose parent held open ``grpc.aio`` channels at fork time.
_FORKED_WITH_AIO = False


def _after_fork_in_child() -> None:
    """Mark every :class:`LoopBoundChannel` stale in a forked child (its channels belong to the parent).

    gRPC's asyncio stack does not survive ``fork``: its poller thread is gone in the child while its state says
    it runs, so a ``grpc.aio`` call there hangs or aborts the process (measured with grpcio 1.85: "Check failed:
    next_worker->state == KICKED"). When the parent held open aio channels, the child's aio calls therefore
    raise :class:`ForkedAioError` at once instead; sync channels keep working (gRPC's fork handlers reset them).
    """
    global _FORKED_WITH_AIO
    for channel in list(_LIVE):
        if channel._channels:
            _FORKED_WITH_AIO = True
        channel._forget_inherited()


#: Longest wait of a fork for ``grpc.aio``'s poller thread to end once the SDK's aio channels are all closed
#: (see :func:`_before_fork`), seconds.
POLLER_EXIT_WAIT_S = 2.0
#: Set once this process (or its parent) made a ``grpc.aio`` channel through a :class:`LoopBoundChannel`.
_MADE_AIO_CHANNEL = False


def _hold_grpc_core() -> None:
    """Keep gRPC's core initialized for the rest of the process once it makes its first ``grpc.aio`` channel.

    ``grpc.aio`` initializes gRPC's core with its first channel and shuts the core down again when its last
    channel is collected (after ``close``), unless something else holds the core. A ``fork`` while that
    shutdown winds down left children whose first gRPC call hung for good (measured with grpcio 1.85.1,
    a parent closing its only async client and forking at once: about 1 child in 100; none in 300 with the
    core held, ``tests/integration/rpc/test_fork_aio_clients.py``). The ``grpc.aio`` poller thread still
    ends with the last aio channel. This calls grpcio's private ``cygrpc.fork_handlers_and_grpc_init``; a grpcio
    without it leaves the core as it is (the race above comes back, nothing else breaks).
    """
    global _MADE_AIO_CHANNEL
    if not _MADE_AIO_CHANNEL:
        _MADE_AIO_CHANNEL = True
        init = getattr(cygrpc, "fork_handlers_and_grpc_init", None)  # private to grpcio: may go in a release
        if init is not None:
            init()


def _before_fork() -> None:
    """Before ``fork``: when this process made SDK aio channels and has closed them all, wait (at most
    :data:`POLLER_EXIT_WAIT_S`) for ``grpc.aio``'s poller thread to end.

    Closing the last aio channel only asks that thread to stop; a fork right after ``close`` met it still
    running about once in 150 forks, and gRPC's fork support does not allow a thread of its own running at
    fork time. A channel left to the garbage collector is collected first. While an SDK aio channel is open
    the fork goes on at once (its child gets :class:`ForkedAioError` from aio calls).
    """
    if not _MADE_AIO_CHANNEL or any(channel._channels for channel in list(_LIVE)):
        return
    pollers = [t for t in threading.enumerate() if t.name.endswith("(_poll_wrapper)")]
    if not pollers:
        return
    gc.collect()
    deadline = time.monotonic() + POLLER_EXIT_WAIT_S
    for thread in pollers:
        thread.join(max(0.0, deadline - time.monotonic()))


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


class ChannelClosedError(RuntimeError):
    """A call was made through a :class:`LoopBoundChannel` after :meth:`LoopBoundChannel.close`."""


def check_aio_usable(pending: str = "") -> None:
    """Raise :class:`ForkedAioError` if this process was forked while its parent had ``grpc.aio`` channels open.

    Called by every ``grpc.aio`` call (:meth:`LoopBoundChannel.current`) and by clients that must refuse a
    call before touching their own state (the async broker client, before it takes a batch out of its
    buffers).

    Args:
        pending: What the caller still holds unsent, said in the message (``""``: nothing).

    Raises:
        ForkedAioError: This process is such a child.
    """
    if _FORKED_WITH_AIO:
        raise ForkedAioError(
            "grpc.aio cannot be used in a process forked while its parent had grpc.aio channels open"
            f"{pending}; use multiprocessing's 'spawn' or 'forkserver' start method, the sync clients in the "
            "child, or close every async client in the parent before forking (the child may then make its own)"
        )


class LoopBoundChannel:
    """A ``grpc.aio`` channel made on first use in each event loop (and process) that uses it.

    Stubs take it where they take a ``grpc.aio.Channel`` (``pb_grpc.FooStub(channel)``); the multi-callables
    it returns pick, on every call, the real channel of the running loop, making it on first use there.
    Other channel methods (``get_state``, ``channel_ready``, ``wait_for_state_change``) are forwarded to the
    running loop's channel.

    Args:
        factory: Makes a new ``grpc.aio.Channel`` (address, options, credentials and interceptors fixed);
            called inside the loop that will use it.

    Thread safety: the per-loop table is guarded by a lock; a loop running in another thread gets its own
    channel.
    """

    def __init__(self, factory: Callable[[], grpc.aio.Channel]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._channels: dict[asyncio.AbstractEventLoop | None, grpc.aio.Channel] = {}
        self._closed = False
        #: The multi-callables handed to stubs: each caches the real one of the last channel it used, which
        #: keeps that channel alive; :meth:`_drop_cached` lets go of channels that are closed or dropped.
        self._lazies: weakref.WeakSet[_LazyMultiCallable] = weakref.WeakSet()
        _LIVE.add(self)

    # -- the channel of the running loop -------------------------------------------------------------------
    def current(self) -> grpc.aio.Channel:
        """The real ``grpc.aio`` channel for the running event loop, made now if this loop has none.

        Returns:
            The channel (also the one used when no loop is running, bound by gRPC to the current loop).

        Raises:
            ChannelClosedError: :meth:`close` was called.
            ForkedAioError: This process was forked while its parent had ``grpc.aio`` channels open.
        """
        if self._closed:
            raise ChannelClosedError("the channel was closed; make a new client")
        check_aio_usable()
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            if self._pid != os.getpid():  # forked without the at-fork hook (e.g. os.fork from C)
                self._forget_inherited_locked()
            channel = self._channels.get(loop)
            if channel is None:
                stale = [k for k in self._channels if k is not None and k.is_closed()]
                for old_loop in stale:
                    # gRPC closes a collected channel itself (grpc.aio.Channel.__del__); its loop is gone, so
                    # there is nothing left to await.
                    del self._channels[old_loop]
                if stale:
                    self._drop_cached()
                _hold_grpc_core()
                channel = self._channels[loop] = self._factory()
            return channel

    def _forget_inherited(self) -> None:
        # The lock may have been held by another thread at fork time; a fresh one replaces it in the child.
        self._lock = threading.Lock()
        with self._lock:
            self._forget_inherited_locked()

    def _forget_inherited_locked(self) -> None:
        _INHERITED.extend(self._channels.values())
        self._channels = {}
        self._pid = os.getpid()

    def _drop_cached(self) -> None:
        """Make every multi-callable of this object forget the real one it cached (and with it the channel).

        gRPC's asyncio stack, and its poller thread, runs until the last ``grpc.aio`` channel is collected
        (closing a channel is not enough). A closed channel still cached by a stub kept that thread running for
        as long as the client object lived, so a process that closed its async clients and then forked had
        gRPC skip its fork handlers, and sync calls in the child hung
        (``tests/integration/rpc/test_fork_after_aio_close.py``).
        """
        for lazy in list(self._lazies):
            lazy._cache = None

    # -- what generated stubs call -------------------------------------------------------------------------
    def _lazy(self, kind: str, method: str, args: tuple, kwargs: dict) -> _LazyMultiCallable:
        lazy = _LazyMultiCallable(self, kind, method, args, kwargs)
        self._lazies.add(lazy)
        return lazy

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> _LazyMultiCallable:
        """A unary-unary multi-callable for ``method`` that dials through the running loop's channel."""
        return self._lazy("unary_unary", method, args, kwargs)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> _LazyMultiCallable:
        """A unary-stream multi-callable for ``method`` that dials through the running loop's channel."""
        return self._lazy("unary_stream", method, args, kwargs)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> _LazyMultiCallable:
        """A stream-unary multi-callable for ``method`` that dials through the running loop's channel."""
        return self._lazy("stream_unary", method, args, kwargs)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> _LazyMultiCallable:
        """A stream-stream multi-callable for ``method`` that dials through the running loop's channel."""
        return self._lazy("stream_stream", method, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        # get_state, channel_ready, wait_for_state_change, ...: those of the running loop's channel.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.current(), name)

    # -- lifetime ------------------------------------------------------------------------------------------
    async def close(self, grace: float | None = None) -> None:
        """Close every channel this object made; later calls raise :class:`ChannelClosedError`.

        The running loop's channel is closed gracefully (in-flight calls get ``grace`` seconds, ``None`` =
        cancel them); a channel of another loop still running (in another thread) is closed on that loop
        without waiting; channels of closed loops are dropped. Idempotent. Nothing of this object keeps a
        channel alive afterwards: once every ``grpc.aio`` channel of the process is closed and dropped, gRPC
        stops its asyncio poller thread, so the process may fork (sync and new async clients work in the child).

        Args:
            grace: Seconds in-flight calls on the running loop's channel may take to finish.
        """
        with self._lock:
            self._closed = True
            channels, self._channels = self._channels, {}
            inherited = self._pid != os.getpid()
        self._drop_cached()
        if inherited:
            _INHERITED.extend(channels.values())
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop, channel in channels.items():
            if loop is running:
                await channel.close(grace)
            elif loop is not None and loop.is_running() and not loop.is_closed():
                asyncio.run_coroutine_threadsafe(channel.close(grace), loop)
            # Otherwise the loop is gone; dropping the channel lets gRPC close it.

    async def __aenter__(self) -> LoopBoundChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close(None)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed


class _LazyMultiCallable:
    """Resolves the real multi-callable on the running loop's channel at every call (cached per channel)."""

    __slots__ = ("__weakref__", "_args", "_cache", "_kind", "_kwargs", "_method", "_owner")

    def __init__(self, owner: LoopBoundChannel, kind: str, method: str, args: tuple, kwargs: dict) -> None:
        self._owner = owner
        self._kind = kind
        self._method = method
        self._args = args
        self._kwargs = kwargs
        self._cache: tuple[Any, Any] | None = None

    def _resolve(self) -> Any:
        channel = self._owner.current()
        cache = self._cache
        if cache is not None and cache[0] is channel:
            return cache[1]
        callable_ = getattr(channel, self._kind)(self._method, *self._args, **self._kwargs)
        self._cache = (channel, callable_)
        return callable_

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Start the call on the running loop's channel (arguments as ``grpc.aio`` multi-callables take)."""
        return self._resolve()(*args, **kwargs)
