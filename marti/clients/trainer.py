"""Typed clients of the trainer service (``marti.api.trainer.v1.TrainerService``).

:class:`TrainerClient` (sync, ``marti.TrainerClient``) and :class:`AsyncTrainerClient` (``marti.aio``) submit
training jobs, read their state and metrics, stop them and save checkpoints. They return the domain types
:class:`JobInfo` and :class:`MetricsRecord` and raise :class:`marti.errors.MartiError` subclasses. The token
is read from ``MARTI_TRAINER_TOKEN``, then ``MARTI_TOKEN``, when not given.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import grpc

from marti.api.trainer.v1 import trainer_pb2 as pb
from marti.api.trainer.v1 import trainer_service_pb2 as spb
from marti.api.trainer.v1 import trainer_service_pb2_grpc as sgrpc
from marti.arguments import checked
from marti.rpc.calls import acall, aiterate, call, iterate
from marti.rpc.channel import DEFAULT_TIMEOUT_S, check_timeout_s, make_channel
from marti.rpc.transport import LoopBoundChannel

SERVICE = "marti.api.trainer.v1.TrainerService"
_IDEMPOTENT = [(SERVICE, m) for m in ("GetJob", "ListJobs")]
#: Job states after which a job never changes again.
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})

__all__ = ["TERMINAL_STATES", "AsyncTrainerClient", "JobInfo", "MetricsRecord", "TrainerClient"]


@dataclass(frozen=True, slots=True)
class JobInfo:
    """One training job as the trainer service reports it.

    Attributes:
        job_id: The job's id.
        training_name: The config's ``training_name``.
        state: ``PENDING``, ``RUNNING``, ``SUCCEEDED``, ``FAILED`` or ``STOPPED`` (``JOB_STATE_`` removed).
        step: Training steps done.
        max_steps: Steps the job runs in total.
        run_dir: Directory of its logs, metrics and checkpoints (on the trainer's host).
        error: Why it failed ('' otherwise).
        created_at_s: Submission time, Unix seconds.
        last_checkpoint: Path of its newest checkpoint ('' if none).
    """

    job_id: str
    training_name: str
    state: str
    step: int
    max_steps: int
    run_dir: str = ""
    error: str = ""
    created_at_s: float = 0.0
    last_checkpoint: str = ""

    @property
    def done(self) -> bool:
        """Whether the job reached a terminal state (see :data:`TERMINAL_STATES`)."""
        return self.state in TERMINAL_STATES


@dataclass(frozen=True, slots=True)
class MetricsRecord:
    """One metrics record of a job.

    Attributes:
        step: Training step it belongs to.
        values: Metric name to value.
        time_s: When it was recorded, Unix seconds.
        kind: Its kind (``train``, ``eval``, ...).
    """

    step: int
    values: dict[str, float] = field(default_factory=dict)
    time_s: float = 0.0
    kind: str = ""


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


class TrainerClient(_TrainerClientBase):
    """Sync client of the trainer service.

    Args:
        address: ``host:port`` of the trainer service.
        token: Bearer token; ``None`` reads ``MARTI_TRAINER_TOKEN``, then ``MARTI_TOKEN``; ``""`` sends none.
        tls_ca_file: PEM CA file; enables TLS.
        timeout_s: Deadline of each unary call, seconds.
        channel: An open channel to use instead of dialing (``token`` and ``tls_ca_file`` are then ignored);
            not closed by :meth:`close` (``marti top`` shares one channel across a server's services).

    Raises:
        InvalidArgumentError: The token is not printable ASCII (at construction, before any rpc).

    Every method raises the :class:`marti.errors.MartiError` subclass of the service's status code
    (``NotFoundError`` for an unknown job, ``InvalidArgumentError`` for a bad config, ...).
    """

    @checked
    def submit_job(self, config_yaml: str, overrides: Sequence[str] = ()) -> JobInfo:
        """Start a job from a training config (YAML text) with dotted ``key=value`` overrides."""
        req = self._submit_request(config_yaml, overrides)
        return _job(call(self._stub.SubmitJob, req, self.timeout_s).job)

    @checked
    def get_job(self, job_id: str) -> JobInfo:
        """The job's current state."""
        return _job(call(self._stub.GetJob, spb.GetJobRequest(job_id=job_id), self.timeout_s).job)

    def list_jobs(self) -> list[JobInfo]:
        """Every job, newest first."""
        return [_job(j) for j in call(self._stub.ListJobs, spb.ListJobsRequest(), self.timeout_s).jobs]

    @checked
    def stop_job(self, job_id: str) -> JobInfo:
        """Ask a job to stop; returns its state after the request."""
        return _job(call(self._stub.StopJob, spb.StopJobRequest(job_id=job_id), self.timeout_s).job)

    @checked(own=("timeout_s",))
    def save_checkpoint(self, job_id: str, timeout_s: float = 600.0) -> tuple[str, int]:
        """Save a checkpoint of a running job now; returns ``(path, step)``. ``timeout_s``: longest wait, s."""
        req, deadline = self._checkpoint_request(job_id, timeout_s)
        return _checkpoint(call(self._stub.SaveCheckpoint, req, deadline))

    @checked
    def stream_metrics(
        self, job_id: str, from_step: int = 0, timeout_s: float | None = None
    ) -> Iterator[MetricsRecord]:
        """The job's metrics records from ``from_step`` on; follows a running job until it ends.

        Args:
            job_id: The job.
            from_step: First step wanted.
            timeout_s: Deadline of the whole stream, seconds (default: the client's ``timeout_s``).

        Raises:
            MartiError: as the service reports (``DeadlineExceededError`` when the deadline passes first).
        """
        for resp in iterate(self._metrics_call(job_id, from_step, timeout_s)):
            yield _record(resp.record)

    def close(self) -> None:
        """Close the channel (when this client dialed it)."""
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> TrainerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncTrainerClient(_TrainerClientBase):
    """``grpc.aio`` twin of :class:`TrainerClient` (``marti.aio.TrainerClient``; same arguments, awaitable)."""

    _AIO = True

    @checked
    async def submit_job(self, config_yaml: str, overrides: Sequence[str] = ()) -> JobInfo:
        """See :meth:`TrainerClient.submit_job`."""
        req = self._submit_request(config_yaml, overrides)
        return _job((await acall(self._stub.SubmitJob, req, self.timeout_s)).job)

    @checked
    async def get_job(self, job_id: str) -> JobInfo:
        """See :meth:`TrainerClient.get_job`."""
        return _job((await acall(self._stub.GetJob, spb.GetJobRequest(job_id=job_id), self.timeout_s)).job)

    async def list_jobs(self) -> list[JobInfo]:
        """See :meth:`TrainerClient.list_jobs`."""
        return [
            _job(j) for j in (await acall(self._stub.ListJobs, spb.ListJobsRequest(), self.timeout_s)).jobs
        ]

    @checked
    async def stop_job(self, job_id: str) -> JobInfo:
        """See :meth:`TrainerClient.stop_job`."""
        return _job((await acall(self._stub.StopJob, spb.StopJobRequest(job_id=job_id), self.timeout_s)).job)

    @checked(own=("timeout_s",))
    async def save_checkpoint(self, job_id: str, timeout_s: float = 600.0) -> tuple[str, int]:
        """See :meth:`TrainerClient.save_checkpoint`."""
        req, deadline = self._checkpoint_request(job_id, timeout_s)
        return _checkpoint(await acall(self._stub.SaveCheckpoint, req, deadline))

    @checked
    async def stream_metrics(
        self, job_id: str, from_step: int = 0, timeout_s: float | None = None
    ) -> AsyncIterator[MetricsRecord]:
        """See :meth:`TrainerClient.stream_metrics`."""
        stream = aiterate(self._metrics_call(job_id, from_step, timeout_s))
        async with aclosing(stream):
            async for resp in stream:
                yield _record(resp.record)

    async def close(self) -> None:
        """Close the channel (when this client dialed it)."""
        if self._own_channel:
            await self._channel.close()

    async def __aenter__(self) -> AsyncTrainerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
