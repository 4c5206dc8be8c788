"""Protocol logic of the broker SDK shared by the sync and async clients.

:class:`_ClientBase` is the half of both clients that does no rpc of the event loop's: the constructor (argument
checks, the channel and stub), the requests each method sends, what is done with a failed batch and with a
response, and the blocking flush (the sync client's, and the asyncio client's at process exit). The state both
keep between calls is :class:`~.core._Core`. :class:`~.sync_client.MartiCommClient` and
:class:`~.async_client.AsyncMartiCommClient` add only the calls (``call`` or ``await acall``), their lock and
their flush timer.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from marti.api.broker.v1 import broker_pb2
from marti.api.broker.v1 import broker_service_pb2 as pb
from marti.api.broker.v1 import broker_service_pb2_grpc as pb_grpc
from marti.api.common.v1 import common_pb2
from marti.codec.broker import decode_payload, encode_payload
from marti.errors import (
    BatchTooLargeError,
    InvalidArgumentError,
)
from marti.rpc.client.calls import call
from marti.rpc.client.channel import DEFAULT_TIMEOUT_S, check_timeout_s, make_channel
from marti.rpc.client.guard import ClientChannel

from .args import (
    batch_count_arg,
    check_client_args,
    content_type_arg,
    count_arg,
    flag_arg,
    seconds_arg,
    text_arg,
    texts_arg,
    version_arg,
)
from .core import _Core, _message
from .types import (
    AgentStateEntry,
    BatchRefusedError,
    CommunicationStats,
    DeadLetter,
    Message,
    NoSubscribersError,
    PublishResult,
)

SERVICE_NAME = "marti.api.broker.v1.BrokerService"
_IDEMPOTENT = tuple(
    (SERVICE_NAME, m) for m in ("CreateSession", "Send", "Broadcast", "Ack", "GetStates", "GetStats")
)
#: Methods the SDK's channels retry on UNAVAILABLE (safe: the broker deduplicates by message id).
IDEMPOTENT_METHODS = _IDEMPOTENT

#: Default ``batching_size``: messages per batch. 128 messages of 1 KB make a frame of about 128 KB (about
#: 27 KB after zstd), far under the broker's ``max_batch_messages`` (4096) and ``max_frame_bytes`` (32 MiB).
DEFAULT_BATCHING_SIZE = 128
#: Default ``update_frequency_s`` (the linger): the longest a buffered message waits for company before the
#: flush timer sends its batch, as a Kafka producer's ``linger.ms``. With ``send_when_idle`` (the default)
#: only a message buffered while a batch of its client is in flight waits at all (for that batch, at most
#: this long); without it every lone message pays it in full, hence short (the latency target is delivery
#: within 5 ms at p99).
DEFAULT_LINGER_S = 0.001
#: Default ``max_batch_bytes``: payload bytes that close a batch early.
DEFAULT_MAX_BATCH_BYTES = 1024 * 1024
#: Least wait of the flush timer before it retries a batch that failed transiently (the broker is down or slow).
TIMER_RETRY_S = 0.05

_LOG = logging.getLogger("marti.broker.client")


def _dead_letter(d: broker_pb2.DeadLetter) -> DeadLetter:
    """The :class:`DeadLetter` of a dead letter the broker returned; one whose payload does not decode gets
    ``message`` None and the error's text in ``decode_error`` (never raised)."""
    e = d.envelope
    try:
        message, error = _message(e), None
    except InvalidArgumentError as exc:
        message, error = None, str(exc)
    return DeadLetter(
        message, e.message_id, e.sender, e.content_type, e.payload, d.receiver, d.attempts, d.reason,
        d.dead_at_unix_us / 1e6, error,
    )  # fmt: skip


def _state_entry(s: broker_pb2.AgentState) -> AgentStateEntry:
    return AgentStateEntry(
        s.agent_id,
        decode_payload(s.value, s.content_type),
        s.content_type,
        s.version,
        s.updated_at_unix_us / 1e6,
    )


def _notify(on_error: Callable[[BatchRefusedError], None] | None, err: BatchRefusedError) -> None:
    if on_error is None:
        return
    try:
        on_error(err)
    except Exception:  # a failing callback must not stop the flush timer; the error is still raised later
        _LOG.exception("the on_error callback of a broker client raised")


def _publish_result(message_id: str, topic: str, resp, require_subscribers: bool) -> PublishResult:
    """Turns a one-message SendResponse into a :class:`PublishResult` (shared by both clients).

    Raises:
        NoSubscribersError: ``require_subscribers`` and the broker enqueued the message for nobody.
    """
    duplicate = resp.duplicates > 0
    if require_subscribers and resp.enqueued == 0 and not duplicate:
        raise NoSubscribersError(
            f"topic {topic!r} has no subscribers: message {message_id!r} reached no one "
            "(topic messages are not stored for later subscribers)",
            topic,
            message_id,
        )
    return PublishResult(message_id, resp.enqueued, duplicate)


class _ClientBase:
    """What :class:`MartiCommClient` and :class:`AsyncMartiCommClient` share besides their rpcs.

    The constructor (arguments: see :class:`~.sync_client.MartiCommClient`) checks the arguments, makes the
    :class:`_Core`, the channel (``grpc.aio`` when the subclass sets ``_AIO``) and the stub, then calls the
    subclass's :meth:`_open`. The ``_*_request`` methods build each rpc's request; the others handle what
    comes back. Only the ``*_blocking`` methods send: the sync client's flushes, and the asyncio client's
    flush at process exit (over a sync channel of its own, its event loop being gone).
    """

    #: True in the asyncio client: its channel is a ``grpc.aio`` one.
    _AIO = False

    def __init__(
        self,
        agent_id: str,
        address: str = "localhost:50051",
        session: str = "default",
        token: str | None = None,
        *,
        topics: Sequence[str] = (),
        batching_size: int = DEFAULT_BATCHING_SIZE,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        update_frequency_s: float = DEFAULT_LINGER_S,
        compression_level: int = 3,
        auto_ack: bool = True,
        use_dictionary: bool = True,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_frame_bytes: int = 32 * 1024 * 1024,
        dedup_memory: int = 100_000,
        tls_ca_file: str | None = None,
        channel: grpc.Channel | grpc.aio.Channel | None = None,
        on_error: Callable[[BatchRefusedError], None] | None = None,
        send_when_idle: bool = True,
    ) -> None:
        check_client_args(locals())
        self._core = _Core(
            agent_id, session, batching_size, max_batch_bytes, update_frequency_s, compression_level, auto_ack,
            max_frame_bytes, dedup_memory, send_when_idle,
        )  # fmt: skip
        self.agent_id = agent_id
        self.session = session
        self.topics = list(topics)
        self.timeout_s = check_timeout_s(timeout_s)
        self.on_error = on_error
        self._use_dictionary = use_dictionary
        self._own_channel = channel is None
        dial = functools.partial(
            make_channel,
            address,
            token=token,
            tls_ca_file=tls_ca_file,
            idempotent_methods=_IDEMPOTENT,
            service="broker",
        )
        #: Dials a new channel to the broker (``dial(aio=...)``); None on a caller's channel (not known how).
        self._dial: Callable[..., grpc.Channel | grpc.aio.Channel] | None = dial if channel is None else None
        self._channel = channel or dial(aio=self._AIO)
        # closed (mark_closed) by close once its final flush is done; until then _ready refuses new calls
        self._channel = ClientChannel(
            self._channel, f"the broker client of agent {agent_id!r} (session {session!r})"
        )
        self._stub = pb_grpc.BrokerServiceStub(self._channel)
        self._open()

    def _open(self) -> None:
        """Subclass hook run at the end of the constructor (the sync client connects here)."""

    def _join_request(self) -> pb.CreateSessionRequest:
        """The CreateSession request a client joins its session with (as a member, whether or not the session
        existed)."""
        return pb.CreateSessionRequest(session=self.session, agents=[self.agent_id])

    def _joined(self, info: pb.CreateSessionResponse) -> None:
        """Takes what CreateSession returned (the session's zstd dictionary, if used)."""
        if self._use_dictionary and info.zstd_dictionary:
            self._core.set_dictionary(info.zstd_dictionary)

    def _wants_timer(self) -> bool:
        """Whether this client needs a flush timer (batching with a linger)."""
        return self._core.batching_size > 1 and self._core.update_frequency_s > 0

    def _flush_due(self) -> bool:
        """Whether the flush timer should send the buffers now (the oldest buffered message waited the
        whole linger, or, with ``send_when_idle``, no batch is in flight)."""
        delay = self._core.flush_delay()
        return delay is not None and delay <= 0

    def _kick(self) -> None:
        """Tells the flush timer that the buffers went from empty to not empty, or that a batch in flight
        ended with messages buffered meanwhile (a subclass hook)."""

    @contextlib.contextmanager
    def _in_flight(self) -> Iterator[None]:
        """Counts the Send or Broadcast batch rpc made in the ``with`` block as in flight; when it ends (sent
        or failed) with messages buffered meanwhile and nothing else in flight, wakes the flush timer, which
        sends them at once as the next batch (``send_when_idle``)."""
        self._core.begin_send()
        try:
            yield
        finally:
            if self._core.end_send():
                self._kick()

    def _buffered_text(self) -> str:
        """``"N buffered message(s) (ids a, b, ...)"`` naming what this client holds unsent; ``""`` if nothing."""
        ids = self._core.buffered_ids()
        if not ids:
            return ""
        shown = ", ".join(ids[:5]) + (f", ... ({len(ids)} in all)" if len(ids) > 5 else "")
        return f"{len(ids)} buffered message(s) (ids {shown})"

    def _unsent_note(self, exc: BaseException) -> None:
        """Adds to ``exc`` (raised by ``close``) a note listing the messages still buffered, which the closed
        client will never send."""
        buffered = self._buffered_text()
        if buffered:
            exc.add_note(f"{buffered} were not sent and the client is closed")

    def _raise_refused(self) -> None:
        """Raises the oldest refusal the flush timer met, if any (each is raised once)."""
        err = self._core.take_refusal()
        if err is not None:
            raise err

    def _raise_undecodable(self) -> None:
        """Raises the oldest error about delivered messages that did not decode, if any (each raised once)."""
        err = self._core.take_undecodable()
        if err is not None:
            raise err

    def _received(self, frame: common_pb2.CompressedFrame) -> list[Message]:
        """What ``get_messages`` returns for a delivered frame: its messages that decode (auto-acks queued).
        If none does and one did not decode, raises that error now; else a later ``get_messages`` raises it.

        Raises:
            InvalidArgumentError: Every message of the frame that was not a redelivery failed to decode.
        """
        out = self._core.unpack(frame)
        if not out:
            self._raise_undecodable()
        return out

    def _ready(self) -> None:
        """What every public call does first: raises the closed-client error if :meth:`close` has begun, then
        the oldest refusal the flush timer met (if any).

        Raises:
            FailedPreconditionError: The client is closed (naming its agent and session).
            BatchRefusedError: A batch the flush timer sent was refused.
        """
        if self._core.closed:
            raise self._core.closed_error()
        self._raise_refused()

    def _closing_guard(self) -> contextlib.AbstractContextManager[None]:
        """Around an rpc that may be waiting when another thread or task closes the client: the closed-client
        ``FailedPreconditionError`` instead of what the closed channel makes it raise, unless the running task
        is itself being cancelled (:meth:`marti.rpc.client.guard.ClientChannel.closing_guard`, shared by every
        client)."""
        return self._channel.closing_guard()

    @property
    def refused_batches(self) -> int:
        """Batches the broker refused since this client was made (each reported as a BatchRefusedError)."""
        return self._core.refused_batches

    @property
    def refused_messages(self) -> int:
        """Messages in the batches the broker refused since this client was made."""
        return self._core.refused_messages

    def get_communication_stats(self) -> CommunicationStats:
        """What this client measured (see :class:`CommunicationStats`); never raises a pending refusal."""
        return self._core.stats()

    # ------------------------------------------------------------------ sending
    def _unicast_envelope(
        self, receiver_id: str | Sequence[str], message: Any, content_type: str | None, ttl_s: float
    ) -> broker_pb2.Envelope:
        """The envelope of ``send_message`` (after :meth:`_ready`).

        Raises:
            InvalidArgumentError: No receiver, a receiver that is not a non-empty string (or one UTF-8 cannot
                carry: a lone surrogate), or a bad message, ``content_type`` or ``ttl_s`` (named).
        """
        self._ready()
        if isinstance(receiver_id, str):
            receivers = [text_arg("receiver_id", receiver_id)] if receiver_id else []
        else:
            receivers = texts_arg("receiver_id", receiver_id)
        if not receivers:
            raise InvalidArgumentError(f"receiver_id must name at least one agent, got {receiver_id!r}")
        return self._core.envelope(message, receivers, "", content_type, ttl_s)

    def _topic_envelope(
        self, topic: str, message: Any, content_type: str | None, ttl_s: float
    ) -> broker_pb2.Envelope:
        """The envelope of ``publish`` (after :meth:`_ready`).

        Raises:
            InvalidArgumentError: ``topic`` is not a non-empty string, or a bad message, ``content_type`` or
                ``ttl_s`` (named).
        """
        self._ready()
        return self._core.envelope(message, (), text_arg("topic", topic), content_type, ttl_s)

    def _broadcast_envelope(
        self, message: Any, content_type: str | None, ttl_s: float
    ) -> broker_pb2.Envelope:
        """The envelope of ``broadcast`` (after :meth:`_ready`).

        Raises:
            InvalidArgumentError: A bad message, ``content_type`` or ``ttl_s`` (named).
        """
        self._ready()
        return self._core.envelope(message, (), "", content_type, ttl_s)

    def _one_message_rpc(self, broadcast: bool) -> tuple[Callable, type]:
        """The stub method and request class that send one ``publish`` (Send) or ``broadcast`` (Broadcast)."""
        return (self._stub.Broadcast, pb.BroadcastRequest) if broadcast else (self._stub.Send, pb.SendRequest)

    def _one_message_failed(self, exc: BaseException, item: list, broadcast: bool) -> BaseException:
        """:meth:`_failed` for the lone message of ``publish`` or ``broadcast`` (kept buffered if transient)."""
        return self._failed(exc, [] if broadcast else item, item if broadcast else [], background=False)

    def _batch_failed(self, exc: BaseException, items: list, sent: int, background: bool) -> int:
        """Handles the failure ``exc`` of a Send or Broadcast of ``items[:sent]`` (the next batch of a flush)
        and says how many of ``items`` to drop before the flush goes on with the rest, in order.

        Returns:
            0: the broker refused the batch for its size alone (:meth:`_Core.learn_batch_limit`): it is sent
            again in parts. 1: the batch is one message that alone makes a frame over the broker's
            ``max_frame_bytes``: only that message is refused (counted, passed to ``on_error``, and its
            :class:`BatchRefusedError` kept for the flush to raise once the rest is sent, or for the next call).

        Raises:
            BaseException: ``exc`` itself in every other case (the caller reports ``items`` as not sent).
        """
        if self._core.learn_batch_limit(exc, sent):
            return 0
        if sent != 1 or not isinstance(exc, BatchTooLargeError) or exc.max_frame_bytes <= 0:
            raise exc
        _notify(self.on_error, self._core.refusal(exc, items[:1], background, keep=True))
        return 1

    def _flush_blocking(self, stub: pb_grpc.BrokerServiceStub, background: bool) -> None:
        """Sends the buffers over ``stub``, a sync one (the caller keeps other flushes out): the unicast
        messages (Send), then the broadcasts (Broadcast); see :meth:`_Core.split_failed` on errors.

        Raises:
            UnavailableError, DeadlineExceededError: Transient (both buffers kept for the next flush).
            BatchRefusedError: The broker refused a batch (dropped, its ids in the error).
        """
        unicast, bcast = self._core.take_buffers()
        try:
            self._send_all_blocking(stub.Send, pb.SendRequest, unicast, background)
            self._send_all_blocking(stub.Broadcast, pb.BroadcastRequest, bcast, background)
        except Exception as exc:
            raise self._failed(exc, unicast, bcast, background) from None

    def _send_all_blocking(self, method: Callable, request_cls: type, items: list, background: bool) -> None:
        """Sends ``items`` in batches the broker takes (:meth:`_Core.batch_count`; a batch refused for its
        count or bytes alone is sent again in parts, and a message too large for a frame alone is refused alone:
        :meth:`_batch_failed`), removing each sent (or refused alone) batch from ``items``: on an error, what is
        left in ``items`` was not sent."""
        while items:
            n = self._core.batch_count(items)
            try:
                self._send_batch_blocking(method, request_cls, items[:n])
            except Exception as exc:
                n = self._batch_failed(exc, items, n, background)
            del items[:n]

    def _send_batch_blocking(self, method: Callable, request_cls: type, items: list):
        """Sends ``items`` (``(envelope, buffered_at)`` pairs) in one rpc of the sync stub ``method``; returns
        its response."""
        req, frame = self._batch_request(request_cls, items)
        with self._in_flight():
            resp = call(method, req, self.timeout_s)
        self._core.sent_ok(items, frame)
        return resp

    def _send_at_exit(self, flush: Callable[[], None]) -> None:
        """At process exit, for a client never closed: sends its buffered messages with ``flush``, and logs (as
        errors, ``marti.broker.client``) what it could not send and the refusals no call has raised yet, since
        no later call will report them."""
        if self._core.has_buffered():
            try:
                flush()
            except BatchRefusedError as err:
                _LOG.error("at exit, broker client %r (session %r): %s", self.agent_id, self.session, err)
            except Exception as exc:
                ids = self._core.buffered_ids()
                _LOG.error(
                    "at exit, broker client %r (session %r) could not send %d buffered message(s) (ids %s): %s",
                    self.agent_id, self.session, len(ids), ", ".join(ids[:5]), exc,
                )  # fmt: skip
        while (err := self._core.take_refusal()) is not None:
            _LOG.error("at exit, broker client %r (session %r): %s", self.agent_id, self.session, err)

    def _failed(self, exc: BaseException, unicast: list, bcast: list, background: bool) -> BaseException:
        """Handles a failed send (see :meth:`_Core.split_failed`), tells ``on_error`` of a refusal, and
        returns the error to raise."""
        err = self._core.split_failed(exc, unicast, bcast, background)
        if isinstance(err, BatchRefusedError):
            _notify(self.on_error, err)
        if self._core.has_buffered():  # put back (transient) or not tried (broadcasts behind a refused Send)
            self._kick()
        return err

    def _batch_request(self, request_cls, items: list) -> tuple[Any, common_pb2.CompressedFrame]:
        """The Send or Broadcast request (``request_cls``) of a batch, and its frame."""
        frame = self._core.frame(items)
        return request_cls(session=self.session, sender=self.agent_id, frame=frame), frame

    # ------------------------------------------------------------------ receiving
    def _receive_args(self, max_messages: int | None, timeout_s: float) -> tuple[int, float]:
        """Checks the arguments of ``get_messages``; returns the request's ``max_messages`` (0 for None: the
        broker's default) and ``timeout_s`` as a float.

        Raises:
            InvalidArgumentError: ``max_messages`` < 1 or ``timeout_s`` < 0 (or not numbers), named.
        """
        return batch_count_arg("max_messages", max_messages), seconds_arg("timeout_s", timeout_s)

    def _receive_request(self, max_messages: int, wait_s: float) -> tuple[pb.ReceiveRequest, list[str]]:
        """The Receive request (arguments checked by :meth:`_receive_args`), carrying the pending acks (also
        returned, to restore on failure)."""
        acks = self._core.take_acks()
        req = pb.ReceiveRequest(
            session=self.session,
            agent_id=self.agent_id,
            topics=self.topics,
            max_messages=max_messages,
            timeout_ms=round(wait_s * 1000),
            ack_message_ids=acks,
            max_frame_bytes=self._core.max_frame_bytes,
        )
        return req, acks

    def _restore_acks(self, acks: list[str]) -> None:
        """Puts back in front the acks a failed Receive carried."""
        with self._core.lock:
            self._core.pending_acks[:0] = acks

    def _subscribe_request(self, max_batch_messages: int | None, max_unacked: int) -> pb.SubscribeRequest:
        """The Subscribe request (after :meth:`_ready`); ``max_batch_messages`` None asks for the broker's
        default.

        Raises:
            InvalidArgumentError: ``max_batch_messages`` < 1 or ``max_unacked`` < 0 (or not integers), named.
        """
        self._ready()
        return pb.SubscribeRequest(
            session=self.session,
            agent_id=self.agent_id,
            topics=self.topics,
            max_batch_messages=batch_count_arg("max_batch_messages", max_batch_messages),
            max_unacked=count_arg("max_unacked", max_unacked),
            max_frame_bytes=self._core.max_frame_bytes,
        )

    def _ack_request(self, message_ids: Sequence[str]) -> pb.AckRequest:
        """The Ack request (after :meth:`_ready`); the ids join the dedup memory (see :meth:`_Core.acked`).

        Raises:
            InvalidArgumentError: ``message_ids`` is not a list of non-empty strings (named).
        """
        self._ready()
        ids = texts_arg("message_ids", message_ids)
        self._core.acked(ids)
        return self._acks_request(ids)

    def _ack_parts(self, req: pb.AckRequest, refused: BatchTooLargeError) -> list[pb.AckRequest]:
        """The Ack ``req`` split into requests of at most the broker's ``max_batch_messages`` ids, the limit its
        refusal names (an ``ack`` of more ids than the broker takes in one call).

        Raises:
            BatchTooLargeError: ``refused`` itself, when it names no count limit.
        """
        limit = refused.max_batch_messages
        if limit < 1:
            raise refused
        ids = list(req.message_ids)
        return [self._acks_request(ids[i : i + limit]) for i in range(0, len(ids), limit)]

    def _acks_request(self, message_ids: list[str]) -> pb.AckRequest:
        """The Ack request of ids this client acks itself (auto-acks, redeliveries of acked messages)."""
        return pb.AckRequest(session=self.session, agent_id=self.agent_id, message_ids=message_ids)

    # ------------------------------------------------------------------ state board and stats
    def _put_state_request(
        self, state: Any, content_type: str | None, expected_version: int | None
    ) -> pb.PutStateRequest:
        """The PutState request of ``broadcast_state`` (after :meth:`_ready`).

        Raises:
            InvalidArgumentError: A state that is not JSON-serializable (the path named), a bad
                ``content_type`` or an ``expected_version`` that is not an integer >= 0.
        """
        self._ready()
        version = version_arg(expected_version)
        value, ctype = encode_payload(state, content_type_arg(content_type), name="state")
        req = pb.PutStateRequest(
            session=self.session, agent_id=self.agent_id, content_type=ctype, value=value
        )
        if version is not None:
            req.expected_version = version
        return req

    def _get_states_request(self, exclude_self: bool) -> pb.GetStatesRequest:
        """The GetStates request (after :meth:`_ready`)."""
        self._ready()
        return pb.GetStatesRequest(
            session=self.session, agent_id=self.agent_id, exclude_self=flag_arg("exclude_self", exclude_self)
        )

    def _dead_letters_request(
        self, max_messages: int | None, receiver: str | None, remove: bool
    ) -> pb.ReadDeadLettersRequest:
        """The ReadDeadLetters request of ``read_dead_letters`` (after :meth:`_ready`), bounded by this
        client's ``max_frame_bytes`` as its Receive requests are; ``max_messages`` None asks for the broker's
        default.

        Raises:
            InvalidArgumentError: ``max_messages`` < 1, ``receiver`` not a non-empty string or None,
                ``remove`` not a bool, or ``remove`` with a ``receiver`` (the broker removes only the oldest
                letters of the whole session), named.
        """
        self._ready()
        count = batch_count_arg("max_messages", max_messages)
        who = "" if receiver is None else text_arg("receiver", receiver)
        if flag_arg("remove", remove) and who:
            raise InvalidArgumentError(
                f"remove=True with receiver={who!r}: the broker removes only the oldest dead letters of the "
                "whole session; read them with receiver=None to remove them"
            )
        return pb.ReadDeadLettersRequest(
            session=self.session,
            receiver=who,
            max_messages=count,
            remove=remove,
            max_response_bytes=self._core.max_frame_bytes,
        )

    @staticmethod
    def _dead_letters(resp: pb.ReadDeadLettersResponse) -> list[DeadLetter]:
        """The :class:`DeadLetter` of each dead letter of a ReadDeadLetters response, oldest first."""
        return [_dead_letter(d) for d in resp.dead_letters]

    def _stats_request(self, whole_broker: bool) -> pb.GetStatsRequest:
        """The GetStats request (after :meth:`_ready`)."""
        self._ready()
        return pb.GetStatsRequest(session="" if flag_arg("whole_broker", whole_broker) else self.session)
