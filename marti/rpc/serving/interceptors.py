"""Server interceptors: request id, access log, Prometheus metrics, bearer-token auth and error mapping.

One wrapper (:class:`ServerInterceptor`) wraps every method handler, unary and streaming alike, so each
concern is applied exactly once per call:

1. a request id is taken from the ``x-request-id`` metadata or generated, and stored in :data:`REQUEST_ID`;
2. when a token is configured, calls without ``authorization: Bearer <token>`` end with UNAUTHENTICATED
   (the standard health service is exempt so probes and orchestrators can check liveness);
3. a :class:`marti.errors.MartiError` raised by the servicer ends the call with the mapped status code;
4. per-method counts, status codes and latencies go to Prometheus; one access-log line per call.

A call to a method the server does not serve ends with UNIMPLEMENTED (:class:`marti.errors.UnimplementedError`
on the client) saying which server was called, which method, and which services it serves instead, where gRPC
alone would answer ``Method not found!``. Such calls are not counted per method (a caller could invent
unbounded method names).
"""

from __future__ import annotations

import contextvars
import hmac
import inspect
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from prometheus_client import Counter, Histogram

from marti import errors
from marti.rpc.errors import abort_status, status_code_for

#: The request id of the call being served (for logs in servicers and cores).
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("marti_request_id", default="")

#: Services that never require a token (liveness probes must work without secrets).
AUTH_EXEMPT_SERVICES = frozenset({"grpc.health.v1.Health"})

_ACCESS_LOG = logging.getLogger("marti.access")
_LOG = logging.getLogger("marti.rpc")

RPC_COUNT = Counter("marti_rpc_total", "Completed rpcs", ["service", "method", "code"])
RPC_LATENCY = Histogram(
    "marti_rpc_latency_seconds",
    "Rpc latency in seconds (streams: whole stream lifetime)",
    ["service", "method"],
    buckets=(0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, 30, 100),
)


def _split_method(full_method: str) -> tuple[str, str]:
    _, _, rest = full_method.partition("/")
    service, _, method = rest.partition("/")
    return service, method


class _BadRequest:
    """Stands in for a request whose bytes did not parse, so the call can fail with INVALID_ARGUMENT."""

    def __init__(self, error: errors.InvalidArgumentError) -> None:
        self.error = error


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """Wrap a request deserializer so undecodable bytes become a :class:`_BadRequest` instead of an
    UNKNOWN/INTERNAL status raised by grpc itself."""
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - any decode failure is the caller's bad input
            name = getattr(getattr(deserializer, "__self__", None), "__name__", "request")
            return _BadRequest(errors.InvalidArgumentError(f"request is not a valid {name}: {exc}"[:1024]))

    return deserialize


def _checked(request: Any) -> Any:
    """Raise for an undecodable unary request; wrap a request stream so a bad item raises when reached."""
    if isinstance(request, _BadRequest):
        raise request.error
    if hasattr(request, "__aiter__"):

        async def items() -> AsyncIterator[Any]:
            async for item in request:
                if isinstance(item, _BadRequest):
                    raise item.error
                yield item

        return items()
    return request


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """Applies request ids, auth, error mapping, metrics and access logging to every rpc.

    Args:
        token: Required bearer token, or ``None`` to accept every caller.
        served: Full names of the services hosted, named to a caller of a method the server does not serve.

    Attributes:
        address: ``host:port`` of the server once bound (``marti.rpc.serving.server`` sets it), named in the same message.
    """

    def __init__(self, token: str | None = None, served: Sequence[str] = ()) -> None:
        self._token = token
        self._served = [name for name in served if not name.startswith("grpc.")]
        self.address = ""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        """Wrap the handler found by ``continuation`` (see grpc.aio.ServerInterceptor)."""
        handler = await continuation(handler_call_details)
        service, method = _split_method(handler_call_details.method)
        meta = {k: v for k, v in (handler_call_details.invocation_metadata or ())}
        auth_error = self._check_auth(service, meta)
        if handler is None:  # a caller without the token learns nothing about what is served
            return _refusal(auth_error or self._unknown_method(handler_call_details.method))
        request_id = str(meta.get("x-request-id") or uuid.uuid4().hex)
        wrap = _Wrapper(service, method, request_id, auth_error)
        deserialize = _tolerant(handler.request_deserializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                wrap.unary(handler.unary_unary), deserialize, handler.response_serializer
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                wrap.stream(handler.unary_stream), deserialize, handler.response_serializer
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                wrap.unary(handler.stream_unary), deserialize, handler.response_serializer
            )
        return grpc.stream_stream_rpc_method_handler(
            wrap.stream(handler.stream_stream), deserialize, handler.response_serializer
        )

    def _unknown_method(self, method: str) -> errors.UnimplementedError:
        """The error of a call to ``method``, which no handler serves."""
        where = f"the server at {self.address}" if self.address else "this server"
        served = ", ".join(self._served) or "no marti service"
        return errors.UnimplementedError(
            f"{where} does not serve {method.lstrip('/')!r}: it serves {served}; "
            "probably a different service listens on that port"
        )

    def _check_auth(self, service: str, meta: dict[str, Any]) -> errors.MartiError | None:
        if self._token is None or service in AUTH_EXEMPT_SERVICES:
            return None
        header = str(meta.get("authorization", ""))
        scheme, _, value = header.partition(" ")
        if not header:
            return errors.UnauthenticatedError("missing 'authorization: Bearer <token>' metadata")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.encode(), self._token.encode()):
            return errors.UnauthenticatedError("invalid bearer token")
        return None


def _refusal(error: errors.MartiError) -> grpc.RpcMethodHandler:
    """A handler that ends any kind of call with ``error`` at once (it reads no request)."""

    async def refuse(request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort_with_status(abort_status(error))

    return grpc.stream_stream_rpc_method_handler(refuse)


def _reset_request_id(token: Any) -> None:
    """Restore :data:`REQUEST_ID` after a call; a cancelled stream's generator is closed from another context,
    where the reset does not apply (and nothing is left to restore)."""
    try:
        REQUEST_ID.reset(token)
    except ValueError:
        pass


class _Wrapper:
    """Per-call wrapper state shared by the unary and streaming paths."""

    def __init__(self, service: str, method: str, request_id: str, auth_error: errors.MartiError | None):
        self.service, self.method, self.request_id, self.auth_error = service, method, request_id, auth_error

    def _finish(self, start: float, code: grpc.StatusCode) -> None:
        elapsed = time.perf_counter() - start
        RPC_COUNT.labels(self.service, self.method, code.name).inc()
        RPC_LATENCY.labels(self.service, self.method).observe(elapsed)
        _ACCESS_LOG.info(
            "rpc %s/%s code=%s ms=%.2f request_id=%s",
            self.service,
            self.method,
            code.name,
            elapsed * 1e3,
            self.request_id,
        )

    async def _fail(self, context: grpc.aio.ServicerContext, exc: BaseException) -> grpc.StatusCode:
        code = status_code_for(exc)
        if not isinstance(exc, errors.MartiError):
            _LOG.exception("unexpected error in %s/%s", self.service, self.method, exc_info=exc)
        await context.abort_with_status(abort_status(exc))
        return code  # pragma: no cover - abort_with_status raises

    @staticmethod
    def _code_of(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
        code = context.code()
        if isinstance(code, grpc.StatusCode):
            return code
        return grpc.StatusCode.OK

    def unary(self, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        """Wrap a unary-response behavior (unary-unary or stream-unary)."""

        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
            token = REQUEST_ID.set(self.request_id)
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                if self.auth_error is not None:
                    raise self.auth_error
                result = await behavior(_checked(request), context)
                code = self._code_of(context)
                return result
            except errors.MartiError as exc:
                code = status_code_for(exc)
                await self._fail(context, exc)
            except (grpc.aio.AbortError, grpc.aio.UsageError, GeneratorExit):
                code = self._code_of(context)
                raise
            except Exception as exc:  # noqa: BLE001 - last line of defence: never crash the server
                code = grpc.StatusCode.INTERNAL
                await self._fail(context, exc)
            finally:
                self._finish(start, code)
                _reset_request_id(token)

        return wrapped

    def stream(self, behavior: Callable[..., Any]) -> Callable[..., AsyncIterator[Any]]:
        """Wrap a streaming-response behavior (unary-stream or stream-stream)."""

        async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            token = REQUEST_ID.set(self.request_id)
            start = time.perf_counter()
            code = grpc.StatusCode.OK
            try:
                if self.auth_error is not None:
                    raise self.auth_error
                result = behavior(_checked(request), context)
                if inspect.isasyncgen(result) or hasattr(result, "__aiter__"):
                    async for item in result:
                        yield item
                else:
                    await result
                code = self._code_of(context)
            except errors.MartiError as exc:
                code = status_code_for(exc)
                await self._fail(context, exc)
            except (grpc.aio.AbortError, grpc.aio.UsageError, GeneratorExit):
                code = self._code_of(context)
                raise
            except Exception as exc:  # noqa: BLE001
                code = grpc.StatusCode.INTERNAL
                await self._fail(context, exc)
            finally:
                self._finish(start, code)
                _reset_request_id(token)

        return wrapped
