"""The sync trainer client (:class:`TrainerClient`, ``marti.TrainerClient``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from marti.api.trainer.v1 import trainer_service_pb2 as spb
from marti.plumbing.arguments import checked
from marti.rpc.client.calls import call, iterate

from .protocol import _checkpoint, _job, _record, _TrainerClientBase
from .types import JobInfo, MetricsRecord


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
        """Close the channel (when this client dialed it); later calls raise the closed-client
        ``FailedPreconditionError``."""
        self._channel.mark_closed()
        if self._own_channel:
            self._channel.close()

    def __enter__(self) -> TrainerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
