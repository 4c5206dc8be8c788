"""gRPC adapter of the broker core: one method per rpc, no business logic.

Domain errors raised here (or by the core) become status codes in the shared interceptor. A corrupt frame
fails only its own call; the broker keeps serving everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
import zstandard

from marti.api.broker.v1 import broker_service_pb2 as pb
from marti.api.broker.v1 import broker_service_pb2_grpc as pb_grpc
from marti.api.common.v1 import common_pb2
from marti.codec import broker as broker_codec
from marti.rpc.serving.server import ServiceSpec

from . import convert
from .core import Broker, SqliteStore, Store
from .metrics import register_metrics, unregister_metrics
from .settings import BrokerSettings

SERVICE_NAME = "marti.api.broker.v1.BrokerService"
_LOG = logging.getLogger("marti.broker")
#: Bytes a Receive or Subscribe response takes around its frame's data (fields, tags, lengths), bounded.
_RESPONSE_OVERHEAD = 1024


def _wait_s(wait_ms: int, context: grpc.aio.ServicerContext) -> float:
    wait = wait_ms / 1000.0
    remaining = context.time_remaining()
    if remaining is not None:
        wait = min(wait, max(remaining - 0.05, 0.0))
    return wait


class BrokerServicer(pb_grpc.BrokerServiceServicer):
    """Serves :class:`~services.comm_broker.core.Broker` over gRPC.

    Args:
        broker: The core.
        settings: Broker settings (compression level, batch defaults).
    """

    def __init__(self, broker: Broker, settings: BrokerSettings) -> None:
        self.broker = broker
        self.settings = settings
        self._dicts: dict[str, tuple[bytes, zstandard.ZstdCompressionDict | None]] = {}

    def _dictionary(self, session: str) -> zstandard.ZstdCompressionDict | None:
        s = self.broker.sessions.get(session)
        if s is None or not s.dictionary:
            return None
        cached = self._dicts.get(session)
        if cached is None or cached[0] is not s.dictionary:
            cached = self._dicts[session] = (s.dictionary, broker_codec.load_dictionary(s.dictionary))
        return cached[1]

    def _frame(self, session: str, deliveries: list, accept_codec: int) -> common_pb2.CompressedFrame:
        codec = broker_codec.CODEC_NONE if accept_codec == common_pb2.CODEC_NONE else broker_codec.CODEC_ZSTD
        frame = convert.encode_deliveries(
            deliveries, codec, self.settings.compression_level, self._dictionary(session)
        )
        if deliveries:
            self.broker.count_frame_bytes(session, out_raw=frame.uncompressed_bytes, out_wire=len(frame.data))
        return frame

    def _frame_budget(self, receiver_limit: int) -> int:
        """Most bytes of one delivered frame or dead-letter response: the receiver's limit (``max_frame_bytes``
        of its Receive or Subscribe request, ``max_response_bytes`` of ReadDeadLetters; 0: none given) and the
        gRPC message limit less 1 KiB for the response around the frame (the core adds its own
        ``max_frame_bytes``). A frame is never larger than its raw batch: one that zstd does not shrink
        travels raw."""
        grpc_cap = self.settings.max_message_bytes - _RESPONSE_OVERHEAD
        return min(receiver_limit or grpc_cap, grpc_cap)

    def _batch_messages(self, requested: int) -> int:
        """Most messages of one delivered frame or dead-letter response: ``requested`` (``max_messages`` of
        Receive or ReadDeadLetters, ``max_batch_messages`` of Subscribe; the core checks it against
        ``max_batch_messages``), or for 0 the broker's default: ``default_batch_messages``, at most
        ``max_batch_messages`` (so a request without a count works on a broker that takes fewer than 256)."""
        return requested or min(self.settings.default_batch_messages, self.settings.max_batch_messages)

    async def _send(self, request, context, broadcast: bool):
        envelopes = convert.decode_frame(
            request.frame, self.settings.max_frame_bytes, self._dictionary(request.session)
        )
        result = await self.broker.send_wait(
            request.session, request.sender, envelopes, broadcast, _wait_s(request.wait_if_full_ms, context)
        )
        self.broker.count_frame_bytes(
            request.session, in_raw=request.frame.uncompressed_bytes, in_wire=len(request.frame.data)
        )
        return convert.send_result_fields(result)

    async def CreateSession(self, request: pb.CreateSessionRequest, context) -> pb.CreateSessionResponse:
        """Creates or returns a session (see the proto)."""
        if request.zstd_dictionary:
            broker_codec.load_dictionary(request.zstd_dictionary)
        session, created = self.broker.create_session(
            request.session, list(request.agents), request.fixed_roster, request.zstd_dictionary
        )
        return pb.CreateSessionResponse(
            session=session.name,
            created=created,
            zstd_dictionary=session.dictionary,
            dictionary_id=broker_codec.dictionary_id(session.dictionary),
            agents=sorted(session.mailboxes),
        )

    async def Send(self, request: pb.SendRequest, context) -> pb.SendResponse:
        """Sends a batch (see the proto)."""
        return pb.SendResponse(**await self._send(request, context, broadcast=False))

    async def Broadcast(self, request: pb.BroadcastRequest, context) -> pb.BroadcastResponse:
        """Broadcasts a batch (see the proto)."""
        return pb.BroadcastResponse(**await self._send(request, context, broadcast=True))

    async def Subscribe(self, request: pb.SubscribeRequest, context):
        """Streams delivered batches until the client cancels (see the proto).

        Raises:
            InvalidArgumentError: ``max_batch_messages`` over the broker's (as Receive's ``max_messages``).
        """
        if request.max_batch_messages:  # 0: the broker's default
            self.broker.mailboxes.check_max_messages(request.max_batch_messages, "max_batch_messages")
        max_batch = self._batch_messages(request.max_batch_messages)
        self.broker.join(request.session, request.agent_id, list(request.topics))
        session = self.broker.sessions[request.session]
        budget = self._frame_budget(request.max_frame_bytes)
        session.active_streams += 1
        try:
            while True:
                deliveries = await self.broker.receive_wait(
                    request.session, request.agent_id, max_batch, 1.0, (), request.max_unacked or None, budget
                )
                if deliveries:
                    frame = self._frame(request.session, deliveries, request.accept_codec)
                    try:
                        yield pb.SubscribeResponse(frame=frame, count=len(deliveries))
                    except BaseException:  # the stream ended (client gone) before this batch was sent
                        ids = [d.envelope.message_id for d in deliveries]
                        self.broker.release(request.session, request.agent_id, ids)
                        raise
        finally:
            session.active_streams -= 1

    async def Receive(self, request: pb.ReceiveRequest, context) -> pb.ReceiveResponse:
        """Long poll (see the proto)."""
        acked = 0
        if request.ack_message_ids:
            acked = self.broker.ack(request.session, request.agent_id, list(request.ack_message_ids))
        max_messages = self._batch_messages(request.max_messages)
        timeout_s = request.timeout_ms / 1000.0
        remaining = context.time_remaining()
        if remaining is not None:
            timeout_s = min(timeout_s, max(remaining - 0.05, 0.0))
        deliveries = await self.broker.receive_wait(
            request.session,
            request.agent_id,
            max_messages,
            timeout_s,
            list(request.topics),
            max_bytes=self._frame_budget(request.max_frame_bytes),
        )
        frame = self._frame(request.session, deliveries, request.accept_codec)
        return pb.ReceiveResponse(frame=frame, count=len(deliveries), acked=acked)

    async def Ack(self, request: pb.AckRequest, context) -> pb.AckResponse:
        """Acks deliveries (see the proto)."""
        return pb.AckResponse(
            acked=self.broker.ack(request.session, request.agent_id, list(request.message_ids))
        )

    async def PutState(self, request: pb.PutStateRequest, context) -> pb.PutStateResponse:
        """Puts a state-board entry (see the proto)."""
        expected = request.expected_version if request.HasField("expected_version") else None
        state = self.broker.put_state(
            request.session,
            request.agent_id,
            request.value,
            request.content_type or "application/json",
            expected,
        )
        return pb.PutStateResponse(state=convert.state_to_proto(state))

    async def GetStates(self, request: pb.GetStatesRequest, context) -> pb.GetStatesResponse:
        """Reads the state board (see the proto)."""
        states = self.broker.get_states(request.session, request.agent_id, request.exclude_self)
        return pb.GetStatesResponse(states=[convert.state_to_proto(s) for s in states])

    async def GetStats(self, request: pb.GetStatsRequest, context) -> pb.GetStatsResponse:
        """Returns statistics (see the proto)."""
        return pb.GetStatsResponse(stats=convert.stats_to_proto(self.broker.stats(request.session)))

    async def ReadDeadLetters(
        self, request: pb.ReadDeadLettersRequest, context
    ) -> pb.ReadDeadLettersResponse:
        """Reads dead letters (see the proto)."""
        dead = self.broker.read_dead_letters(
            request.session,
            self._batch_messages(request.max_messages),
            request.receiver,
            request.remove,
            self._frame_budget(request.max_response_bytes),
        )
        return pb.ReadDeadLettersResponse(dead_letters=[convert.dead_letter_to_proto(d) for d in dead])


def build_broker(settings: BrokerSettings) -> Broker:
    """Builds the core with the configured store (SQLite WAL under ``data_dir``, else in memory)."""
    store = SqliteStore(settings.data_dir, fsync=settings.fsync) if settings.data_dir else Store()
    return Broker(settings.limits(), store, settings.auto_create_sessions)


def broker_service(settings: BrokerSettings, broker: Broker | None = None) -> ServiceSpec:
    """The :class:`ServiceSpec` of the broker: servicer, maintenance task, metrics and storage lifecycle.

    Args:
        settings: Broker settings.
        broker: A prebuilt core (tests); built from ``settings`` when None.

    Returns:
        The spec to pass to ``start_server`` / ``run_server`` / ``serve_in_thread``.
    """
    core = broker or build_broker(settings)
    servicer = BrokerServicer(core, settings)
    task: list[asyncio.Task] = []

    async def maintain() -> None:
        while True:
            await asyncio.sleep(settings.tick_interval_s)
            try:
                core.tick()
            except Exception:  # keep maintaining even if one tick fails (e.g. a transient disk error)
                _LOG.exception("broker maintenance tick failed")

    async def on_start() -> None:
        task.append(asyncio.get_running_loop().create_task(maintain()))
        register_metrics(core)

    async def on_stop() -> None:
        for t in task:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        unregister_metrics(core)
        core.store.close()

    return ServiceSpec(
        name=SERVICE_NAME,
        add_to_server=lambda server: pb_grpc.add_BrokerServiceServicer_to_server(servicer, server),
        on_start=on_start,
        on_stop=on_stop,
    )
