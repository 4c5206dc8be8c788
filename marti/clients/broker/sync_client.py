"""The synchronous broker client (:class:`MartiCommClient`) and :func:`open_channel`."""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import multiprocessing.util
import os
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from contextlib import closing
from typing import Any

import grpc

from marti.api.broker.v1 import broker_pb2
from marti.api.broker.v1 import broker_service_pb2 as pb
from marti.api.broker.v1 import broker_service_pb2_grpc as pb_grpc
from marti.errors import BatchTooLargeError
from marti.rpc.client.calls import call, iterate
from marti.rpc.client.channel import check_channel, check_timeout_s, make_channel

from .args import flag_arg
from .core import TRANSIENT_ERRORS
from .protocol import _IDEMPOTENT, TIMER_RETRY_S, _ClientBase, _publish_result, _state_entry
from .types import AgentStateEntry, DeadLetter, Message, PublishResult

_LOG = logging.getLogger("marti.broker.client")

#: Live sync clients, re-made for the child by :func:`_after_fork_in_child` when the process forks.
_LIVE: weakref.WeakSet[MartiCommClient] = weakref.WeakSet()
#: Channels a forked child was asked to close although its parent dialed them: kept open (and referenced, so
#: garbage collection does not close them either) because closing a parent's channel in a child can block
#: for good when gRPC skipped its fork handlers (another thread was inside gRPC at fork time).
_INHERITED_CHANNELS: list[grpc.Channel] = []
#: Longest wait of a fork for the batches its live clients have in flight, all clients together (see
#: :func:`_before_fork`), seconds.
FORK_WAIT_S = 5.0
#: Clients whose send lock :func:`_before_fork` holds across the fork (released after it in the parent).
_HELD_FOR_FORK: list[MartiCommClient] = []


def _before_fork() -> None:
    """Before the process forks: waits (at most :data:`FORK_WAIT_S` in all) for the Send or Broadcast every
    live :class:`MartiCommClient` has in flight, and holds its send lock until the fork is done, so no flush
    timer is inside gRPC at fork time. gRPC skips its fork handlers when another thread is inside it, and the
    child then cannot use the inherited channel; with ``send_when_idle`` the timer sends right after each
    lone ``send_message``, so a fork soon after one would often meet its rpc. Once the time is spent, the
    remaining clients are only taken if their lock is free (a client whose broker hangs delays a fork by
    :data:`FORK_WAIT_S` at most, however many there are)."""
    deadline = time.monotonic() + FORK_WAIT_S
    for client in list(_LIVE):
        if client._hold_for_fork(max(0.0, deadline - time.monotonic())):
            _HELD_FOR_FORK.append(client)


def _after_fork_in_parent() -> None:
    """Releases the send locks :func:`_before_fork` held."""
    while _HELD_FOR_FORK:
        _HELD_FOR_FORK.pop()._send_lock.release()


def _after_fork_in_child() -> None:
    """Re-make every live :class:`MartiCommClient`'s threading state in a forked child (see its docstring)."""
    _HELD_FOR_FORK.clear()  # the child makes new locks
    for client in list(_LIVE):
        client._after_fork()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
)


def _flush_at_exit() -> None:
    """Sends what every live, unclosed :class:`MartiCommClient` still buffers when the process exits (see
    :meth:`MartiCommClient._flush_on_exit`)."""
    for client in list(_LIVE):
        client._flush_on_exit()


def _arm_exit_flush_in_child(_: object) -> None:
    """In a ``multiprocessing`` child (fork or forkserver, which end with ``os._exit`` and so skip ``atexit``):
    run :func:`_flush_at_exit` among the child's exit finalizers."""
    multiprocessing.util.Finalize(None, _flush_at_exit, exitpriority=100)


# atexit runs last-registered first: this runs before grpc's own exit handlers (grpc is imported above).
atexit.register(_flush_at_exit)
multiprocessing.util.register_after_fork(_flush_at_exit, _arm_exit_flush_in_child)
if multiprocessing.parent_process() is not None:  # first imported in a multiprocessing child, after its fork
    _arm_exit_flush_in_child(None)


def open_channel(
    address: str,
    *,
    token: str | None = None,
    tls_ca_file: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """Open a sync channel to a broker with the SDK's retry policy, to share between many
    :class:`MartiCommClient` (``channel=``) instead of one connection per client.

    Args:
        address: Broker ``host:port``.
        token: Bearer token sent on every call; ``None`` reads ``MARTI_BROKER_TOKEN``, then ``MARTI_TOKEN``.
        tls_ca_file: PEM CA for TLS.
        options: Extra grpc channel arguments.

    Returns:
        The channel; the caller closes it (``channel.close()``) after the clients using it.
    """
    return make_channel(
        address,
        token=token,
        tls_ca_file=tls_ca_file,
        idempotent_methods=_IDEMPOTENT,
        options=options,
        service="broker",
    )


def whole_broker_stats(channel: grpc.Channel, timeout_s: float | None = None) -> broker_pb2.BrokerStats:
    """The whole broker's counters (every session), read without joining a session as an agent: what an
    observer such as ``marti top`` asks, where :meth:`MartiCommClient.get_broker_stats` needs a joined client.

    Args:
        channel: An open sync channel to the broker (e.g. from :func:`open_channel`); left open.
        timeout_s: Deadline, seconds (``None``: the SDK default).

    Raises:
        InvalidArgumentError: ``channel`` is not a grpc channel, or a bad ``timeout_s`` (named).
        UnavailableError, UnauthenticatedError, ...: From the broker (:mod:`marti.errors`).
    """
    stub = pb_grpc.BrokerServiceStub(check_channel(channel))
    return call(stub.GetStats, pb.GetStatsRequest(session=""), check_timeout_s(timeout_s)).stats


class MartiCommClient(_ClientBase):
    """Synchronous broker client for one agent in one session; thread-safe, no event loop needed.

    Args:
        agent_id: This agent's id (any non-empty unicode string).
        address: Broker ``host:port``.
        session: Session name (a run or an episode); created on connect if it does not exist. The constructor
            joins it as ``agent_id`` (one CreateSession rpc): from then on the agent is a member that
            ``broadcast`` reaches, before its first ``get_messages``.
        token: Bearer token, if the broker requires one; ``None`` reads ``MARTI_BROKER_TOKEN``, then
            ``MARTI_TOKEN`` (as the broker itself does); ``""`` sends none.
        topics: Topics this agent subscribes to. The subscription starts with its first ``get_messages`` or
            ``subscribe`` call: a message published before then does not reach it (``publish`` counts 0).
        batching_size: Messages per batch (default 128; 1 = send immediately, one Send rpc per message). Above
            the broker's ``max_batch_messages``, the first batch it refuses for its count (``BatchTooLargeError``)
            is sent again in parts under the limit, and ``batching_size`` is lowered to it (a warning is logged).
        max_batch_bytes: Payload bytes that close a batch early (default 1 MiB). A batch whose frame is over the
            broker's ``max_frame_bytes`` (``BatchTooLargeError``) is sent again in parts that fit, and
            ``max_batch_bytes`` is lowered to that limit (a warning is logged). A message that alone makes a frame
            over that limit is the only one refused: the messages buffered with it are sent, in order, and the
            flush raises the refusal naming that message's id alone.
        update_frequency_s: The linger: longest time a buffered message waits before its batch is sent
            (seconds; default 0.001, like a Kafka producer's ``linger.ms``); 0 disables the timer (batches
            then go out by count, bytes or ``flush()``, and ``send_when_idle`` has no effect). Unused when
            ``batching_size`` is 1.
        compression_level: zstd level of sent frames, 1..22.
        auto_ack: Ack delivered messages automatically (with the next call, ``flush`` or ``close``).
        use_dictionary: Compress with the session's trained zstd dictionary, if it has one.
        timeout_s: Deadline of each unary call, seconds.
        max_frame_bytes: Decompression limit for delivered frames, bytes. Sent with every Receive and
            Subscribe request: the broker closes a delivered frame before it would pass this (fewer messages
            than ``max_messages``), but delivers a single message larger than it alone (which then fails).
        dedup_memory: Acked message ids remembered to drop their redeliveries (0 = off): with ``auto_ack``
            every message handed out, else those passed to :meth:`ack`. A message not acked yet is handed out
            again when the broker redelivers it (after its ``ack_timeout_s``).
        tls_ca_file: PEM CA for TLS.
        channel: An existing sync channel to use instead of dialing ``address`` (e.g. from
            :func:`open_channel`, shared by many clients; ``token`` and ``tls_ca_file`` are then ignored); it is
            not closed by :meth:`close`.
        on_error: Called with the :class:`BatchRefusedError` of every batch the broker refuses, in the
            thread that sent it (the flush timer's thread for timer flushes); exceptions it raises are
            logged and ignored.
        send_when_idle: Nagle's rule (as TCP without ``TCP_NODELAY``, or the NATS clients' flusher; default
            True): a message buffered while no batch of this client is in flight is sent at once by the flush
            timer, without the linger; messages buffered while a batch is in flight wait for it to end and
            then go out together as the next batch (or when the linger, full count or bytes come first).
            False: every batch waits the linger (a lone message too). Needs the timer
            (``update_frequency_s`` > 0 and ``batching_size`` > 1).

    Batching: ``send_message`` buffers the message and returns (``publish`` and ``broadcast`` do not batch);
    the flush timer (a thread
    started with the first buffered message and asleep while nothing is buffered) sends the buffer at once
    when no batch of this client is in flight (``send_when_idle``), else when the batch in flight ends; the
    batch is also sent when it is full (``batching_size`` messages or ``max_batch_bytes``; that call sends it
    and waits for the broker), when its oldest message has waited ``update_frequency_s`` (the linger, the
    upper bound of any wait), on ``flush()``, before ``publish``, ``broadcast``, ``broadcast_state`` and
    ``get_messages``,
    and on ``close()``. So another agent gets a lone message one Send rpc after ``send_message`` (plus the
    time the timer thread needs to wake, more when the process is busy: it needs the GIL), while a tight send
    loop still fills batches, with what it buffered during the previous batch's rpc; with
    ``send_when_idle=False`` a lone message waits ``update_frequency_s`` (1 ms by default) first. Once
    ``flush()`` returns the broker has every message sent before it. A client never closed still sends what it
    buffers when the process exits (``atexit``, and the exit of a ``multiprocessing`` child); a failure then
    is logged.

    Refused batches: a batch the broker refuses (a limit, bad input, an unknown receiver in a fixed roster,
    permissions) is dropped, never retried, and always reported: the call that sent it raises a
    :class:`BatchRefusedError` carrying the ids of its messages (also an instance of the broker's error
    class, e.g. ``ResourceExhaustedError``); if the flush timer sent it, the client's next call raises it
    instead (every call except ``get_communication_stats``; ``close`` raises it after flushing). They are
    counted in :attr:`refused_batches` / :attr:`refused_messages` and passed to ``on_error``. Transient
    errors (``UnavailableError``, ``DeadlineExceededError``) keep the batch buffered for the next flush.

    Fork: a client made before ``os.fork`` (``multiprocessing``'s ``fork`` start method) keeps working in the
    child. The fork first waits (at most 5 s) for a batch the client has in flight, so that gRPC, which
    cannot fork cleanly while a thread is inside it, runs its fork handlers. The child gets its own send lock
    and its own message-id prefix, and its flush timer, which ``fork`` does not copy, is started again with the
    child's first buffered message, so batches go out on time as in the parent. Messages that were buffered
    at fork time are in both processes' buffers and may be sent by both: they keep their ids, and the broker
    drops a message id it has already accepted (within its ``dedup_window_s``, 600 s by default), so they are
    delivered once. ``close`` in the child flushes the child's buffer but leaves the channel to the parent
    when the parent dialed it.

    Closed: after :meth:`close` every call raises ``FailedPreconditionError`` naming the agent and session
    (the same class as :class:`~marti.aio.MartiCommClient`'s), never a silent no-op.

    Raises:
        InvalidArgumentError: An argument of the wrong type or out of range (named, with the value), or a
            token that is not printable ASCII (raised before any rpc; the message names the position, not
            the token).
        NotFoundError: The session has a fixed roster that leaves out ``agent_id``.
        UnauthenticatedError: The broker requires a token and got none or another one.
        UnavailableError: The broker cannot be reached.
    """

    def _open(self) -> None:
        """Joins the session (CreateSession with this agent: it is a member from now on, so broadcasts reach
        it before it first polls); the flush timer's thread starts with the first buffered message."""
        self._pid = self._channel_pid = os.getpid()
        # Reentrant: the fork hook holds it across os.fork, which a thread holding it may call (on_error).
        self._send_lock = threading.RLock()
        self._timer_lock = threading.Lock()
        self._closed = threading.Event()
        self._wake = threading.Event()
        self._flusher: threading.Thread | None = None
        self._timed = self._wants_timer()
        self._joined(call(self._stub.CreateSession, self._join_request(), self.timeout_s))
        _LIVE.add(self)

    def _start_timer(self) -> None:
        """Starts this process's flush timer thread if batching has a linger and it is not running yet."""
        if not self._timed:
            return
        with self._timer_lock:
            if self._flusher is not None or self._closed.is_set():
                return
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"marti-comm-flush-{self.agent_id}", daemon=True
            )
            self._flusher.start()

    def _after_fork(self) -> None:
        """In a forked child: fresh locks, closed flag and message-id prefix, and no flush timer yet (the
        parent's thread is not copied); :meth:`_enqueue` starts the child's timer with its first message."""
        self._pid = os.getpid()
        self._send_lock = threading.RLock()
        self._timer_lock = threading.Lock()
        closed, self._closed = self._closed.is_set(), threading.Event()
        if closed:
            self._closed.set()
        self._wake = threading.Event()
        self._flusher = None
        self._core.after_fork()

    def _hold_for_fork(self, timeout_s: float) -> bool:
        """Takes the send lock before a fork (see :func:`_before_fork`): waits for a batch in flight, at most
        ``timeout_s`` seconds (0: only if it is free). Returns whether it holds the lock (not for a closed
        client, nor one made in another process)."""
        if self._closed.is_set() or self._pid != os.getpid():
            return False
        return self._send_lock.acquire(timeout=timeout_s) if timeout_s > 0 else self._send_lock.acquire(False)

    def _kick(self) -> None:
        """Wakes the flush timer (starting its thread if this process has none yet): the buffers are no longer
        empty, or a batch in flight ended with messages buffered meanwhile."""
        if not self._timed:
            return
        if self._flusher is None:
            self._start_timer()
        self._wake.set()

    def _flush_loop(self) -> None:
        """The flush timer: sleeps while nothing is buffered (no wake-ups), and sends the buffers once they
        are due (see :meth:`_Core.flush_delay`: at once while no batch is in flight with ``send_when_idle``,
        else once their oldest message has waited ``update_frequency_s``, or when the batch in flight ends and
        wakes it), unless a full batch, ``flush()`` or another call sent them first. A batch that failed
        transiently is retried after at least :data:`TIMER_RETRY_S`; a refused one is dropped and kept for the
        client's next call to raise."""
        closed, wake = self._closed, self._wake
        while not closed.is_set():
            wake.clear()
            delay = self._core.flush_delay()
            if delay is None:
                wake.wait()
            elif delay > 0:
                wake.wait(delay)  # the end of the batch in flight (or close) wakes it earlier
            else:
                try:
                    self._flush(acks=False, background=True)
                except TRANSIENT_ERRORS:
                    closed.wait(max(self._core.update_frequency_s, TIMER_RETRY_S))
                except Exception:  # refused: kept for the next call (and passed to on_error)
                    pass

    # ------------------------------------------------------------------ sending
    def send_message(
        self,
        receiver_id: str | Sequence[str],
        message: Any,
        *,
        content_type: str | None = None,
        ttl_s: float = 0.0,
    ) -> str:
        """Sends a message to one agent or a list of agents.

        Args:
            receiver_id: An agent id or a list of them.
            message: A JSON-able value or bytes.
            content_type: Overrides the payload type.
            ttl_s: Drop the message if undelivered after this many seconds (0: broker default).

        Returns:
            The message id.

        Raises:
            FailedPreconditionError: The client is closed (nothing buffered).
            InvalidArgumentError: A bad ``receiver_id``, ``content_type`` or ``ttl_s``, a message that is
                not JSON-serializable (the path inside it named, e.g. ``message['a'][2]``), or bytes labeled
                ``application/json`` that do not parse as JSON.
            BatchRefusedError: The broker refused the batch carrying this message (with batching, the batch
                this call closed), or a batch the flush timer sent earlier (then this message was not
                buffered); also an instance of the broker's error class (InvalidArgumentError,
                NotFoundError, ResourceExhaustedError...).
            UnavailableError, DeadlineExceededError: Transient; the batch stays buffered.
        """
        env = self._unicast_envelope(receiver_id, message, content_type, ttl_s)
        self._enqueue(env, broadcast=False)
        return env.message_id

    def publish(
        self,
        topic: str,
        message: Any,
        *,
        content_type: str | None = None,
        ttl_s: float = 0.0,
        require_subscribers: bool = False,
    ) -> PublishResult:
        """Sends a message to every agent subscribed to ``topic`` now (except this agent).

        Topic messages are **not stored for later subscribers** (like Redis pub/sub or NATS core): an agent
        that subscribes after the broker accepted the message never gets it. So ``publish`` does not wait
        for a batch: it sends what is buffered (keeping this sender's order), then the message in its own
        Send, and returns how many subscribers it reached.

        Args:
            topic: The topic.
            message: A JSON-able value or bytes.
            content_type: Overrides the payload type.
            ttl_s: Drop undelivered copies after this many seconds (0: broker default).
            require_subscribers: Raise :class:`NoSubscribersError` if nobody is subscribed.

        Returns:
            ``PublishResult(message_id, receivers, duplicate)``; ``receivers == 0``: nobody got it.

        Raises:
            NoSubscribersError: ``require_subscribers`` and no subscriber (a FailedPreconditionError).
            BatchRefusedError: The broker refused this message, an earlier buffered batch, or a batch the
                flush timer sent earlier (then this message was not sent).
            UnavailableError, DeadlineExceededError: Transient. If this message's own Send failed, it stays
                buffered and goes out with the next flush (its receiver count is then not reported); if
                sending the earlier buffered messages failed, those stay buffered and this message was not
                sent.
        """
        env = self._topic_envelope(topic, message, content_type, ttl_s)
        flag_arg("require_subscribers", require_subscribers)
        return _publish_result(env.message_id, topic, self._send_now(env, False), require_subscribers)

    def broadcast(
        self, message: Any, *, content_type: str | None = None, ttl_s: float = 0.0
    ) -> PublishResult:
        """Sends a message to every other agent that has joined the session, at once, and says how many.

        An agent has joined once its client was constructed (the constructor joins the session), or once it
        sent, polled or subscribed. As topic messages, a broadcast is not stored for agents that join later,
        so ``broadcast`` does not wait for a batch: it sends what is buffered (keeping this sender's order),
        then the message in its own Broadcast rpc.

        Args:
            message: A JSON-able value or bytes.
            content_type: Overrides the payload type.
            ttl_s: Drop undelivered copies after this many seconds (0: broker default).

        Returns:
            ``PublishResult(message_id, receivers, duplicate)``: ``receivers`` is the number of agents it was
            enqueued for (0: no other agent has joined; nobody will get it).

        Raises:
            FailedPreconditionError: The client is closed.
            InvalidArgumentError: A bad message (the path named), ``content_type`` or ``ttl_s``.
            BatchRefusedError: The broker refused this message, an earlier buffered batch, or a batch the
                flush timer sent earlier (then this message was not sent).
            UnavailableError, DeadlineExceededError: Transient, as for :meth:`publish`: if this message's own
                rpc failed, it stays buffered and goes out with the next flush (its count is then not known).
        """
        env = self._broadcast_envelope(message, content_type, ttl_s)
        resp = self._send_now(env, True)
        return PublishResult(env.message_id, resp.enqueued, resp.duplicates > 0)

    def _send_now(self, env: broker_pb2.Envelope, broadcast: bool):
        """Sends the buffers, then ``env`` alone (a Broadcast rpc if ``broadcast``, else a Send); returns the
        response. A transient failure of ``env``'s own rpc leaves it buffered."""
        with self._send_lock:
            self._flush_locked(background=False)
            self._raise_refused()  # a timer flush that was in flight meanwhile
            item = [(env, time.perf_counter())]
            try:
                return self._send_batch_blocking(*self._one_message_rpc(broadcast), item)
            except Exception as exc:
                raise self._one_message_failed(exc, item, broadcast) from None

    def _enqueue(self, env: broker_pb2.Envelope, broadcast: bool) -> None:
        """Buffers ``env``; sends the batch now if it is full, else wakes the flush timer if it is first."""
        if self._pid != os.getpid():  # forked without the at-fork hook (os.fork from C code)
            self._after_fork()
        full, first = self._core.buffer_add(env, broadcast)
        if full:
            self._flush(acks=False)
        elif first or (self._flusher is None and self._timed):  # no timer yet here (e.g. in a forked child)
            self._kick()

    def flush(self, acks: bool = True) -> None:
        """Sends every buffered message (and, if ``acks``, every pending auto-ack) now.

        When it returns, the broker has accepted every message this client sent before the call: a batch the
        flush timer was sending meanwhile is waited for, and its refusal raised here.

        Raises:
            UnavailableError, DeadlineExceededError: Transient; the batch stays buffered and the next flush
                retries it (same message ids, so the broker's dedup delivers it once).
            BatchRefusedError: The broker refused a batch (limits, bad input): it is dropped and the error
                lists its message ids; or a batch the flush timer sent earlier, or during this call, was
                refused.
        """
        self._ready()
        self._flush(flag_arg("acks", acks))
        self._raise_refused()  # a timer flush that was in flight when this call began

    def _flush(self, acks: bool, background: bool = False) -> None:
        """Sends the buffers (the timer's ``background`` flush only if still due once it holds the send lock:
        a full batch sent meanwhile leaves a newer buffer to linger), then, if ``acks``, the pending acks; then
        a caller's (not ``background``) flush raises the oldest refusal not raised yet (e.g. of a message too
        large for a frame, refused alone while the rest was sent: :meth:`_batch_failed`)."""
        with self._send_lock:
            if not background or self._flush_due():
                self._flush_locked(background)
        if acks:
            ids = self._core.take_acks()
            if ids:
                call(self._stub.Ack, self._acks_request(ids), self.timeout_s)
        if not background:
            self._raise_refused()

    def _flush_locked(self, background: bool) -> None:
        """Sends the buffers (the caller holds ``_send_lock``): :meth:`_flush_blocking` on this client's stub."""
        self._flush_blocking(self._stub, background)

    # ------------------------------------------------------------------ receiving
    def get_messages(self, max_messages: int | None = None, timeout_s: float = 0.0) -> list[Message]:
        """Returns waiting messages; waits up to ``timeout_s`` for the first one.

        Args:
            max_messages: Most messages to return, 1..the broker's ``max_batch_messages`` (4096 by default; more
                is ``InvalidArgumentError`` from the broker, naming both); None: the broker's default
                (``default_batch_messages``, 256, at most its ``max_batch_messages``).
            timeout_s: Long-poll wait in seconds (0: return at once).

        Returns:
            Messages in delivery order (per sender in increasing ``sequence``).

        Raises:
            NotFoundError, InvalidArgumentError: From the broker.
            InvalidArgumentError: A delivered message did not decode (a payload declared JSON that does not
                parse; its id and sender named). It alone is neither returned nor acked: the broker delivers
                it again, then dead-letters it. The other messages of its delivery are returned, and this
                error is raised by the next ``get_messages`` (before it polls), or at once if there were none.
            BatchRefusedError: A buffered batch (flushed first) or one the flush timer sent was refused.
        """
        self._ready()
        max_messages, wait_s = self._receive_args(max_messages, timeout_s)
        self._raise_undecodable()  # a message of an earlier delivery that did not decode
        self._flush(acks=False)
        self._raise_refused()  # a timer flush that was in flight meanwhile
        req, acks = self._receive_request(max_messages, wait_s)
        try:
            with self._closing_guard():
                resp = call(self._stub.Receive, req, self.timeout_s + wait_s)
        except Exception:
            self._restore_acks(acks)
            raise
        return self._received(resp.frame)

    def subscribe(self, max_batch_messages: int | None = None, max_unacked: int = 0) -> Iterator[Message]:
        """Iterates over messages as the broker pushes them (server stream), forever until closed.

        With auto-ack, a message is acked when the caller asks for the message after it (the acks of a batch
        go out before the next batch is read). Leaving the loop (``break``, an exception in the caller's code)
        acks nothing more: the message it was on and the rest of its batch, which were never handed out, stay
        unacked and the broker delivers them again after its ``ack_timeout_s`` (at-least-once: the message
        the loop was left on comes back too).

        Args:
            max_batch_messages: Most messages per pushed batch, 1..the broker's ``max_batch_messages``; None: the
                broker's default (as ``get_messages``' ``max_messages``).
            max_unacked: Most unacked deliveries outstanding (0: broker default).

        Returns:
            An iterator over the messages, in delivery order.

        Raises:
            FailedPreconditionError: The client is closed (at once), or was closed by another thread while
                the iteration waited (raised by the iteration).
            InvalidArgumentError: ``max_batch_messages`` < 1 or ``max_unacked`` < 0 (at once, named); raised by
                the iteration: ``max_batch_messages`` over the broker's own limit (named), or, once the other
                messages of its batch were handed out, a delivered message that did not decode (neither handed
                out nor acked, as in :meth:`get_messages`).
            BatchRefusedError: A batch the flush timer sent was refused (at once).
        """
        return self._pushed(self._subscribe_request(max_batch_messages, max_unacked))

    def _pushed(self, req: pb.SubscribeRequest) -> Iterator[Message]:
        """The messages of a Subscribe stream; with auto-ack each message is acked when the caller asks for
        the next one (:meth:`_Core.handled`), and those acked are sent before the next batch is read."""
        stream = iterate(self._stub.Subscribe(req), end_on_cancel=True)
        with closing(stream), self._closing_guard():
            for resp in stream:
                for msg in self._core.unpack(resp.frame, ack_all=False):
                    yield msg
                    self._core.handled(msg.message_id)
                ids = self._core.take_acks()
                if ids:
                    call(self._stub.Ack, self._acks_request(ids), self.timeout_s)
                self._raise_undecodable()  # a message of this batch that did not decode ends the iteration
            if self._core.closed:  # the closed channel cancelled the stream
                raise self._core.closed_error()

    def ack(self, message_ids: Sequence[str]) -> int:
        """Acks deliveries by message id (needed only with ``auto_ack=False``). Returns how many were acked.

        Acked ids join the dedup memory (``dedup_memory``): a redelivery of one of them that crosses the ack is
        dropped (and acked again), while a message not acked yet is handed out again when the broker
        redelivers it (after its ``ack_timeout_s``).

        Raises:
            FailedPreconditionError: The client is closed.
            InvalidArgumentError: ``message_ids`` is not a list of non-empty strings.
            BatchRefusedError: A batch the flush timer sent was refused (nothing acked then).

        More ids than the broker takes in one Ack (its ``max_batch_messages``) are acked in parts under it.
        """
        req = self._ack_request(message_ids)
        try:
            return call(self._stub.Ack, req, self.timeout_s).acked
        except BatchTooLargeError as refused:
            parts = self._ack_parts(req, refused)
        return sum(call(self._stub.Ack, part, self.timeout_s).acked for part in parts)

    # ------------------------------------------------------------------ state board
    def broadcast_state(
        self, state: Any, *, content_type: str | None = None, expected_version: int | None = None
    ) -> int:
        """Publishes this agent's state on the session's board (last value wins).

        Args:
            state: JSON-able value or bytes.
            content_type: Overrides the type.
            expected_version: Compare-and-set: succeed only if the current version equals it (0: none yet).

        Returns:
            The new version.

        Messages this client buffered before the call are sent first (as by ``flush``), so another agent that
        sees the new state also finds them in its mailbox, as when every message was sent at once.

        Raises:
            AbortedError: The compare-and-set failed.
            ResourceExhaustedError: Over the broker's max_state_bytes.
            BatchRefusedError: A batch the flush timer sent was refused, or the buffered messages sent first
                were (the state was not put).
            UnavailableError, DeadlineExceededError: Transient; if sending the buffered messages failed, they
                stay buffered and the state was not put.
        """
        req = self._put_state_request(state, content_type, expected_version)
        with self._send_lock:
            self._flush_locked(background=False)
            self._raise_refused()  # a timer flush that was in flight meanwhile
        return call(self._stub.PutState, req, self.timeout_s).state.version

    def get_agent_states(self, exclude_self: bool = True) -> dict[str, Any]:
        """Returns ``{agent_id: state}`` of the session's board (this agent left out if ``exclude_self``).

        Raises:
            BatchRefusedError: A batch the flush timer sent was refused.
        """
        return {e.agent_id: e.value for e in self.get_agent_state_entries(exclude_self)}

    def get_agent_state_entries(self, exclude_self: bool = True) -> list[AgentStateEntry]:
        """Returns the board with versions and timestamps, sorted by agent id.

        Raises:
            BatchRefusedError: A batch the flush timer sent was refused.
        """
        resp = call(self._stub.GetStates, self._get_states_request(exclude_self), self.timeout_s)
        return [_state_entry(s) for s in resp.states]

    def read_dead_letters(
        self, max_messages: int | None = None, *, receiver: str | None = None, remove: bool = False
    ) -> list[DeadLetter]:
        """Reads the session's dead letters, oldest first: the messages the broker gave up delivering (after
        ``max_delivery_attempts`` deliveries without an ack, e.g. a payload that does not decode, which
        ``get_messages`` raised about and never acked, or a receiver that never acks).

        A letter whose payload does not decode is returned too (``message`` None, raw ``payload`` and
        ``decode_error``); nothing of the batch is raised for it. There is no cursor: without ``remove`` each
        call returns the same oldest letters; with it the broker drops the letters it returns, so repeated
        calls drain the queue. The broker keeps at most its ``max_dead_letters`` per session (oldest dropped).

        Args:
            max_messages: Most letters returned, 1..the broker's ``max_batch_messages`` (4096 by default); None:
                the broker's default (as ``get_messages``' ``max_messages``).
                The broker returns fewer rather than pass this client's ``max_frame_bytes`` (or its own limits)
                in bytes, but at least one letter when one is there.
            receiver: Only the letters addressed to this agent; None: every agent's.
            remove: Remove the returned letters from the broker (only with ``receiver`` None).

        Returns:
            The letters, oldest first; ``[]`` when the queue is empty.

        Raises:
            InvalidArgumentError: A bad argument, or ``remove`` with a ``receiver`` (named); ``max_messages``
                over the broker's ``max_batch_messages`` (from the broker).
            BatchRefusedError: A batch the flush timer sent was refused.
        """
        req = self._dead_letters_request(max_messages, receiver, remove)
        return self._dead_letters(call(self._stub.ReadDeadLetters, req, self.timeout_s))

    # ------------------------------------------------------------------ stats and lifecycle
    def get_broker_stats(self, whole_broker: bool = False) -> broker_pb2.BrokerStats:
        """The broker's counters for this session (or the whole broker).

        Raises:
            BatchRefusedError: A batch the flush timer sent was refused.
        """
        return call(self._stub.GetStats, self._stats_request(whole_broker), self.timeout_s).stats

    def close(self) -> None:
        """Flushes buffered messages and pending acks, stops the flush timer and closes the channel.

        Every later call (and a ``get_messages`` or ``subscribe`` another thread has waiting) raises
        ``FailedPreconditionError`` naming the agent; a second ``close`` does nothing. A message is either
        sent by this final flush or reported by the error it raises: nothing is dropped silently.

        In a forked child, a channel the parent dialed is left to the parent (kept, not closed): closing it
        there could block for good.

        Raises:
            BatchRefusedError: The final flush, or an earlier timer flush, was refused (the client is
                closed anyway).
            UnavailableError, DeadlineExceededError: The final flush failed transiently; the client is closed
                anyway, and a note on the error lists the ids of the messages it did not send.
        """
        if not self._core.close():  # from now on every call raises, and nothing more is buffered
            return
        try:
            self._flush(acks=True)
        except Exception as exc:
            self._unsent_note(exc)
            raise
        finally:
            self._closed.set()
            self._wake.set()
            if self._flusher is not None:
                self._flusher.join(timeout=5)
            self._channel.mark_closed()  # the final flush is done: a call still waiting gets the closed error
            if self._own_channel:
                if self._channel_pid == os.getpid():
                    self._channel.close()
                else:
                    _INHERITED_CHANNELS.append(self._channel)
        self._raise_refused()

    def _flush_on_exit(self) -> None:
        """At process exit, for a client never closed: sends its buffered messages, and logs (as errors) what
        it could not send and the refusals no call has raised yet, since no later call will report them.

        A batch the flush timer has in flight is waited for first (at most ``timeout_s``): its messages are no
        longer buffered, and the timer is a daemon thread that the interpreter stops right after."""
        if self._core.closed:
            return
        if not self._send_lock.acquire(timeout=self.timeout_s):
            _LOG.error(
                "at exit, broker client %r (session %r): a batch was still in flight after %.1f s; "
                "its messages may not have reached the broker", self.agent_id, self.session, self.timeout_s,
            )  # fmt: skip
            return
        try:
            self._send_at_exit(lambda: self._flush(acks=False))
        finally:
            self._send_lock.release()

    def __enter__(self) -> MartiCommClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
