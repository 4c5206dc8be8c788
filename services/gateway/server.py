"""The inference gateway's server: the OpenAI-compatible HTTP app and the gRPC InferenceService on one event loop.

:class:`GatewayServer` runs one asyncio event loop in a daemon thread. On it live the gateway (its request
batcher and abandoned-episode sweeper: ``gateway.start()`` runs there), the FastAPI app of
:func:`services.gateway.http.app.build_app` under ``uvicorn.Server`` and the ``grpc.aio`` server of
:func:`marti.rpc.serving.server.start_server` hosting :func:`services.gateway.servicer.service_spec` (with health and
reflection). Both protocols share the gateway, so they batch together and trace into the same episodes.

Typical use (what the training job does)::

    server = GatewayServer(gateway, host="127.0.0.1", http_port=0, grpc_port=0, token=token)
    http_url, grpc_address = server.start()   # "http://127.0.0.1:PORT/v1", "127.0.0.1:PORT"
    ...
    server.stop()                             # closes both servers and the gateway, joins the thread

**Stopping.** Both endpoints stop accepting calls at once; calls in flight get ``grace_s`` seconds (default
:data:`DEFAULT_GRACE_S`, 30 s: meant to let a running batch end) to finish. Then the gateway closes: requests
still queued fail with 503 / UNAVAILABLE (``the gateway is shutting down``), and :data:`CANCEL_AFTER_S` seconds
later calls still running (their batch did not end) are cancelled: an HTTP client gets the same 503 as JSON, a gRPC
client CANCELLED. The running batch itself ends on its own before the gateway's engine thread does.

``stop`` leaves no thread behind: the loop's default executor (``asyncio.to_thread``), the batcher's engine
thread and the HTTP server's worker threads all end before the thread is joined.

**Sizes.** A request larger than ``gateway.max_request_bytes`` is refused: 413 by the HTTP app (before parsing),
RESOURCE_EXHAUSTED by the gRPC servicer. The gRPC server's own message limit (``marti.rpc`` has one value for
receiving and sending) is the larger of ``gateway.max_request_bytes`` and the marti default (64 MiB), not the
request limit itself: a response carries the prompt's token ids and ``n`` completions, so it can be larger than the
request it answers. A gRPC message within that limit but over ``gateway.max_request_bytes`` is therefore parsed
before it is refused; a larger one is refused by the transport (RESOURCE_EXHAUSTED as well).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import threading
from collections.abc import Coroutine
from typing import Any

from marti.errors import FailedPreconditionError, UnavailableError
from marti.rpc.serving.bind import address_in_use_error
from services.gateway.core.gateway import Gateway

_LOG = logging.getLogger("marti.gateway.server")

#: Seconds in-flight calls may finish when stopping, unless the constructor or ``stop`` says otherwise.
DEFAULT_GRACE_S = 30.0
#: Seconds between failing the queued requests (the grace is over) and cancelling the calls still running.
CANCEL_AFTER_S = 0.5
#: Seconds an idle HTTP keep-alive connection stays open. Longer than the clients' own idle limit (``httpx``, so the
#: ``openai`` client: 5 s) so that the client, not the server, closes it: with uvicorn's default of 5 s a client
#: reusing a connection just as the server closed it got a connection error (1 of 800 requests at 400 in flight).
KEEP_ALIVE_S = 75


def _dial_host(host: str) -> str:
    """The host to dial for a bind address (any-address binds are dialled on loopback); IPv6 in brackets."""
    if host in ("0.0.0.0", "", "::", "[::]"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: a free one).

    Raises:
        UnavailableError: The address cannot be bound: "address in use" naming the port when it is taken, or an
            unknown host.
    """
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise UnavailableError(f"cannot bind the gateway's HTTP endpoint to {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # no SO_REUSEPORT: a taken port is refused
        sock.bind(addr)
        sock.listen(2048)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise address_in_use_error("the gateway's HTTP endpoint", host, port) from None
        raise UnavailableError(f"cannot bind the gateway's HTTP endpoint to {host}:{port}: {exc}") from None
    return sock


class GatewayServer:
    """Serves a :class:`Gateway` over HTTP (OpenAI-compatible, ``/v1``) and gRPC from a daemon thread.

    Args:
        gateway: The gateway; the server starts it on its loop and closes it on stop.
        host: Interface both endpoints bind (``0.0.0.0`` for all).
        http_port: HTTP port; 0 = a free one.
        grpc_port: gRPC port; 0 = a free one.
        token: Bearer token both endpoints require; None = ``MARTI_TOKEN`` when set (as every marti service),
            else no authentication.
        tls_cert_file: PEM certificate; with ``tls_key_file`` both endpoints use TLS (``https://``).
        tls_key_file: PEM private key of the certificate.
        grace_s: Seconds in-flight calls may finish when stopping (see the module docstring for what happens to
            those that do not).

    Raises:
        InvalidArgumentError: Only one of the TLS files is given.
    """

    def __init__(
        self,
        gateway: Gateway,
        *,
        host: str = "127.0.0.1",
        http_port: int = 0,
        grpc_port: int = 0,
        token: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        grace_s: float = DEFAULT_GRACE_S,
    ) -> None:
        from marti.errors import InvalidArgumentError

        if bool(tls_cert_file) != bool(tls_key_file):
            raise InvalidArgumentError("gateway TLS needs both tls_cert_file and tls_key_file")
        self.gateway = gateway
        self.host = host
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.token = token
        self.tls_cert_file = tls_cert_file
        self.tls_key_file = tls_key_file
        self.grace_s = grace_s
        self.http_url: str | None = None
        """``http(s)://HOST:PORT/v1`` once started (the OpenAI client's ``base_url``)."""
        self.grpc_address: str | None = None
        """``HOST:PORT`` of the gRPC InferenceService once started."""
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self, timeout_s: float = 60.0) -> tuple[str, str]:
        """Start the thread, the gateway and both endpoints; returns ``(http_url, grpc_address)``.

        Raises:
            FailedPreconditionError: Already started.
            UnavailableError: An address could not be bound.
            DeadlineExceededError: Not serving within ``timeout_s``.
            Whatever starting the gateway or an endpoint raised (the thread has ended then).
        """
        from marti.errors import DeadlineExceededError

        if self._thread is not None:
            raise FailedPreconditionError("this gateway server was already started")
        self._thread = threading.Thread(target=self._thread_main, name="marti-gateway", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self.stop()
            raise DeadlineExceededError(f"the gateway did not start serving within {timeout_s:.0f}s")
        if self._error is not None:
            self._thread.join(timeout_s)
            raise self._error
        assert self.http_url is not None and self.grpc_address is not None
        return self.http_url, self.grpc_address

    def stop(self, grace_s: float | None = None, timeout_s: float | None = None) -> None:
        """Stop both endpoints (in-flight calls get ``grace_s`` seconds, default the constructor's; then queued
        requests fail with 503 / UNAVAILABLE and running ones are cancelled, see the module docstring), close the
        gateway and join the thread, waiting at most ``timeout_s`` seconds (default ``grace_s`` + 60).
        Idempotent; a server never started is a no-op."""
        if grace_s is not None:
            self.grace_s = grace_s
        if timeout_s is None:
            timeout_s = self.grace_s + 60.0
        thread, loop, event = self._thread, self._loop, self._stop_event
        if thread is None:
            return
        if loop is not None and event is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop closed meanwhile: the thread is ending on its own
                pass
        thread.join(timeout_s)
        if thread.is_alive():
            _LOG.warning("the gateway thread did not end within %.0fs", timeout_s)

    @property
    def running(self) -> bool:
        """True while the endpoints serve."""
        return self._thread is not None and self._thread.is_alive() and self._ready.is_set()

    def run(self, coro: Coroutine[Any, Any, Any], timeout_s: float = 60.0) -> Any:
        """Run a coroutine on the server's event loop (where the gateway lives) and return its result.

        Raises:
            FailedPreconditionError: The server is not running.
        """
        if self._loop is None or not self.running:
            coro.close()
            raise FailedPreconditionError("the gateway server is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def __enter__(self) -> GatewayServer:
        """Start serving (see :meth:`start`); returns self."""
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop serving (see :meth:`stop`)."""
        self.stop()

    # ------------------------------------------------------------------------------------------ the thread
    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())  # also ends the default executor and the loop's async generators
        except BaseException as exc:  # noqa: BLE001 - reported to start() or logged
            if not self._ready.is_set():
                self._error = exc
                self._ready.set()
            else:
                _LOG.exception("the gateway server failed")
        finally:
            self._ready.set()

    async def _main(self) -> None:
        import uvicorn

        from marti.rpc.serving.server import start_server
        from marti.rpc.settings import DEFAULT_MAX_MESSAGE_BYTES, ServerSettings
        from services.gateway.http.app import build_app
        from services.gateway.servicer import service_spec

        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        grpc_server = http_server = serve_task = None
        started = False
        try:
            await self.gateway.start()
            started = True
            settings = ServerSettings(
                host=self.host,
                port=self.grpc_port,
                token=self.token,
                tls_cert_file=self.tls_cert_file,
                tls_key_file=self.tls_key_file,
                tls_client_ca_file=None,
                metrics_port=None,
                grace_s=self.grace_s,
                max_message_bytes=max(DEFAULT_MAX_MESSAGE_BYTES, self.gateway.limits.max_request_bytes),
            )
            token = settings.token  # the explicit one, else MARTI_TOKEN: both endpoints the same
            grpc_server = await start_server([service_spec(self.gateway, own_gateway=False)], settings)
            sock = _bind(self.host, self.http_port)
            port = sock.getsockname()[1]
            config = uvicorn.Config(
                build_app(self.gateway, token=token),
                log_config=None,
                access_log=False,
                lifespan="off",
                timeout_keep_alive=KEEP_ALIVE_S,
                ssl_certfile=self.tls_cert_file,
                ssl_keyfile=self.tls_key_file,
                timeout_graceful_shutdown=self.grace_s + CANCEL_AFTER_S,
            )
            http_server = uvicorn.Server(config)
            serve_task = asyncio.get_running_loop().create_task(http_server.serve(sockets=[sock]))
            while not http_server.started:
                if serve_task.done():
                    serve_task.result()  # raises what failed
                    raise UnavailableError("the gateway's HTTP server ended while starting")
                await asyncio.sleep(0.01)
            scheme = "https" if self.tls_cert_file else "http"
            self.http_url = f"{scheme}://{_dial_host(self.host)}:{port}/v1"
            self.grpc_address = f"{_dial_host(self.host)}:{grpc_server.port}"
            self._ready.set()
            await self._stop_event.wait()
        finally:
            await self._shutdown(http_server, serve_task, grpc_server, started)

    async def _shutdown(
        self, http_server: Any, serve_task: asyncio.Task[None] | None, grpc_server: Any, started: bool
    ) -> None:
        """Stop both endpoints and close the gateway (the sequence of the module docstring)."""
        grace = max(0.0, self.grace_s)
        waits: list[asyncio.Task[Any]] = []
        if http_server is not None and serve_task is not None:
            # uvicorn stops accepting, waits for in-flight requests, then cancels them (503 by the app); set here
            # again because stop() may have changed the grace
            http_server.config.timeout_graceful_shutdown = grace + CANCEL_AFTER_S
            http_server.should_exit = True

            async def http_done() -> None:
                try:
                    await asyncio.wait_for(serve_task, timeout=grace + CANCEL_AFTER_S + 5.0)
                except BaseException:  # noqa: BLE001 - shutting down regardless
                    http_server.force_exit = True
                    serve_task.cancel()
                    await asyncio.gather(serve_task, return_exceptions=True)

            waits.append(asyncio.ensure_future(http_done()))
        if grpc_server is not None:
            waits.append(asyncio.ensure_future(grpc_server.stop(grace + CANCEL_AFTER_S)))
        closing = None
        if waits:
            _, pending = await asyncio.wait(waits, timeout=grace)
            if pending and started:  # the grace is over: queued requests fail now (503 / UNAVAILABLE)
                closing = asyncio.ensure_future(self.gateway.close())
            for result in await asyncio.gather(*waits, return_exceptions=True):
                if isinstance(result, BaseException):
                    _LOG.warning("stopping a gateway endpoint failed: %r", result)
        if closing is not None:
            await closing
        elif started:
            await self.gateway.close()
