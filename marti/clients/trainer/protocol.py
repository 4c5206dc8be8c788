"""What the sync and async trainer clients share: the service's names, the constructor and the requests of the
methods that build more than one message (:class:`_TrainerClientBase`), and response decoding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from marti.api.trainer.v1 import trainer_pb2 as pb
from marti.api.trainer.v1 import trainer_service_pb2 as spb
from marti.api.trainer.v1 import trainer_service_pb2_grpc as sgrpc
from marti.rpc.client.channel import DEFAULT_TIMEOUT_S, check_timeout_s, make_channel
from marti.rpc.client.guard import ClientChannel
from marti.rpc.client.transport import LoopBoundChannel

from .types import JobInfo, MetricsRecord

SERVICE = "marti.api.trainer.v1.TrainerService"
_IDEMPOTENT = [(SERVICE, m) for m in ("GetJob", "ListJobs")]


def _job(job: pb.Job) -> JobInfo:
    return JobInfo(
        job_id=job.job_id,
        training_name=job.training_name,
        state=pb.JobState.Name(job.state).removeprefix("JOB_STATE_"),
        step=int(job.step),
        max_steps=int(job.max_steps),
        run_dir=job.run_dir,
        error=job.error,
        created_at_s=job.created_at.seconds + job.created_at.nanos / 1e9,
        last_checkpoint=job.last_checkpoint,
    )


def _record(rec: pb.MetricsRecord) -> MetricsRecord:
    return MetricsRecord(
        step=int(rec.step),
        values=dict(rec.values),
        time_s=rec.time.seconds + rec.time.nanos / 1e9,
        kind=rec.kind,
    )


def _channel(address: str, token: str | None, tls_ca_file: str | None, aio: bool) -> Any:
    return make_channel(
        address,
        token=token,
        tls_ca_file=tls_ca_file,
        aio=aio,
        idempotent_methods=_IDEMPOTENT,
        service="trainer",
    )


class _TrainerClientBase:
    """What :class:`TrainerClient` and :class:`AsyncTrainerClient` share besides their calls: the constructor
    (arguments: see :class:`TrainerClient`; a ``grpc.aio`` channel when the subclass sets ``_AIO``) and the
    requests of the methods that build more than one message."""

    #: True in the asyncio client: its channel is a ``grpc.aio`` one.
    _AIO = False

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls_ca_file: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        channel: grpc.Channel | grpc.aio.Channel | LoopBoundChannel | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self._own_channel = channel is None
        self._channel = channel or _channel(address, token, tls_ca_file, aio=self._AIO)
        self._channel = ClientChannel(self._channel, f"the trainer client of {address or 'its channel'}")
        self._stub = sgrpc.TrainerServiceStub(self._channel)

    @staticmethod
    def _submit_request(config_yaml: str, overrides: Sequence[str]) -> spb.SubmitJobRequest:
        """The SubmitJob request."""
        return spb.SubmitJobRequest(config_yaml=config_yaml, overrides=list(overrides))

    @staticmethod
    def _checkpoint_request(job_id: str, timeout_s: float) -> tuple[spb.SaveCheckpointRequest, float]:
        """The SaveCheckpoint request and the call's deadline (the server's wait plus 5 s)."""
        timeout_s = check_timeout_s(timeout_s)
        return spb.SaveCheckpointRequest(job_id=job_id, timeout_ms=int(timeout_s * 1000)), timeout_s + 5.0

    def _metrics_call(self, job_id: str, from_step: int, timeout_s: float | None) -> Any:
        """Opens the StreamMetrics call (sync or ``grpc.aio``, as the channel is)."""
        req = spb.StreamMetricsRequest(job_id=job_id, from_step=from_step)
        return self._stub.StreamMetrics(req, timeout=timeout_s or self.timeout_s)


def _checkpoint(resp: spb.SaveCheckpointResponse) -> tuple[str, int]:
    return resp.path, int(resp.step)
