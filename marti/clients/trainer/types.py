"""Domain types of the trainer clients: a job (:class:`JobInfo`) and one of its metrics records
(:class:`MetricsRecord`)."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Job states after which a job never changes again.
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


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
