"""The ``grpc.aio`` trainer client (:class:`AsyncTrainerClient`, ``marti.aio.TrainerClient``), twin of
:class:`~.sync_client.TrainerClient`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing

from marti.api.trainer.v1 import trainer_service_pb2 as spb
from marti.plumbing.arguments import checked
from marti.rpc.client.calls import acall, aiterate

from .protocol import _checkpoint, _job, _record, _TrainerClientBase
from .types import JobInfo, MetricsRecord


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
        """Close the channel (when this client dialed it); later calls, and a call waiting now, raise the
        closed-client ``FailedPreconditionError``."""
        self._channel.mark_closed()
        if self._own_channel:
            await self._channel.close()

    async def __aenter__(self) -> AsyncTrainerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
