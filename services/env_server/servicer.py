"""gRPC adapter of the env server: one method per rpc, domain errors raised (the interceptor maps them)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any

from marti.api.env.v1 import env_pb2 as pb
from marti.api.env.v1 import env_service_pb2_grpc as pb_grpc
from marti.env.make import declared_metrics
from marti.env.registry import Registry, default_registry
from marti.errors import BatchTooLargeError, InvalidArgumentError, ResourceExhaustedError
from marti.rpc.client.message_limits import RECEIVE_LIMIT_KEY, client_receive_limit
from marti.rpc.errors import ok_status, to_status_proto
from marti.rpc.serving.server import ServiceSpec
from services.env_server import convert
from services.env_server.core.session_state import BatchItem
from services.env_server.core.sessions import SessionManager
from services.env_server.envs import adapters
from services.env_server.settings import EnvServerSettings

SERVICE_NAME = "marti.api.env.v1.EnvService"
_LOG = logging.getLogger("marti.env_server")
#: Bytes of a response kept free under ``max_message_bytes`` for what wraps a result (the stream's
#: ``SessionResponse`` with its sequence and status, a batch item's status and field tags).
RESPONSE_MARGIN = 1024


def _budget(limit: int, client: int | None) -> int:
    """The largest result a call may return, bytes: the smaller of the server's ``max_message_bytes`` (``limit``)
    and the ``client``'s receive limit (``None``: it told none), less :data:`RESPONSE_MARGIN`; zero or less
    when the limit leaves no room."""
    return (limit if client is None else min(limit, client)) - RESPONSE_MARGIN


def _over(limit: int, client: int | None) -> tuple[str, str]:
    """What a too-large result is over, and a hint: the client's receive limit (``client``, bytes) only when it
    binds (is under the server's ``max_message_bytes``, ``limit``), else the server's."""
    if client is None or client >= limit:
        return f"over the env server's max_message_bytes={limit}", ""
    return (
        f"over the client's receive limit, {client} bytes (its channel's grpc.max_receive_message_length, told "
        f"as {RECEIVE_LIMIT_KEY}; the env server's max_message_bytes={limit} is larger)",
        " (or the client's channel could take more: its options= grpc.max_receive_message_length)",
    )


def _too_large(
    what: str,
    size: int,
    limit: int,
    client: int | None = None,
    why: str = "the env's observations or infos are",
) -> ResourceExhaustedError:
    """The error of a result over the gRPC message limit of its call: names ``what``, its ``size``, the limit
    that binds (:func:`_over`; ``limit``: the server's, ``client``: the client's receive limit, bytes), ``why``
    (``"... are"``: what is too large) and says the call ran. A limit under :data:`RESPONSE_MARGIN` leaves room
    for no result, and the message says so instead of ``why``."""
    over, hint = _over(limit, client)
    if _budget(limit, client) <= 0:
        why = f"that limit is not over the {RESPONSE_MARGIN} bytes kept around a result, so every result is"
    return ResourceExhaustedError(
        f"{what} is {size} bytes, {over} (less {RESPONSE_MARGIN} for the response around it), so it is not "
        f"sent: {why} too large{hint}; the call did run (a step moved the episode on)"
    )


def _told(context: Any) -> int | None:
    """The receive limit the client told in the call's metadata (:data:`RECEIVE_LIMIT_KEY`), bytes; ``None``
    when it told none (an older client, a raw gRPC one) or ``-1``.

    Raises:
        InvalidArgumentError: A value that is not a byte count (named).
    """
    return client_receive_limit(context.invocation_metadata())


class EnvServicer(pb_grpc.EnvServiceServicer):
    """Serves :class:`SessionManager` over gRPC.

    Args:
        sessions: The session core.
        settings: Server settings (batch limit).
    """

    def __init__(self, sessions: SessionManager, settings: EnvServerSettings) -> None:
        self.sessions = sessions
        self.settings = settings
        self._stream_ids = itertools.count(1)
        self._listing: pb.ListEnvsResponse | None = None

    def _fit(self, result: Any, what: str, client: int | None = None) -> None:
        """Refuse a result that could not be sent: gRPC fails a message over ``max_message_bytes`` here or over
        the client's receive limit there, and on the ``Session`` stream that ends the stream and closes every
        session on it.

        Args:
            result: The encoded result (a ``ResetResponse`` or ``StepResponse``).
            what: What it is, for the message (``"the step result of session 'ID'"``).
            client: The receive limit the client told (:func:`client_receive_limit`), bytes, or ``None``.

        Raises:
            ResourceExhaustedError: ``result`` is over :func:`_budget` (:func:`_too_large`).
        """
        size = result.ByteSize()
        if size > _budget(self.settings.max_message_bytes, client):
            raise _too_large(what, size, self.settings.max_message_bytes, client)

    def _trim(self, req: pb.BatchStepRequest, out: pb.BatchStepResponse, client: int | None = None) -> None:
        """Fail the largest step results of a batch in-band, each naming its session (:func:`_too_large`), until
        the batch fits under :func:`_budget` (``client``: the client's receive limit, or ``None``); the other
        results are sent, and items that already carry an error keep it.

        Raises:
            ResourceExhaustedError: The batch is still over the budget with every result failed (too many steps
                for the limit, or a told limit under :data:`RESPONSE_MARGIN`); names the size and the limit.
        """
        limit = self.settings.max_message_bytes
        budget = _budget(limit, client)
        total = out.ByteSize()  # one encoding of the batch (about 1% of the server's CPU per step)
        if total <= budget:
            return
        results = [
            (step, item) for step, item in zip(req.steps, out.items, strict=True) if item.HasField("step")
        ]
        for step, item in sorted(results, key=lambda s: s[1].ByteSize(), reverse=True):
            if total <= budget:
                return
            size = item.ByteSize()
            what = f"the step result of session {step.session_id!r}"
            if size <= budget:
                what += f" (with the other results of its BatchStep, {total} bytes)"
            item.ClearField("step")
            item.status.CopyFrom(to_status_proto(_too_large(what, size, limit, client)))
            total += item.ByteSize() - size
        if total > budget:
            raise _too_large(
                f"the BatchStep response of {len(req.steps)} steps, with every step result failed,",
                total,
                limit,
                client,
                "too many steps for that limit: their errors alone are",
            )

    # ---- handlers shared by the unary rpcs and the stream; env calls run on the session core's worker pool ----
    async def _create(
        self, req: pb.CreateSessionRequest, owner: str | None = None
    ) -> pb.CreateSessionResponse:
        seed = req.seed if req.HasField("seed") else None
        idle_timeout_ms = int(self.sessions.idle_timeout_s * 1000)

        def describe(session: Any) -> pb.CreateSessionResponse:  # in the worker: reads the env's spaces
            return pb.CreateSessionResponse(
                session_id=session.session_id,
                env_id=session.env_id,
                agents=convert.agent_specs(session.env),
                idle_timeout_ms=idle_timeout_ms,
                metrics=declared_metrics(session.env),
            )

        return await self.sessions.create_async(
            req.env_id, convert.map_from_proto(req.config), seed, owner, req.request_id, describe
        )

    async def _reset(
        self, req: pb.ResetRequest, out: pb.ResetResponse | None = None, client: int | None = None
    ) -> pb.ResetResponse:
        seed = req.seed if req.HasField("seed") else None
        options = convert.map_from_proto(req.options) or None
        result = await self.sessions.reset_async(
            req.session_id, seed, options, req.request_id, lambda o, _: convert.reset_to_proto(o, out)
        )
        self._fit(result, f"the reset result of session {req.session_id!r}", client)
        return result

    async def _step(
        self, req: pb.StepRequest, out: pb.StepResponse | None = None, client: int | None = None
    ) -> pb.StepResponse:
        actions = convert.actions_from_proto(req.actions)
        result = await self.sessions.step_async(
            req.session_id,
            actions,
            req.request_id,
            lambda o, base: convert.step_to_proto(o, out, base),
            req.delta_base,
        )
        self._fit(result, f"the step result of session {req.session_id!r}", client)
        return result

    async def _batch(
        self, req: pb.BatchStepRequest, out: pb.BatchStepResponse | None = None, client: int | None = None
    ) -> pb.BatchStepResponse:
        """Run a BatchStep (into ``out`` when given, avoiding a copy of the whole response): the steps of a
        batch's sessions run in few worker jobs (see ``SessionManager.step_batch_async``), each step encoded
        as a delta when its request names the session's latest result; results over the call's limit fail
        in-band (:meth:`_trim`, ``client``: the client's receive limit)."""
        if len(req.steps) > self.settings.max_batch_steps:
            raise BatchTooLargeError(
                f"BatchStep has {len(req.steps)} steps, above max_batch_steps={self.settings.max_batch_steps}",
                max_batch_steps=self.settings.max_batch_steps,
            )
        out = pb.BatchStepResponse() if out is None else out
        out.SetInParent()  # an empty batch still sets the response's oneof
        items = [out.items.add() for _ in req.steps]
        todo: list[BatchItem] = []
        slots: list[pb.BatchStepItem] = []
        for step, item in zip(req.steps, items, strict=True):
            try:
                actions = convert.actions_from_proto(step.actions)
            except Exception as e:  # noqa: BLE001 - a bad item's error travels in-band
                item.status.CopyFrom(to_status_proto(e))
                continue
            todo.append(BatchItem(step.session_id, actions, step.request_id, step.delta_base))
            slots.append(item)

        # Encoding runs in the worker, into the item's own message.
        results = await self.sessions.step_batch_async(
            todo, lambda i, o, base: convert.step_to_proto(o, slots[i].step, base)
        )
        for item, r in zip(slots, results, strict=True):
            if isinstance(r, BaseException):
                item.ClearField("step")
                item.status.CopyFrom(to_status_proto(r))
            else:
                item.status.code = 0
        self._trim(req, out, client)
        return out

    async def _close(self, req: pb.CloseSessionRequest) -> pb.CloseSessionResponse:
        return pb.CloseSessionResponse(closed=await self.sessions.close_async(req.session_id))

    # ---- rpcs ----
    async def ListEnvs(self, request: pb.ListEnvsRequest, context: Any) -> pb.ListEnvsResponse:  # noqa: N802
        """List registered envs (cached after the first call; built on the worker pool, as it may build envs),
        with the live session count and the session cap read now (``marti top`` shows them)."""
        if self._listing is None:
            self._listing = await self.sessions.offload(
                lambda: pb.ListEnvsResponse(
                    envs=[convert.describe_to_proto(s) for s in self.sessions.specs()]
                )
            )
        out = pb.ListEnvsResponse()
        out.CopyFrom(self._listing)
        out.live_sessions = len(self.sessions)
        out.max_sessions = self.sessions.max_sessions
        return out

    async def CreateSession(self, request: pb.CreateSessionRequest, context: Any) -> pb.CreateSessionResponse:  # noqa: N802
        """Create a session."""
        return await self._create(request)

    async def Reset(self, request: pb.ResetRequest, context: Any) -> pb.ResetResponse:  # noqa: N802
        """Reset a session (a result over the call's limit fails: :meth:`_fit`)."""
        return await self._reset(request, client=_told(context))

    async def Step(self, request: pb.StepRequest, context: Any) -> pb.StepResponse:  # noqa: N802
        """Step a session (a result over the call's limit fails: :meth:`_fit`)."""
        return await self._step(request, client=_told(context))

    async def BatchStep(self, request: pb.BatchStepRequest, context: Any) -> pb.BatchStepResponse:  # noqa: N802
        """Step many sessions; errors per item (results over the call's limit too: :meth:`_trim`)."""
        return await self._batch(request, client=_told(context))

    async def CloseSession(self, request: pb.CloseSessionRequest, context: Any) -> pb.CloseSessionResponse:  # noqa: N802
        """Close a session."""
        return await self._close(request)

    async def Session(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.SessionRequest], context: Any
    ) -> AsyncIterator[pb.SessionResponse]:
        """Serve a bidirectional stream, one request at a time in order; sessions created on it close when it
        ends. A result over the stream's limit (the server's, or the receive limit the client told when it
        opened the stream) fails that request alone."""
        client = _told(context)
        owner = f"stream-{next(self._stream_ids)}"
        try:
            async for req in request_iterator:
                yield await self._one(req, owner, client)
        finally:
            await self.sessions.close_owned_async(owner)

    async def _one(self, req: pb.SessionRequest, owner: str, client: int | None) -> pb.SessionResponse:
        resp = pb.SessionResponse(sequence=req.sequence)
        op = req.WhichOneof("op")
        try:
            if op == "create":
                resp.create.CopyFrom(await self._create(req.create, owner))
            elif op == "reset":
                await self._reset(req.reset, resp.reset, client)
            elif op == "step":
                await self._step(req.step, resp.step, client)
            elif op == "close":
                resp.close.CopyFrom(await self._close(req.close))
            elif op == "batch_step":
                await self._batch(req.batch_step, resp.batch_step, client)
            else:
                raise InvalidArgumentError("SessionRequest has no operation set")
            resp.status.CopyFrom(ok_status())
        except Exception as e:  # noqa: BLE001 - in-band error; the stream stays open
            resp.ClearField("result")
            resp.status.CopyFrom(to_status_proto(e))
        return resp


def env_service(
    settings: EnvServerSettings, registry: Registry | None = None, sessions: SessionManager | None = None
) -> ServiceSpec:
    """Build the :class:`ServiceSpec` of the env server (servicer plus the idle-session reaper).

    Args:
        settings: Server settings.
        registry: Env registry (default: built-ins and adapters).
        sessions: Session core to serve (default: a new one from ``settings``); tests pass their own to
            inspect it.

    Returns:
        The spec to pass to ``start_server``/``run_server``/``serve_in_thread``.
    """
    adapters.set_allowed_modules(settings.allowed_modules)
    if sessions is None:
        sessions = SessionManager(
            registry or default_registry(),
            settings.max_sessions,
            settings.idle_timeout_s,
            settings.idempotency_window,
            workers=settings.step_workers,
            idempotency_results=settings.idempotency_results,
        )
    servicer = EnvServicer(sessions, settings)
    state: dict[str, asyncio.Task] = {}

    async def reap_forever() -> None:
        while True:
            await asyncio.sleep(settings.reap_interval_s)
            try:
                await sessions.reap_idle_async()
            except Exception:  # noqa: BLE001 - the reaper must outlive one bad close
                _LOG.exception("reaping idle env sessions failed")

    async def on_start() -> None:
        state["reaper"] = asyncio.get_running_loop().create_task(reap_forever())

    async def on_stop() -> None:
        task = state.pop("reaper", None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # env calls the grace period cut short still hold their sessions: wait up to grace_s more, then close
        await sessions.close_all_async(timeout_s=settings.grace_s)

    return ServiceSpec(
        name=SERVICE_NAME,
        add_to_server=lambda server: pb_grpc.add_EnvServiceServicer_to_server(servicer, server),
        on_start=on_start,
        on_stop=on_stop,
    )
