"""gRPC adapter of the trainer service: one method per rpc, domain errors raised as-is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from google.protobuf.timestamp_pb2 import Timestamp

from marti.api.trainer.v1 import trainer_pb2, trainer_service_pb2, trainer_service_pb2_grpc
from services.trainer.job.service.jobs import Job, JobManager, MetricsRecord

_STATES = {
    s: getattr(trainer_pb2, f"JOB_STATE_{s}")
    for s in ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED")
}


def _ts(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def job_to_proto(job: Job) -> trainer_pb2.Job:
    """Convert a domain job to its proto."""
    return trainer_pb2.Job(
        job_id=job.job_id,
        training_name=job.config.training_name,
        state=_STATES[job.state],
        step=job.step,
        max_steps=job.config.total_steps,  # fewer than max_steps when max_epochs ends the job first
        run_dir=str(job.config.run_dir),
        error=job.error,
        created_at=_ts(job.created_at),
        last_checkpoint=job.last_checkpoint,
    )


def record_to_proto(rec: MetricsRecord) -> trainer_pb2.MetricsRecord:
    """Convert a metrics record to its proto."""
    return trainer_pb2.MetricsRecord(step=rec.step, values=rec.values, time=_ts(rec.time), kind=rec.kind)


class TrainerServicer(trainer_service_pb2_grpc.TrainerServiceServicer):
    """Serves :class:`JobManager` over gRPC; blocking work runs in threads."""

    def __init__(self, jobs: JobManager, stream_poll_s: float = 1.0) -> None:
        self.jobs = jobs
        self.stream_poll_s = stream_poll_s

    async def SubmitJob(self, request, context):  # noqa: N802 - gRPC method name
        """See trainer_service.proto."""
        job = await asyncio.to_thread(self.jobs.submit, request.config_yaml, list(request.overrides))
        return trainer_service_pb2.SubmitJobResponse(job=job_to_proto(job))

    async def GetJob(self, request, context):  # noqa: N802
        """See trainer_service.proto."""
        return trainer_service_pb2.GetJobResponse(job=job_to_proto(self.jobs.get(request.job_id)))

    async def ListJobs(self, request, context):  # noqa: N802
        """See trainer_service.proto."""
        return trainer_service_pb2.ListJobsResponse(jobs=[job_to_proto(j) for j in self.jobs.list()])

    async def StreamMetrics(self, request, context) -> AsyncIterator:  # noqa: N802
        """See trainer_service.proto."""
        job = self.jobs.get(request.job_id)
        index = 0
        while True:
            records, finished = await asyncio.to_thread(
                self.jobs.records_since, job, index, self.stream_poll_s
            )
            index += len(records)
            for rec in records:
                if rec.step >= request.from_step:
                    yield trainer_service_pb2.StreamMetricsResponse(record=record_to_proto(rec))
            if finished and not records:
                return

    async def StopJob(self, request, context):  # noqa: N802
        """See trainer_service.proto."""
        return trainer_service_pb2.StopJobResponse(job=job_to_proto(self.jobs.stop(request.job_id)))

    async def SaveCheckpoint(self, request, context):  # noqa: N802
        """See trainer_service.proto."""
        timeout_s = (request.timeout_ms or 600_000) / 1000.0
        path, step = await asyncio.to_thread(self.jobs.save_checkpoint, request.job_id, timeout_s)
        return trainer_service_pb2.SaveCheckpointResponse(path=path, step=step)
