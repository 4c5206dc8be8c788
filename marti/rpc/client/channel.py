"""Client channels: checked addresses, agreed message sizes and keepalive, a capped reconnect backoff, bearer
tokens, TLS, and retries for idempotent calls."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from marti.errors import InvalidArgumentError, NotFoundError
from marti.rpc.address import check_address
from marti.rpc.client.message_limits import record_limits
from marti.rpc.client.transport import LoopBoundChannel
from marti.rpc.options import common_options, reconnect_options
from marti.rpc.settings import DEFAULT_MAX_MESSAGE_BYTES

#: Default deadline for a unary call made by the SDK clients, seconds.
DEFAULT_TIMEOUT_S = 30.0
#: Longest deadline a client accepts, seconds (30 days; gRPC's deadline arithmetic overflows far above it).
MAX_TIMEOUT_S = 30 * 24 * 3600.0


def check_timeout_s(timeout_s: float | None) -> float:
    """A client's per-call deadline: ``timeout_s``, or :data:`DEFAULT_TIMEOUT_S` for None.

    Raises:
        InvalidArgumentError: Not a number, not finite, <= 0 or above :data:`MAX_TIMEOUT_S`, naming the value.
    """
    if timeout_s is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise InvalidArgumentError(f"timeout_s must be a number of seconds, got {timeout_s!r}")
    if not (0 < timeout_s <= MAX_TIMEOUT_S):  # NaN fails both comparisons
        raise InvalidArgumentError(f"timeout_s must be > 0 and <= {MAX_TIMEOUT_S:.0f} s, got {timeout_s}")
    return float(timeout_s)


#: Shared bearer-token variable, read by every client (and server) when nothing more specific is set.
SHARED_TOKEN_ENV = "MARTI_TOKEN"
#: Service-specific token variables (the servers' ``MARTI_<SERVICE>_TOKEN`` settings), read before
#: :data:`SHARED_TOKEN_ENV`.
TOKEN_ENV_VARS: dict[str, str] = {
    "broker": "MARTI_BROKER_TOKEN",
    "env": "MARTI_ENV_TOKEN",
    "store": "MARTI_STORE_TOKEN",
    "trainer": "MARTI_TRAINER_TOKEN",
}


def check_channel(channel: Any) -> Any:
    """Check a client's ``channel=`` argument: an open ``grpc.Channel``, ``grpc.aio.Channel`` or a wrapper of one
    (anything with ``unary_unary``), or None. Returns it.

    Raises:
        InvalidArgumentError: Anything else (its type named).
    """
    if channel is not None and not callable(getattr(channel, "unary_unary", None)):
        raise InvalidArgumentError(
            f"channel must be an open grpc channel or None, got {type(channel).__name__}"
        )
    return channel


def resolve_token(token: str | None, service: str | None = None) -> str | None:
    """The bearer token a client sends: ``token`` if given, else the environment, as the servers read it.

    Precedence mirrors the servers' settings: an explicit ``token`` (``""`` means "send none"), then
    ``MARTI_<SERVICE>_TOKEN`` of ``service`` (e.g. ``MARTI_BROKER_TOKEN``), then ``MARTI_TOKEN``. Empty
    variables count as unset.

    Args:
        token: The token passed by the caller, or ``None`` to look it up.
        service: ``"broker"``, ``"env"``, ``"store"`` or ``"trainer"`` (see :data:`TOKEN_ENV_VARS`), or
            ``None`` for the shared variable only.

    Returns:
        The token, or ``None`` when there is none.

    Raises:
        InvalidArgumentError: ``service`` is not one of the known names.
    """
    return _resolve_token(token, service)[0]


def _resolve_token(token: str | None, service: str | None) -> tuple[str | None, str]:
    """``(token, where it came from)``: ``"token"`` for the argument, else the variable's name."""
    if service is not None and service not in TOKEN_ENV_VARS:
        raise InvalidArgumentError(f"unknown service {service!r}; expected one of {sorted(TOKEN_ENV_VARS)}")
    if token is not None:
        if not isinstance(token, str):
            raise InvalidArgumentError(f"token must be a string or None, got {type(token).__name__}")
        return token, "token"
    names = ((TOKEN_ENV_VARS[service],) if service else ()) + (SHARED_TOKEN_ENV,)
    for name in names:
        value = os.environ.get(name)
        if value:
            return value, name
    return None, "token"


def check_token(token: str, source: str = "token") -> None:
    """Refuse a bearer token that cannot travel as gRPC metadata, before any rpc is made.

    A metadata value must be printable ASCII (bytes 0x20..0x7E); anything else would fail every call with
    ``Invalid metadata``. The message names the position and kind of the first bad character, never the
    token itself.

    Args:
        token: The token to check.
        source: What to call it in the message (``"token"`` or the environment variable it came from).

    Raises:
        InvalidArgumentError: ``token`` holds a non-ASCII or control character.
    """
    for position, char in enumerate(token):
        if " " <= char <= "~":
            continue
        kind = "non-ASCII character" if ord(char) > 0x7F else "control character"
        raise InvalidArgumentError(
            f"{source} must be printable ASCII (gRPC metadata); got a value with a {kind} at position {position}"
        )


def read_pem(path: Any, name: str) -> bytes | None:
    """The bytes of the PEM file a client was given for TLS (``None`` or ``""``: none given).

    Args:
        path: A ``str`` or ``os.PathLike`` path, or ``None``.
        name: The argument's name (``"tls_ca_file"``), for the message.

    Raises:
        InvalidArgumentError: ``path`` is not a path, or names something that cannot be read as a file (a
            directory, no permission); the message names ``name`` and the path.
        NotFoundError: No file at ``path`` (named).
    """
    if path is None or path == "":
        return None
    if not isinstance(path, str | os.PathLike):
        raise InvalidArgumentError(
            f"{name} must be a file path (str) or None, got {type(path).__name__} {path!r:.80}"
        )
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise NotFoundError(f"{name}: no file at {os.fspath(path)!r}") from None
    except (OSError, ValueError) as exc:  # a directory, no permission, a NUL in the path
        raise InvalidArgumentError(f"{name}: cannot read {os.fspath(path)!r}: {exc}") from None


def retry_service_config(idempotent_methods: Sequence[tuple[str, str]], max_attempts: int = 4) -> str:
    """Build a gRPC service config JSON that retries the given methods on UNAVAILABLE.

    Args:
        idempotent_methods: ``(full_service_name, method)`` pairs safe to retry; ``method=""`` means every
            method of that service.
        max_attempts: Total attempts including the first (gRPC caps this at 5).

    Returns:
        The JSON text for the ``grpc.service_config`` channel argument.
    """
    names = [{"service": s, **({"method": m} if m else {})} for s, m in idempotent_methods]
    config: dict[str, Any] = {
        "methodConfig": [
            {
                "name": names,
                "retryPolicy": {
                    "maxAttempts": max_attempts,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
    return json.dumps(config if names else {})


def _channel_options(max_message_bytes: int, extra: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The channel arguments of :func:`make_channel`: shared options, the reconnect cap, retries, then ``extra``
    (each key once; a key in ``extra`` wins)."""
    merged = dict([*common_options(max_message_bytes), *reconnect_options(), ("grpc.enable_retries", 1)])
    merged.update(dict(extra))
    return list(merged.items())


class _AuthMetadata(grpc.AuthMetadataPlugin):
    def __init__(self, token: str) -> None:
        self._token = token

    def __call__(self, context: Any, callback: Any) -> None:
        callback((("authorization", f"Bearer {self._token}"),), None)


def _token_metadata(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


class _SyncTokenInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds the bearer token to every call on an insecure sync channel."""

    def __init__(self, token: str) -> None:
        self._meta = _token_metadata(token)

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _Details(
            details.method,
            details.timeout,
            tuple(details.metadata or ()) + self._meta,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation, client_call_details, request):  # noqa: D102
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation, client_call_details, request):  # noqa: D102
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(self, continuation, client_call_details, request_iterator):  # noqa: D102
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # noqa: D102
        return continuation(self._details(client_call_details), request_iterator)


class _Details(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression


def _aio_token_interceptors(token: str) -> list[grpc.aio.ClientInterceptor]:
    meta = _token_metadata(token)

    def add(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(tuple(details.metadata or ()) + meta))
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    class UU(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, client_call_details, request):
            return await continuation(add(client_call_details), request)

    class US(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation, client_call_details, request):
            return await continuation(add(client_call_details), request)

    class SU(grpc.aio.StreamUnaryClientInterceptor):
        async def intercept_stream_unary(self, continuation, client_call_details, request_iterator):
            return await continuation(add(client_call_details), request_iterator)

    class SS(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
            return await continuation(add(client_call_details), request_iterator)

    return [UU(), US(), SU(), SS()]


def _aio_factory(
    address: str, opts: list[tuple[str, Any]], creds: grpc.ChannelCredentials | None, token: str | None
) -> Callable[[], grpc.aio.Channel]:
    """A function making a fresh ``grpc.aio`` channel to ``address`` (called once per event loop)."""

    def factory() -> grpc.aio.Channel:
        if creds is not None:
            return grpc.aio.secure_channel(address, creds, options=opts)
        interceptors = _aio_token_interceptors(token) if token else None
        return grpc.aio.insecure_channel(address, options=opts, interceptors=interceptors)

    return factory


def make_channel(
    address: str,
    *,
    token: str | None = None,
    tls_ca_file: str | None = None,
    tls_cert_file: str | None = None,
    tls_key_file: str | None = None,
    aio: bool = False,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    idempotent_methods: Sequence[tuple[str, str]] = (),
    options: Sequence[tuple[str, Any]] = (),
    service: str | None = None,
) -> grpc.Channel | LoopBoundChannel:
    """Open a channel to a marti service.

    Every channel redials a server it lost with a capped backoff (:func:`marti.rpc.options.reconnect_options`:
    0.2 s growing to 2 s, so a server that is back is found again within about 2.4 s however long it was gone).

    Args:
        address: ``host:port`` (or another form :func:`marti.rpc.address.check_address` accepts); an address
            without a port is refused (gRPC would dial port 443).
        token: Bearer token sent as ``authorization`` metadata on every call. ``None`` reads
            ``MARTI_<SERVICE>_TOKEN`` (of ``service``), then ``MARTI_TOKEN`` (see :func:`resolve_token`);
            ``""`` sends no token.
        tls_ca_file: PEM CA that signed the server certificate; enables TLS.
        tls_cert_file: PEM client certificate for mTLS (with ``tls_key_file``).
        tls_key_file: PEM client key for mTLS.
        aio: ``True`` for a channel of ``grpc.aio`` calls, else a sync channel. The aio flavour is a
            :class:`~marti.rpc.client.transport.LoopBoundChannel`: the real ``grpc.aio`` channel is made on first use
            in each event loop (and forked process) that uses it, so a client built outside any loop works
            from every ``asyncio.run``.
        max_message_bytes: Largest message sent or received, bytes (agree with the server).
        idempotent_methods: ``(service, method)`` pairs retried on UNAVAILABLE (see :func:`retry_service_config`).
        options: Extra grpc channel arguments; a key given here replaces the default of the same key.
        service: Which service the channel dials (``"broker"``, ``"env"``, ``"store"``, ``"trainer"``), for
            its token variable; ``None`` reads only ``MARTI_TOKEN``.

    Returns:
        A sync ``grpc.Channel``, or a :class:`~marti.rpc.client.transport.LoopBoundChannel` (stubs take it like a
        ``grpc.aio.Channel``; ``await channel.close()`` closes it). Its send and receive limits are recorded
        (:func:`marti.rpc.client.message_limits.send_limit` and :func:`~marti.rpc.client.message_limits.receive_limit` read
        them).

    Raises:
        InvalidArgumentError: The address has no port or is malformed, the token (given or from the
            environment) is not a printable-ASCII string, a TLS file argument is not a path or cannot be read
            (see :func:`read_pem`), or ``service`` is unknown. Nothing is dialed then.
        NotFoundError: A TLS file argument names no file.
    """
    check_address(address, f"{service} address" if service else "address")
    token, source = _resolve_token(token, service)
    if token:
        check_token(token, source)
    opts = _channel_options(max_message_bytes, options)
    if idempotent_methods:
        opts.append(("grpc.service_config", retry_service_config(idempotent_methods)))
    creds = None
    if tls_ca_file or tls_cert_file:
        creds = grpc.ssl_channel_credentials(
            root_certificates=read_pem(tls_ca_file, "tls_ca_file"),
            private_key=read_pem(tls_key_file, "tls_key_file"),
            certificate_chain=read_pem(tls_cert_file, "tls_cert_file"),
        )
        if token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.metadata_call_credentials(_AuthMetadata(token))
            )
    if aio:
        return record_limits(LoopBoundChannel(_aio_factory(address, opts, creds, token)), opts)
    if creds is not None:
        return record_limits(grpc.secure_channel(address, creds, options=opts), opts)
    channel = grpc.insecure_channel(address, options=opts)
    if token:
        channel = grpc.intercept_channel(channel, _SyncTokenInterceptor(token))
    return record_limits(channel, opts)
