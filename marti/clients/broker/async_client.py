"""The asyncio broker client (:class:`AsyncMartiCommClient`, exported as ``marti.aio.MartiCommClient``)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

from marti.api.broker.v1 import broker_pb2
from marti.api.broker.v1 import broker_service_pb2 as pb
from marti.api.broker.v1 import broker_service_pb2_grpc as pb_grpc
from marti.errors import BatchTooLargeError, ForkedAioError
from marti.rpc.client.calls import acall, aiterate
from marti.rpc.client.transport import check_aio_usable

from .args import flag_arg
from .core import TRANSIENT_ERRORS
from .protocol import TIMER_RETRY_S, _ClientBase, _publish_result, _state_entry
from .types import AgentStateEntry, BatchRefusedError, DeadLetter, Message, PublishResult

_LOG = logging.getLogger("marti.broker.client")

#: Unclosed asyncio clients that may hold buffered messages (added when their buffers fill, dropped by a flush
#: that empties them and by ``close``): kept alive, so that :func:`_flush_at_exit` can still send them.
_UNSENT: set[AsyncMartiCommClient] = set()


def _flush_at_exit() -> None:
    """Sends what every unclosed :class:`AsyncMartiCommClient` still buffers when the process exits (see
    :meth:`AsyncMartiCommClient._flush_on_exit`)."""
    for client in list(_UNSENT):
        client._flush_on_exit()


# atexit runs last-registered first: this runs before grpc's own exit handlers (grpc is imported above).
atexit.register(_flush_at_exit)


class AsyncMartiCommClient(_ClientBase):
    """asyncio twin of :class:`MartiCommClient` (exported as ``marti.aio.MartiCommClient``).

    Construct it, then ``await client.connect()`` or use ``async with``. Arguments (the token's fallback to
    ``MARTI_BROKER_TOKEN`` / ``MARTI_TOKEN`` included) are those of :class:`MartiCommClient` (``channel`` is a
    ``grpc.aio.Channel``; ``on_error`` is called in the event loop); a token that is not printable ASCII
    raises ``InvalidArgumentError`` here, before any rpc. Refused batches are reported exactly as by
    :class:`MartiCommClient`: the call that sent them raises :class:`BatchRefusedError`, or, for the flush
    timer's batches, the next call does.

    Batching is that of :class:`MartiCommClient` (same defaults: batches of 128, a linger of 1 ms, and
    ``send_when_idle``: a message buffered while no batch of this client is in flight goes out at once, those
    buffered while one is go out together when it ends); the flush timer is a task of the event loop, started
    by ``connect``. When the loop ends with messages still buffered and the client not closed (``asyncio.run``
    returns without ``close``), that task sends them before it ends; a failure then is logged. Without a
    timer (``update_frequency_s=0`` or ``batching_size=1``) ``connect`` starts a task that only does that. A
    loop run by ``run_until_complete`` cancels no task when it ends: what the client still buffers then (and a
    batch the stopped loop left in flight) is sent when the process exits, over a sync channel of its own
    (on a caller's ``channel``, an error naming the messages is logged instead).

    Fork: in a process forked while its parent had ``grpc.aio`` channels open (a ``multiprocessing`` worker
    using the parent's client), every call that sends raises :class:`~marti.errors.ForkedAioError` at once,
    before the buffers are touched: messages buffered at fork time stay buffered (the error names them) and
    the message being sent is not buffered, so nothing is dropped as a refused batch. Use the sync client
    there, or the ``spawn`` start method.
    """

    _AIO = True

    def _open(self) -> None:
        """Nothing to send yet: :meth:`connect` joins the session from the event loop."""
        self._send_lock: asyncio.Lock | None = None
        self._wake: asyncio.Event | None = None
        self._flusher: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connected = False
        # The buffers a flush took and has not sent yet (the batch in flight and those after it), else None.
        self._taken: tuple[list, list] | None = None

    async def connect(self) -> AsyncMartiCommClient:
        """Joins the session as this agent (creating it if needed; from then on broadcasts reach the agent,
        before its first ``get_messages``) and starts the flush timer. Idempotent. Returns self.

        The send lock and the flush timer belong to the event loop that runs them: used from a new loop (a
        second ``asyncio.run``, a thread with its own loop), the client makes both anew there, so batched
        messages keep being flushed on time.

        Raises:
            FailedPreconditionError: The client is closed.
            NotFoundError: The session has a fixed roster that leaves out ``agent_id``.
            UnavailableError: The broker cannot be reached.
        """
        self._ready()
        return await self._ensure_connected()

    async def _ensure_connected(self) -> AsyncMartiCommClient:
        """:meth:`connect` without the closed check (``close`` flushes through it). Every call that sends
        goes through it first, so in a process forked while its parent had ``grpc.aio`` channels open it
        raises :class:`ForkedAioError` before anything is taken out of the buffers or added to them (the
        message names the messages that stay buffered)."""
        buffered = self._buffered_text()
        check_aio_usable(f"; this broker client keeps its {buffered} unsent" if buffered else "")
        self._bind_loop()
        if self._connected:
            return self
        self._joined(await acall(self._stub.CreateSession, self._join_request(), self.timeout_s))
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
        self._wake = asyncio.Event()
        if self._connected:
            self._start_flusher()

    def _start_flusher(self) -> None:
        """Starts the client's task in the running loop: the flush timer, or, without one
        (``update_frequency_s=0`` or ``batching_size=1``), a task that only waits for the loop's end; either
        sends what is still buffered when the loop ends without ``close`` (:meth:`_flush_loop`)."""
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    def _kick(self) -> None:
        """Wakes the flush timer task: the buffers are no longer empty, or a batch in flight ended with
        messages buffered meanwhile (called in the client's loop). Also keeps the client for
        :func:`_flush_at_exit` until a flush empties its buffers."""
        _UNSENT.add(self)
        if self._wake is not None:
            self._wake.set()

    async def _flush_loop(self) -> None:
        """The flush timer task (see :meth:`MartiCommClient._flush_loop`): idle while nothing is buffered,
        sends the buffers once they are due (at once while no batch is in flight with ``send_when_idle``,
        else when the batch in flight ends or the oldest message has waited ``update_frequency_s``). Cancelled
        by ``close``, by the client's move to another loop, or by the end of its loop: in the last case, it
        first sends what is still buffered. Without a timer (:meth:`_wants_timer` false) it only waits for
        that cancel."""
        try:
            if self._wants_timer():
                await self._timer_loop()
            else:
                await asyncio.get_running_loop().create_future()  # never set: waits for the cancel
        except asyncio.CancelledError:
            if (
                not self._core.closed
                and self._flusher is asyncio.current_task()
                and self._core.has_buffered()
            ):
                await self._flush_at_loop_end()
            raise

    async def _timer_loop(self) -> None:
        """The flush timer proper (run by :meth:`_flush_loop`, which handles its cancel)."""
        wake = self._wake
        while True:
            wake.clear()
            delay = self._core.flush_delay()
            if delay is None:
                await wake.wait()
            elif delay > 0:  # the end of the batch in flight wakes it earlier
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await wake.wait()
            else:
                try:
                    await self._flush(acks=False, background=True)
                except TRANSIENT_ERRORS:
                    await asyncio.sleep(max(self._core.update_frequency_s, TIMER_RETRY_S))
                except ForkedAioError:  # a forked child: no flush can succeed; the next call raises it
                    return
                except Exception:  # refused: kept for the next call (and passed to on_error)
                    pass

    async def _flush_at_loop_end(self) -> None:
        """Sends the buffers when the loop ends without ``close``; logs (as an error) what it cannot send."""
        try:
            await self._flush(acks=False)
        except BatchRefusedError as err:
            _LOG.error("at the end of its event loop, broker client %r (session %r): %s", self.agent_id,
                       self.session, err)  # fmt: skip
        except Exception as exc:
            ids = self._core.buffered_ids()
            _LOG.error(
                "at the end of its event loop, broker client %r (session %r) could not send %d buffered "
                "message(s) (ids %s): %s", self.agent_id, self.session, len(ids), ", ".join(ids[:5]), exc,
            )  # fmt: skip

    def _flush_on_exit(self) -> None:
        """At process exit, for a client never closed that still buffers messages (its event loop ended without
        cancelling its task: ``loop.run_until_complete``, unlike ``asyncio.run``): sends them over a sync
        channel of its own (the loop may be closed), logging what it cannot send
        (:meth:`_ClientBase._send_at_exit`). On a caller's channel, which it cannot dial again, it logs an error
        naming the client and the messages not sent.

        A flush its loop left in flight (stopped with its rpc pending: the loop will not run it again) has its
        messages put back in front first; they go out again with the same ids, so the broker's dedup delivers
        each once."""
        if self._core.closed:
            return
        if self._taken is not None and not (self._loop is not None and self._loop.is_running()):
            self._core.restore_buffers(*self._taken)
            self._taken = None
        if not self._core.has_buffered():
            return
        self._wake = None  # its loop will not run again (and may be closed): nothing to wake there
        if self._dial is None:
            _LOG.error(
                "at exit, broker client %r (session %r): %s were not sent (its event loop ended without close(), "
                "and it cannot dial the caller's channel again)", self.agent_id, self.session, self._buffered_text(),
            )  # fmt: skip
            return
        channel = self._dial(aio=False)
        try:
            stub = pb_grpc.BrokerServiceStub(channel)
            self._send_at_exit(lambda: self._flush_blocking(stub, background=False))
        finally:
            channel.close()

    async def send_message(
        self,
        receiver_id: str | Sequence[str],
        message: Any,
        *,
        content_type: str | None = None,
        ttl_s: float = 0.0,
    ) -> str:
        """Async :meth:`MartiCommClient.send_message` (same arguments, return value and errors)."""
        env = self._unicast_envelope(receiver_id, message, content_type, ttl_s)
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
        env = self._topic_envelope(topic, message, content_type, ttl_s)
        flag_arg("require_subscribers", require_subscribers)
        return _publish_result(env.message_id, topic, await self._send_now(env, False), require_subscribers)

    async def broadcast(
        self, message: Any, *, content_type: str | None = None, ttl_s: float = 0.0
    ) -> PublishResult:
        """Async :meth:`MartiCommClient.broadcast`: sends at once and returns how many agents got it."""
        env = self._broadcast_envelope(message, content_type, ttl_s)
        resp = await self._send_now(env, True)
        return PublishResult(env.message_id, resp.enqueued, resp.duplicates > 0)

    async def _send_now(self, env: broker_pb2.Envelope, broadcast: bool):
        """Async :meth:`MartiCommClient._send_now`."""
        await self._ensure_connected()
        async with self._send_lock:
            await self._flush_locked(background=False)
            self._raise_refused()  # a timer flush that was in flight meanwhile
            item = [(env, time.perf_counter())]
            try:
                return await self._send_batch(*self._one_message_rpc(broadcast), item)
            except Exception as exc:
                raise self._one_message_failed(exc, item, broadcast) from None

    async def _enqueue(self, env: broker_pb2.Envelope, broadcast: bool) -> None:
        """Buffers ``env``; sends the batch now if it is full, else wakes the flush timer if it is first."""
        await self._ensure_connected()
        full, first = self._core.buffer_add(env, broadcast)
        if full:
            await self._flush(acks=False)
        elif first:
            self._kick()

    async def flush(self, acks: bool = True) -> None:
        """Async :meth:`MartiCommClient.flush` (same guarantee and errors)."""
        self._ready()
        await self._flush(flag_arg("acks", acks))
        self._raise_refused()  # a timer flush that was in flight when this call began

    async def _flush(self, acks: bool, background: bool = False) -> None:
        """Sends the buffers (the timer's ``background`` flush only if still due once it holds the send lock),
        then, if ``acks``, the pending acks; then a caller's flush raises the oldest refusal not raised yet (as
        :meth:`MartiCommClient._flush`)."""
        await self._ensure_connected()
        async with self._send_lock:
            try:
                if not background or self._flush_due():
                    await self._flush_locked(background)
            finally:
                if not self._core.has_buffered():
                    _UNSENT.discard(self)
        if acks:
            ids = self._core.take_acks()
            if ids:
                await acall(self._stub.Ack, self._acks_request(ids), self.timeout_s)
        if not background:
            self._raise_refused()

    async def _flush_locked(self, background: bool) -> None:
        """Sends the buffers (the caller holds the send lock); a cancelled send puts its batch back (the broker
        may have it: a retry reuses the ids, so it is delivered once)."""
        unicast, bcast = self._taken = self._core.take_buffers()
        try:
            await self._send_all(self._stub.Send, pb.SendRequest, unicast, background)
            await self._send_all(self._stub.Broadcast, pb.BroadcastRequest, bcast, background)
        except asyncio.CancelledError:
            self._core.restore_buffers(unicast, bcast)
            self._kick()
            raise
        except Exception as exc:
            raise self._failed(exc, unicast, bcast, background) from None
        finally:
            self._taken = None

    async def _send_all(self, method, request_cls, items: list, background: bool) -> None:
        """Async :meth:`MartiCommClient._send_all`: ``items`` in batches the broker takes, each sent (or refused
        alone) batch removed from ``items`` (what is left on an error or a cancel was not sent)."""
        while items:
            n = self._core.batch_count(items)
            try:
                await self._send_batch(method, request_cls, items[:n])
            except Exception as exc:
                n = self._batch_failed(exc, items, n, background)
            del items[:n]

    async def _send_batch(self, method, request_cls, items: list):
        req, frame = self._batch_request(request_cls, items)
        with self._in_flight():
            resp = await acall(method, req, self.timeout_s)
        self._core.sent_ok(items, frame)
        return resp

    async def get_messages(self, max_messages: int | None = None, timeout_s: float = 0.0) -> list[Message]:
        """Async :meth:`MartiCommClient.get_messages` (same errors; a close under the wait raises the
        closed-client ``FailedPreconditionError``, never ``asyncio.CancelledError``)."""
        self._ready()
        max_messages, wait_s = self._receive_args(max_messages, timeout_s)
        self._raise_undecodable()  # a message of an earlier delivery that did not decode
        await self._flush(acks=False)
        self._raise_refused()  # a timer flush that was in flight meanwhile
        req, acks = self._receive_request(max_messages, wait_s)
        try:
            with self._closing_guard():
                resp = await acall(self._stub.Receive, req, self.timeout_s + wait_s)
        except BaseException:
            self._restore_acks(acks)
            raise
        return self._received(resp.frame)

    def subscribe(
        self, max_batch_messages: int | None = None, max_unacked: int = 0
    ) -> AsyncIterator[Message]:
        """Async iterator over pushed messages (see :meth:`MartiCommClient.subscribe`; same errors, the
        argument and closed checks at once). A close under the wait raises the closed-client
        ``FailedPreconditionError`` from the iteration, never ``asyncio.CancelledError``."""
        return self._pushed(self._subscribe_request(max_batch_messages, max_unacked))

    async def _pushed(self, req: pb.SubscribeRequest) -> AsyncIterator[Message]:
        """The messages of a Subscribe stream; with auto-ack each message is acked when the caller asks for
        the next one (:meth:`_Core.handled`), and those acked are sent before the next batch is read."""
        await self._ensure_connected()
        stream = aiterate(self._stub.Subscribe(req), end_on_cancel=True)
        async with aclosing(stream):
            with self._closing_guard():
                async for resp in stream:
                    for msg in self._core.unpack(resp.frame, ack_all=False):
                        yield msg
                        self._core.handled(msg.message_id)
                    ids = self._core.take_acks()
                    if ids:
                        await acall(self._stub.Ack, self._acks_request(ids), self.timeout_s)
                    self._raise_undecodable()  # a message of this batch that did not decode ends the iteration
                if self._core.closed:  # the closed channel cancelled the stream
                    raise self._core.closed_error()

    async def ack(self, message_ids: Sequence[str]) -> int:
        """Async :meth:`MartiCommClient.ack` (more ids than the broker takes in one Ack are acked in parts)."""
        req = self._ack_request(message_ids)
        try:
            return (await acall(self._stub.Ack, req, self.timeout_s)).acked
        except BatchTooLargeError as refused:
            parts = self._ack_parts(req, refused)
        return sum([(await acall(self._stub.Ack, part, self.timeout_s)).acked for part in parts])

    async def broadcast_state(
        self, state: Any, *, content_type: str | None = None, expected_version: int | None = None
    ) -> int:
        """Async :meth:`MartiCommClient.broadcast_state` (buffered messages are sent first, as there)."""
        req = self._put_state_request(state, content_type, expected_version)
        await self._ensure_connected()
        async with self._send_lock:
            await self._flush_locked(background=False)
            self._raise_refused()  # a timer flush that was in flight meanwhile
        return (await acall(self._stub.PutState, req, self.timeout_s)).state.version

    async def get_agent_states(self, exclude_self: bool = True) -> dict[str, Any]:
        """Async :meth:`MartiCommClient.get_agent_states`."""
        return {e.agent_id: e.value for e in await self.get_agent_state_entries(exclude_self)}

    async def get_agent_state_entries(self, exclude_self: bool = True) -> list[AgentStateEntry]:
        """Async :meth:`MartiCommClient.get_agent_state_entries`."""
        req = self._get_states_request(exclude_self)
        await self._ensure_connected()
        return [_state_entry(s) for s in (await acall(self._stub.GetStates, req, self.timeout_s)).states]

    async def read_dead_letters(
        self, max_messages: int | None = None, *, receiver: str | None = None, remove: bool = False
    ) -> list[DeadLetter]:
        """Async :meth:`MartiCommClient.read_dead_letters`."""
        req = self._dead_letters_request(max_messages, receiver, remove)
        await self._ensure_connected()
        return self._dead_letters(await acall(self._stub.ReadDeadLetters, req, self.timeout_s))

    async def get_broker_stats(self, whole_broker: bool = False) -> broker_pb2.BrokerStats:
        """The broker's counters for this session (or the whole broker)."""
        return (await acall(self._stub.GetStats, self._stats_request(whole_broker), self.timeout_s)).stats

    async def close(self) -> None:
        """Flushes, stops the timer and closes the channel; then raises a refusal no call has raised yet.

        Every later call, and a ``get_messages`` or ``subscribe`` waiting in another task, raises the
        closed-client ``FailedPreconditionError`` (as :meth:`MartiCommClient.close`); a second ``close``
        does nothing.

        Raises:
            BatchRefusedError: The final flush, or an earlier timer flush, was refused (closed anyway).
            UnavailableError, DeadlineExceededError: The final flush failed transiently (closed anyway; a
                note on the error lists the ids of the messages not sent).
        """
        if not self._core.close():  # from now on every call raises, and nothing more is buffered
            return
        _UNSENT.discard(self)  # what the final flush does not send is reported by the error it raises
        try:
            if self._connected:
                await self._flush(acks=True)
        except Exception as exc:
            self._unsent_note(exc)
            raise
        finally:
            if self._flusher is not None:
                self._flusher.cancel()
            self._channel.mark_closed()  # the final flush is done: a call still waiting gets the closed error
            if self._own_channel:
                await self._channel.close()
        self._raise_refused()

    async def __aenter__(self) -> AsyncMartiCommClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
