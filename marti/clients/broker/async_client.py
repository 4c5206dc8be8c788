"""The asyncio broker client (:class:`AsyncMartiCommClient`, exported as ``marti.aio.MartiCommClient``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Any

import grpc

from marti.api.broker.v1 import broker_pb2
from marti.api.broker.v1 import broker_service_pb2 as pb
from marti.api.broker.v1 import broker_service_pb2_grpc as pb_grpc
from marti.codec.broker import encode_payload
from marti.rpc.calls import acall, aiterate
from marti.rpc.channel import DEFAULT_TIMEOUT_S, make_channel

from .protocol import _IDEMPOTENT, _Core, _state_entry
from .sync_client import _notify, _publish_result
from .types import AgentStateEntry, BatchRefusedError, CommunicationStats, Message, PublishResult


class AsyncMartiCommClient:
    """asyncio twin of :class:`MartiCommClient` (exported as ``marti.aio.MartiCommClient``).

    Construct it, then ``await client.connect()`` or use ``async with``. Arguments (the token's fallback to
    ``MARTI_BROKER_TOKEN`` / ``MARTI_TOKEN`` included) are those of :class:`MartiCommClient` (``channel`` is a
    ``grpc.aio.Channel``; ``on_error`` is called in the event loop); a token that is not printable ASCII
    raises ``InvalidArgumentError`` here, before any rpc. Refused batches are reported exactly as by
    :class:`MartiCommClient`: the call that sent them raises :class:`BatchRefusedError`, or, for the flush
    timer's batches, the next call does.
    """

    def __init__(
        self,
        agent_id: str,
        address: str = "localhost:50051",
        session: str = "default",
        token: str | None = None,
        *,
        topics: Sequence[str] = (),
        batching_size: int = 1,
        max_batch_bytes: int = 1024 * 1024,
        update_frequency_s: float = 0.05,
        compression_level: int = 3,
        auto_ack: bool = True,
        use_dictionary: bool = True,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_frame_bytes: int = 32 * 1024 * 1024,
        dedup_memory: int = 100_000,
        tls_ca_file: str | None = None,
        channel: grpc.aio.Channel | None = None,
        on_error: Callable[[BatchRefusedError], None] | None = None,
    ) -> None:
        self._core = _Core(
            agent_id, session, batching_size, max_batch_bytes, update_frequency_s, compression_level, auto_ack,
            max_frame_bytes, dedup_memory,
        )  # fmt: skip
        self.agent_id = agent_id
        self.session = session
        self.topics = list(topics)
        self.timeout_s = timeout_s
        self.on_error = on_error
        self._use_dictionary = use_dictionary
        self._own_channel = channel is None
        self._channel = channel or make_channel(
            address,
            token=token,
            tls_ca_file=tls_ca_file,
            aio=True,
            idempotent_methods=_IDEMPOTENT,
            service="broker",
        )
        self._stub = pb_grpc.BrokerServiceStub(self._channel)
        self._send_lock: asyncio.Lock | None = None
        self._flusher: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connected = False
        self._closed = False

    async def connect(self) -> AsyncMartiCommClient:
        """Creates (or joins) the session and starts the flush timer. Idempotent. Returns self.

        The send lock and the flush timer belong to the event loop that runs them: used from a new loop (a
        second ``asyncio.run``, a thread with its own loop), the client makes both anew there, so batched
        messages keep being flushed on time.
        """
        self._bind_loop()
        if self._connected:
            return self
        info = await acall(
            self._stub.CreateSession, pb.CreateSessionRequest(session=self.session), self.timeout_s
        )
        if self._use_dictionary and info.zstd_dictionary:
            self._core.set_dictionary(info.zstd_dictionary)
        self._connected = True
        self._start_flusher()
        return self

    def _bind_loop(self) -> None:
        """Make the send lock (and, once connected, the flush timer) for the running loop if it is new."""
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        old, self._flusher = self._flusher, None
        if old is not None and not old.done():
            old_loop = old.get_loop()
            if not old_loop.is_closed():
                old_loop.call_soon_threadsafe(old.cancel)
        self._loop = loop
        self._send_lock = asyncio.Lock()
        if self._connected:
            self._start_flusher()

    def _start_flusher(self) -> None:
        if self._flusher is None and self._core.batching_size > 1 and self._core.update_frequency_s > 0:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        period = self._core.update_frequency_s
        while True:
            await asyncio.sleep(period / 2)
            core = self._core
            if (core.buffer or core.broadcast_buffer) and time.monotonic() - core.first_buffered_at >= period:
                try:
                    await self._flush(acks=False, background=True)
                except Exception:  # transient: still buffered; refused: kept for the next call
                    pass

    def _raise_refused(self) -> None:
        """Raises the oldest refusal the flush timer met, if any (each is raised once)."""
        err = self._core.take_refusal()
        if err is not None:
            raise err

    @property
    def refused_batches(self) -> int:
        """Batches the broker refused since this client was made (each reported as a BatchRefusedError)."""
        return self._core.refused_batches

    @property
    def refused_messages(self) -> int:
        """Messages in the batches the broker refused since this client was made."""
        return self._core.refused_messages

    async def send_message(
        self,
        receiver_id: str | Sequence[str],
        message: Any,
        *,
        content_type: str | None = None,
        ttl_s: float = 0.0,
    ) -> str:
        """Async :meth:`MartiCommClient.send_message` (same arguments, return value and errors)."""
        self._raise_refused()
        receivers = [receiver_id] if isinstance(receiver_id, str) else list(receiver_id)
        env = self._core.envelope(message, receivers, "", content_type, ttl_s)
        await self._enqueue(env, False)
        return env.message_id

    async def publish(
        self,
        topic: str,
        message: Any,
        *,
        content_type: str | None = None,
        ttl_s: float = 0.0,
        require_subscribers: bool = False,
    ) -> PublishResult:
        """Async :meth:`MartiCommClient.publish`: sends at once and returns how many subscribers got it.

        Topic messages are not stored for later subscribers.

        Raises:
            NoSubscribersError: ``require_subscribers`` and no subscriber (a FailedPreconditionError).
            The other errors of :meth:`MartiCommClient.publish`.
        """
        self._raise_refused()
        await self.connect()
        env = self._core.envelope(message, (), topic, content_type, ttl_s)
        async with self._send_lock:
            await self._flush_locked(background=False)
            item = [(env, time.perf_counter())]
            try:
                resp = await self._send_batch(self._stub.Send, pb.SendRequest, item)
            except Exception as exc:
                err = self._core.split_failed(exc, item, [], background=False)
                if isinstance(err, BatchRefusedError):
                    _notify(self.on_error, err)
                raise err from None
        return _publish_result(env.message_id, topic, resp, require_subscribers)

    async def broadcast(self, message: Any, *, content_type: str | None = None, ttl_s: float = 0.0) -> str:
        """Async :meth:`MartiCommClient.broadcast`."""
        self._raise_refused()
        env = self._core.envelope(message, (), "", content_type, ttl_s)
        await self._enqueue(env, True)
        return env.message_id

    async def _enqueue(self, env: broker_pb2.Envelope, broadcast: bool) -> None:
        await self.connect()
        if self._core.buffer_add(env, broadcast):
            await self._flush(acks=False)

    async def flush(self, acks: bool = True) -> None:
        """Async :meth:`MartiCommClient.flush` (same errors)."""
        self._raise_refused()
        await self._flush(acks)

    async def _flush(self, acks: bool, background: bool = False) -> None:
        await self.connect()
        async with self._send_lock:
            await self._flush_locked(background)
        if acks:
            ids = self._core.take_acks()
            if ids:
                await self.ack(ids)

    async def _flush_locked(self, background: bool) -> None:
        unicast, bcast = self._core.take_buffers()
        try:
            if unicast:
                await self._send_batch(self._stub.Send, pb.SendRequest, unicast)
                unicast = []
            if bcast:
                await self._send_batch(self._stub.Broadcast, pb.BroadcastRequest, bcast)
                bcast = []
        except Exception as exc:
            err = self._core.split_failed(exc, unicast, bcast, background)
            if isinstance(err, BatchRefusedError):
                _notify(self.on_error, err)
            raise err from None

    async def _send_batch(self, method, request_cls, items: list):
        frame = self._core.frame(items)
        resp = await acall(
            method, request_cls(session=self.session, sender=self.agent_id, frame=frame), self.timeout_s
        )
        self._core.sent_ok(items, frame)
        return resp

    async def get_messages(self, max_messages: int = 256, timeout_s: float = 0.0) -> list[Message]:
        """Async :meth:`MartiCommClient.get_messages` (same errors)."""
        self._raise_refused()
        await self._flush(acks=False)
        acks = self._core.take_acks()
        req = pb.ReceiveRequest(
            session=self.session,
            agent_id=self.agent_id,
            topics=self.topics,
            max_messages=max_messages,
            timeout_ms=round(timeout_s * 1000),
            ack_message_ids=acks,
        )
        try:
            resp = await acall(self._stub.Receive, req, self.timeout_s + timeout_s)
        except Exception:
            with self._core.lock:
                self._core.pending_acks[:0] = acks
            raise
        return self._core.unpack(resp.frame)

    async def subscribe(self, max_batch_messages: int = 256, max_unacked: int = 0) -> AsyncIterator[Message]:
        """Async iterator over pushed messages (see :meth:`MartiCommClient.subscribe`)."""
        self._raise_refused()
        await self.connect()
        stream = aiterate(
            self._stub.Subscribe(
                pb.SubscribeRequest(
                    session=self.session,
                    agent_id=self.agent_id,
                    topics=self.topics,
                    max_batch_messages=max_batch_messages,
                    max_unacked=max_unacked,
                )
            ),
            end_on_cancel=True,
        )
        async with aclosing(stream):
            async for resp in stream:
                for msg in self._core.unpack(resp.frame):
                    yield msg
                ids = self._core.take_acks()
                if ids:
                    await self.ack(ids)

    async def ack(self, message_ids: Sequence[str]) -> int:
        """Async :meth:`MartiCommClient.ack`."""
        self._raise_refused()
        req = pb.AckRequest(session=self.session, agent_id=self.agent_id, message_ids=list(message_ids))
        return (await acall(self._stub.Ack, req, self.timeout_s)).acked

    async def broadcast_state(
        self, state: Any, *, content_type: str | None = None, expected_version: int | None = None
    ) -> int:
        """Async :meth:`MartiCommClient.broadcast_state`."""
        self._raise_refused()
        await self.connect()
        value, ctype = encode_payload(state, content_type)
        req = pb.PutStateRequest(
            session=self.session, agent_id=self.agent_id, content_type=ctype, value=value
        )
        if expected_version is not None:
            req.expected_version = expected_version
        return (await acall(self._stub.PutState, req, self.timeout_s)).state.version

    async def get_agent_states(self, exclude_self: bool = True) -> dict[str, Any]:
        """Async :meth:`MartiCommClient.get_agent_states`."""
        return {e.agent_id: e.value for e in await self.get_agent_state_entries(exclude_self)}

    async def get_agent_state_entries(self, exclude_self: bool = True) -> list[AgentStateEntry]:
        """Async :meth:`MartiCommClient.get_agent_state_entries`."""
        self._raise_refused()
        await self.connect()
        req = pb.GetStatesRequest(session=self.session, agent_id=self.agent_id, exclude_self=exclude_self)
        return [_state_entry(s) for s in (await acall(self._stub.GetStates, req, self.timeout_s)).states]

    def get_communication_stats(self) -> CommunicationStats:
        """What this client measured (see :class:`CommunicationStats`); never raises a pending refusal."""
        return self._core.stats()

    async def get_broker_stats(self, whole_broker: bool = False) -> broker_pb2.BrokerStats:
        """The broker's counters for this session (or the whole broker)."""
        self._raise_refused()
        req = pb.GetStatsRequest(session="" if whole_broker else self.session)
        return (await acall(self._stub.GetStats, req, self.timeout_s)).stats

    async def close(self) -> None:
        """Flushes, stops the timer and closes the channel; then raises a refusal no call has raised yet.

        Raises:
            BatchRefusedError: The final flush, or an earlier timer flush, was refused (closed anyway).
        """
        if self._closed:
            return
        try:
            if self._connected:
                await self._flush(acks=True)
        finally:
            self._closed = True
            if self._flusher is not None:
                self._flusher.cancel()
            if self._own_channel:
                await self._channel.close()
        self._raise_refused()

    async def __aenter__(self) -> AsyncMartiCommClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
