"""One server bootstrap for every marti service.

``start_server`` builds a ``grpc.aio`` server with the shared interceptors, the standard health service,
server reflection, TLS (optional) and a Prometheus endpoint (optional), adds the given services and starts
it. ``run_server`` is the blocking entry point used by each service's ``__main__``: it runs on uvloop,
prints ``listening on HOST:PORT`` once its signal handlers are in place, and on SIGTERM/SIGINT flips health to
NOT_SERVING, drains in-flight calls for ``grace_s`` seconds and exits 0; a second signal stops at once.

Ports are bound exclusively (no ``SO_REUSEPORT``, :func:`marti.rpc.options.server_options`): a server whose
port (gRPC or Prometheus) is taken refuses to start with "address in use" naming the port, and ``run_server``
prints that as one line and exits 1.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from marti import errors
from marti.rpc.options import common_options, server_options
from marti.rpc.serving.bind import address_in_use_error, host_port, port_in_use
from marti.rpc.serving.interceptors import ServerInterceptor
from marti.rpc.serving.logs import configure_logging
from marti.rpc.settings import ServerSettings

_LOG = logging.getLogger("marti.rpc.serving.server")


@dataclass
class ServiceSpec:
    """One gRPC service to host.

    Attributes:
        name: Full proto service name, e.g. ``"marti.api.env.v1.EnvService"`` (used for health and reflection).
        add_to_server: Registers the servicer, e.g. ``lambda s: add_EnvServiceServicer_to_server(servicer, s)``.
        on_start: Optional coroutine run after the server started (background tasks, recovery).
        on_stop: Optional coroutine run after the server stopped (flush, snapshot, close storage).
    """

    name: str
    add_to_server: Callable[[grpc.aio.Server], None]
    on_start: Callable[[], Awaitable[None]] | None = None
    on_stop: Callable[[], Awaitable[None]] | None = None


@dataclass
class RunningServer:
    """A started server.

    Attributes:
        server: The underlying ``grpc.aio.Server``.
        port: The bound TCP port (the real one when 0 was requested).
        host: The bound host.
        health: The health servicer; :meth:`set_serving` flips every service's status.
        specs: The hosted services.
        metrics_port: Bound Prometheus port, or ``None``.
    """

    server: grpc.aio.Server
    port: int
    host: str
    health: health.aio.HealthServicer
    specs: Sequence[ServiceSpec]
    metrics_port: int | None = None
    _stopped: bool = field(default=False, repr=False)

    @property
    def address(self) -> str:
        """``host:port`` to dial (``0.0.0.0`` binds are reported as ``127.0.0.1``; an IPv6 host is bracketed,
        ``[::1]:50051``)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "[::]", "::") else self.host
        return host_port(host, self.port)

    async def set_serving(self, serving: bool) -> None:
        """Set the health status of the server ("") and of every hosted service."""
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ["", *(s.name for s in self.specs)]:
            await self.health.set(name, status)

    async def stop(self, grace_s: float | None = None) -> None:
        """Flip health to NOT_SERVING, let in-flight calls finish for ``grace_s`` seconds, run ``on_stop`` hooks.

        Args:
            grace_s: Seconds to wait for in-flight calls; ``None`` = no wait (cancel at once).
        """
        if self._stopped:
            return
        self._stopped = True
        await self.set_serving(False)
        await self.server.stop(grace_s)
        for spec in self.specs:
            if spec.on_stop is not None:
                try:
                    await spec.on_stop()
                except Exception:  # noqa: BLE001 - one failing hook must not skip the others
                    _LOG.exception("on_stop of %s failed", spec.name)

    async def wait_for_termination(self) -> None:
        """Block until the server has stopped."""
        await self.server.wait_for_termination()


def _read(settings: ServerSettings, name: str) -> bytes | None:
    """The bytes of the TLS file that setting ``name`` names (None when unset).

    Raises:
        InvalidArgumentError: The file cannot be read, naming the setting, the path and why.
    """
    path = getattr(settings, name)
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise errors.InvalidArgumentError(
            f"setting {name} = {path!r}: cannot read the TLS file: {exc.strerror or exc}"
        ) from None


def _check_pem(settings: ServerSettings) -> None:
    """Refuse TLS files that are readable but not what their setting needs (gRPC would only fail the bind).

    ``tls_cert_file`` and ``tls_client_ca_file`` must hold PEM certificates, and ``tls_key_file`` the PEM private
    key (not encrypted) of the certificate, as Python's ``ssl`` (OpenSSL) reads them.

    Raises:
        InvalidArgumentError: Naming the setting and the path (and OpenSSL's reason code when it gives one).
    """
    for name in ("tls_cert_file", "tls_client_ca_file"):
        path = getattr(settings, name)
        if path is None:
            continue
        try:
            ssl.create_default_context().load_verify_locations(cafile=path)
        except ssl.SSLError as exc:
            raise errors.InvalidArgumentError(
                f"setting {name} = {path!r}: not a PEM certificate file{_reason(exc)}"
            ) from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            settings.tls_cert_file, settings.tls_key_file, password=lambda: b""
        )
    except ssl.SSLError as exc:
        raise errors.InvalidArgumentError(
            f"setting tls_key_file = {settings.tls_key_file!r}: not a PEM private key (unencrypted) of the "
            f"certificate in tls_cert_file{_reason(exc)}"
        ) from None


def _reason(exc: ssl.SSLError) -> str:
    """`` (OpenSSL: REASON)`` for an error that has a reason code, else nothing ("PEM lib" says nothing more)."""
    return f" (OpenSSL: {exc.reason})" if exc.reason and exc.reason != "PEM lib" else ""


def _check_host(host: str) -> None:
    """Refuse a ``host`` setting that names no address to bind (gRPC would log its own error, then fail the bind
    with only ``could not bind``).

    Raises:
        InvalidArgumentError: Naming the setting and the host: empty, ``host:port``, or not resolvable.
    """
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not name:
        raise errors.InvalidArgumentError(
            f"setting host = {host!r}: an empty host names no interface; use 127.0.0.1, or 0.0.0.0 for all"
        )
    try:
        socket.getaddrinfo(name, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        port = host.rpartition(":")[2]
        hint = "; give the port with --port, not in the host" if ":" in name and port.isdigit() else ""
        raise errors.InvalidArgumentError(
            f"setting host = {host!r}: cannot be resolved to an address to bind ({getattr(exc, 'strerror', None) or exc})"
            f"{hint}"
        ) from None


def _bind(server: grpc.aio.Server, settings: ServerSettings, what: str) -> int:
    """Add the server's port; a bad host and a taken port are refused before gRPC tries them (gRPC would log its
    own error)."""
    _check_host(settings.host)
    target = host_port(settings.host, settings.port)  # a bare IPv6 host (``::1``) is bracketed for gRPC
    if port_in_use(settings.host, settings.port):
        raise address_in_use_error(what, settings.host, settings.port)
    creds = None
    if settings.tls_cert_file or settings.tls_key_file:
        if not (settings.tls_cert_file and settings.tls_key_file):
            raise errors.InvalidArgumentError("TLS needs both tls_cert_file and tls_key_file")
        client_ca = _read(settings, "tls_client_ca_file")
        pair = (_read(settings, "tls_key_file"), _read(settings, "tls_cert_file"))
        _check_pem(settings)  # each file was readable just now
        creds = grpc.ssl_server_credentials(
            [pair],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )
    try:
        port = (
            server.add_secure_port(target, creds) if creds is not None else server.add_insecure_port(target)
        )
    except RuntimeError:  # grpcio raises "Failed to bind to address" where older versions returned 0
        port = 0
    if port == 0:
        if port_in_use(settings.host, settings.port):  # taken between the check and the bind
            raise address_in_use_error(what, settings.host, settings.port)
        raise errors.UnavailableError(f"{what} could not bind {target}")
    return port


def _start_metrics(settings: ServerSettings) -> int | None:
    """Start the Prometheus endpoint (None when ``metrics_port`` is unset); returns its bound port.

    Raises:
        UnavailableError: the port is taken ("address in use") or cannot be bound.
    """
    if settings.metrics_port is None:
        return None
    from prometheus_client import start_http_server

    try:
        server, _thread = start_http_server(settings.metrics_port, addr=settings.host)
    except OSError as exc:
        if port_in_use(settings.host, settings.metrics_port):
            raise address_in_use_error("the metrics endpoint", settings.host, settings.metrics_port) from None
        raise errors.UnavailableError(
            f"the metrics endpoint could not bind {settings.host}:{settings.metrics_port}: {exc}"
        ) from None
    return int(server.server_address[1])


def _register_descriptor(service_name: str) -> None:
    """Make sure the service's descriptor is in the default pool so reflection can describe it.

    Generated ``*_pb2_grpc`` modules import only the request/response modules, not the module holding the
    service itself; by this repository's convention ``marti.api.<area>.v1.<Name>`` lives in
    ``marti/api/<area>/v1/<area>_service_pb2.py``.
    """
    from google.protobuf import descriptor_pool

    try:
        descriptor_pool.Default().FindServiceByName(service_name)
        return
    except KeyError:
        pass
    parts = service_name.split(".")
    if len(parts) == 5 and parts[:2] == ["marti", "api"]:
        import importlib

        try:
            importlib.import_module(f"marti.api.{parts[2]}.{parts[3]}.{parts[2]}_service_pb2")
        except ImportError:
            _LOG.warning("no descriptor module for %s; reflection cannot describe it", service_name)


async def start_server(specs: Sequence[ServiceSpec], settings: ServerSettings | None = None) -> RunningServer:
    """Build, bind and start a server hosting ``specs`` plus health and reflection.

    Args:
        specs: The services to host.
        settings: Bind address, limits, auth and TLS; defaults to ``ServerSettings()`` (env ``MARTI_*``).

    Returns:
        The :class:`RunningServer`, already SERVING.

    Raises:
        InvalidArgumentError: TLS files missing, unreadable or not PEM (a certificate, its key), naming the
            setting.
        UnavailableError: the gRPC or metrics port is taken (the message says "address in use" and names the
            port) or could not be bound; nothing is left listening then.
    """
    settings = settings or ServerSettings()
    names = [s.name for s in specs] + [health.SERVICE_NAME, reflection.SERVICE_NAME]
    interceptor = ServerInterceptor(settings.token, served=names)
    server = grpc.aio.server(
        interceptors=[interceptor],
        options=common_options(
            settings.max_message_bytes, settings.keepalive_time_ms, settings.keepalive_timeout_ms
        )
        + server_options(),
        maximum_concurrent_rpcs=settings.max_concurrent_rpcs,
    )
    for spec in specs:
        spec.add_to_server(server)
        _register_descriptor(spec.name)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(names, server)
    port = _bind(server, settings, ", ".join(s.name for s in specs) or "the server")
    running = RunningServer(server, port, settings.host, health_servicer, list(specs))
    interceptor.address = running.address
    try:
        running.metrics_port = _start_metrics(settings)
    except errors.MartiError:
        await server.stop(None)
        raise
    await server.start()
    for spec in specs:
        if spec.on_start is not None:
            await spec.on_start()
    await running.set_serving(True)
    return running


async def _serve_until_signal(specs: Sequence[ServiceSpec], settings: ServerSettings) -> None:
    running = await start_server(specs, settings)
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    signals_seen = 0

    def on_signal() -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            _LOG.warning("second signal: exiting at once")
            sys.stdout.flush()
            import os

            os._exit(1)
        stop_requested.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    # said once the signals are handled: a supervisor's SIGTERM right after this line drains, not kills
    print(f"listening on {running.address}", flush=True)
    if running.metrics_port is not None:
        print(f"metrics on http://{settings.host}:{running.metrics_port}/metrics", flush=True)
    await stop_requested.wait()
    _LOG.info("shutting down: NOT_SERVING, draining for %.1fs", settings.grace_s)
    await running.stop(settings.grace_s)
    print("stopped", flush=True)


def _exit_with_parent() -> None:
    """When started by a marti launcher (``MARTI_PARENT_PID`` set), ask Linux to send SIGTERM when the parent
    dies, even by SIGKILL, so an embedded stack never outlives the ``marti`` process that started it."""
    import os

    parent = os.environ.get("MARTI_PARENT_PID")
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except OSError:
        return
    if str(os.getppid()) != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def run_server(specs: Sequence[ServiceSpec], settings: ServerSettings | None = None) -> int:
    """Serve ``specs`` until SIGTERM or SIGINT; the blocking entry point of every service.

    Args:
        specs: The services to host.
        settings: Server settings; defaults to ``ServerSettings()``.

    Returns:
        Process exit code: 0 after a clean shutdown; after printing ``marti: error: MESSAGE`` as one line on
        stderr (no traceback), 2 for a bad setting the server met while starting (an
        :class:`~marti.errors.InvalidArgumentError`: an unreadable or non-PEM TLS file), as for any bad setting,
        and 1 when it could not start or failed with another :class:`~marti.errors.MartiError` (a port in use).
    """
    settings = settings or ServerSettings()
    try:
        _run(specs, settings)
    except errors.MartiError as exc:
        print(f"marti: error: {exc}", file=sys.stderr, flush=True)
        return 2 if isinstance(exc, errors.InvalidArgumentError) else 1
    return 0


def _run(specs: Sequence[ServiceSpec], settings: ServerSettings) -> None:
    """Configure logging and serve on uvloop until a signal (the body of :func:`run_server`)."""
    _exit_with_parent()
    configure_logging(settings.log_level)
    try:
        import uvloop

        uvloop.run(_serve_until_signal(specs, settings))
    except ImportError:  # pragma: no cover - uvloop is a dependency; fall back for exotic platforms
        asyncio.run(_serve_until_signal(specs, settings))
