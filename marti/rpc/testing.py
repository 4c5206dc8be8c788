"""Test helpers: run a real gRPC server on a free loopback port in a background thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

from marti.rpc.serving.server import RunningServer, ServiceSpec, start_server
from marti.rpc.settings import ServerSettings


class ServerThread:
    """A real aio server running on its own event loop in a daemon thread.

    Args:
        specs: Services to host, or a callable returning them (called inside the server's event loop, so
            servicers that create asyncio primitives bind to the right loop).
        settings: Server settings; the default binds ``127.0.0.1:0``.
    """

    def __init__(
        self,
        specs: Sequence[ServiceSpec] | Callable[[], Sequence[ServiceSpec]],
        settings: ServerSettings | None = None,
    ) -> None:
        self._specs = specs
        self._settings = settings or ServerSettings(host="127.0.0.1", port=0)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="marti-test-server")
        self.server: RunningServer | None = None

    def start(self, timeout_s: float = 30.0) -> RunningServer:
        """Start the thread and the server; returns the running server (see ``.address``)."""
        self._thread.start()

        async def go() -> RunningServer:
            specs = self._specs() if callable(self._specs) else self._specs
            return await start_server(specs, self._settings)

        self.server = asyncio.run_coroutine_threadsafe(go(), self._loop).result(timeout_s)
        return self.server

    def run(self, coro, timeout_s: float = 30.0):
        """Run a coroutine on the server's loop (e.g. to inspect servicer state) and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def stop(self, grace_s: float | None = 0.5, timeout_s: float = 30.0) -> None:
        """Stop the server (health flips to NOT_SERVING first), then the loop and the thread."""
        if self.server is not None:
            self.run(self.server.stop(grace_s), timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        self._loop.close()


@contextlib.contextmanager
def serve_in_thread(
    specs: Sequence[ServiceSpec] | Callable[[], Sequence[ServiceSpec]],
    settings: ServerSettings | None = None,
) -> Iterator[RunningServer]:
    """Run a real server on a free loopback port for the duration of a ``with`` block.

    Args:
        specs: Services (or a factory called on the server loop) to host.
        settings: Server settings (port 0 by default).

    Yields:
        The :class:`RunningServer`; dial ``server.address``.
    """
    thread = ServerThread(specs, settings)
    server = thread.start()
    try:
        yield server
    finally:
        thread.stop()
