"""Training jobs run by the trainer service: each job is a :class:`TrainingLoop` in its own thread."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from marti.config import TrainConfig, config_from_text
from marti.errors import (
    FailedPreconditionError,
    MartiError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
)
from services.trainer.job.connections.addresses import Addresses
from services.trainer.job.run.loop import TrainingLoop
from services.trainer.job.run.run_dir import SUBMIT_JOB_WAYS_OUT, RunFolder
from services.trainer.job.run.summary import user_code_paths

JOB_STATES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED")


@dataclass
class MetricsRecord:
    """One metrics record of a job (``kind`` is ``train`` or ``eval``; ``time`` is Unix seconds)."""

    step: int
    kind: str
    values: dict[str, float]
    time: float


@dataclass
class Job:
    """A job and its live state (guarded by ``cond``)."""

    job_id: str
    config: TrainConfig
    state: str = "PENDING"
    step: int = 0
    error: str = ""
    created_at: float = field(default_factory=time.time)
    last_checkpoint: str = ""
    records: list[MetricsRecord] = field(default_factory=list)
    stop_event: threading.Event = field(default_factory=threading.Event)
    cond: threading.Condition = field(default_factory=threading.Condition)
    loop: TrainingLoop | None = None

    @property
    def finished(self) -> bool:
        """True once the job reached a final state."""
        return self.state in ("SUCCEEDED", "FAILED", "STOPPED")


class JobManager:
    """Submits, tracks and stops training jobs (pure Python; the gRPC servicer adapts it).

    Args:
        addresses: Service addresses every job uses.
        max_concurrent_jobs: Most jobs running at once (RESOURCE_EXHAUSTED beyond it).
        allow_user_code: Let submitted configs import user code (custom envs, workflow functions). Off by
            default: configs arrive over the network, and importing a path runs code on this server.
    """

    def __init__(
        self, addresses: Addresses, max_concurrent_jobs: int = 1, allow_user_code: bool = False
    ) -> None:
        self.addresses = addresses
        self.max_concurrent_jobs = max_concurrent_jobs
        self.allow_user_code = allow_user_code
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def submit(self, config_yaml: str, overrides: Sequence[str] = ()) -> Job:
        """Validate a config and start its job.

        Raises:
            InvalidArgumentError: the config is invalid (the key is named).
            NotFoundError: a model is not available locally.
            ResourceExhaustedError: ``max_concurrent_jobs`` jobs are already running.
            PermissionDeniedError: the config names user code and this trainer does not run it.
            FailedPreconditionError: the config's run folder already holds a run; the message says what to
                submit instead (:data:`~services.trainer.job.run.run_dir.SUBMIT_JOB_WAYS_OUT`).
        """
        from services.trainer.models.resolve import resolve_model

        cfg = config_from_text(config_yaml, overrides, source="<SubmitJob>")
        user_code = user_code_paths(cfg)
        if user_code and not self.allow_user_code:
            raise PermissionDeniedError(
                f"this trainer does not run user code from submitted configs ({', '.join(user_code)}); "
                "start it with --allow-user-code to permit it"
            )
        for agent in cfg.agents:
            resolve_model(agent.pretrain_model)
        RunFolder(cfg.run_dir, SUBMIT_JOB_WAYS_OUT).refuse_a_held_run()
        with self._lock:
            running = sum(1 for j in self._jobs.values() if not j.finished)
            if running >= self.max_concurrent_jobs:
                raise ResourceExhaustedError(
                    f"{running} jobs running; max_concurrent_jobs is {self.max_concurrent_jobs}"
                )
            job = Job(uuid.uuid4().hex[:12], cfg)
            self._jobs[job.job_id] = job
        threading.Thread(target=self._run, args=(job,), daemon=True, name=f"job-{job.job_id}").start()
        return job

    def _record(self, job: Job, step: int, kind: str, values: dict[str, float]) -> None:
        with job.cond:
            job.records.append(MetricsRecord(step, kind, dict(values), time.time()))
            if kind == "train":
                job.step = step
            job.cond.notify_all()

    def _set(self, job: Job, **changes: Any) -> None:
        with job.cond:
            for k, v in changes.items():
                setattr(job, k, v)
            job.cond.notify_all()

    def _run(self, job: Job) -> None:
        self._set(job, state="RUNNING")
        try:
            job.loop = TrainingLoop(
                job.config,
                self.addresses,
                stop_event=job.stop_event,
                on_metrics=lambda s, k, v: self._record(job, s, k, v),
                show_progress=False,
                allow_user_code=self.allow_user_code,
            )
            summary = job.loop.run()
            self._set(
                job,
                state="STOPPED" if job.stop_event.is_set() else "SUCCEEDED",
                step=summary.steps,
                last_checkpoint=summary.last_checkpoint or "",
            )
        except MartiError as exc:
            self._set(job, state="FAILED", error=f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a failed job must be reported, not crash the service
            self._set(job, state="FAILED", error=f"{type(exc).__name__}: {exc}")

    def get(self, job_id: str) -> Job:
        """The job with this id.

        Raises:
            NotFoundError: unknown id.
        """
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFoundError(f"no job {job_id!r}")
        return job

    def list(self) -> list[Job]:
        """Every job, newest first."""
        return sorted(self._jobs.values(), key=lambda j: j.created_at, reverse=True)

    def stop(self, job_id: str) -> Job:
        """Ask a job to stop after its current step (idempotent)."""
        job = self.get(job_id)
        job.stop_event.set()
        return job

    def save_checkpoint(self, job_id: str, timeout_s: float) -> tuple[str, int]:
        """Ask a running job for a checkpoint after its current step; waits for it.

        Raises:
            NotFoundError: unknown id.
            FailedPreconditionError: the job is not running.
            DeadlineExceededError: no checkpoint within ``timeout_s``.
        """
        from marti.errors import DeadlineExceededError

        job = self.get(job_id)
        if job.state != "RUNNING" or job.loop is None:
            raise FailedPreconditionError(f"job {job_id!r} is {job.state}, not RUNNING")
        before = job.loop.last_checkpoint
        job.loop.checkpoint_request.set()
        deadline = time.monotonic() + timeout_s
        with job.cond:
            while job.loop.last_checkpoint == before and not job.finished:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeadlineExceededError(f"no checkpoint of job {job_id!r} within {timeout_s:.0f}s")
                job.cond.wait(min(left, 0.5))
        if job.loop.last_checkpoint == before:
            raise FailedPreconditionError(f"job {job_id!r} ended ({job.state}) before checkpointing")
        return str(job.loop.last_checkpoint), job.step

    def records_since(self, job: Job, index: int, wait_s: float) -> tuple[list[MetricsRecord], bool]:
        """Records from position ``index`` on, waiting up to ``wait_s`` for new ones; also says if finished."""
        with job.cond:
            if len(job.records) <= index and not job.finished:
                job.cond.wait(wait_s)
            return list(job.records[index:]), job.finished
