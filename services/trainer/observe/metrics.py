"""Run metrics: ``metrics.jsonl`` and ``eval.jsonl`` (always), TensorBoard events and wandb (when configured).

Layout of a run directory written by :class:`RunWriter`::

    <run_dir>/config.yaml         the TrainConfig of the run (when one is given)
    <run_dir>/metrics.jsonl       one line per logged step (RunWriter.log, every log_every steps and the last):
                                  {"step", "time", "metrics": {key: value}}
    <run_dir>/eval.jsonl          one line per RunWriter.log_eval call: {"step", "time", "table": {key: value}}
    <run_dir>/tensorboard/        TensorBoard event files (training keys as logged, eval keys under "eval/")

Metric keys are ``<scope>/<name>``: ``scope`` is an agent name or ``team``; the names the report knows are the
constants below. Non-finite values are kept: JSON has no NaN, so they are stored as the strings ``"nan"``,
``"inf"`` and ``"-inf"`` and read back as floats. A resumed run appends to the same files. When a step at or below one already logged
appears (the run resumed from an earlier checkpoint), readers drop the earlier records from that step on.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import numbers
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marti.config import TrainConfig, dump_config
from marti.errors import FailedPreconditionError, InvalidArgumentError

__all__ = [
    "EVAL_FILE",
    "METRICS_FILE",
    "TEAM",
    "MetricRecord",
    "RunWriter",
    "flatten_table",
    "read_evals",
    "read_metrics",
    "series",
]

_log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.jsonl"
CONFIG_FILE = "config.yaml"
TENSORBOARD_DIR = "tensorboard"

TEAM = "team"
"""Scope of team-level metrics (``team/reward``, ``team/task_completion``, ``team/resource_utilization``)."""
REWARD = "reward"
"""Mean episode reward (per agent: after ``reward_alloc``; team: the shared team reward)."""
EXTERNAL_REWARD = "external_reward"
"""Mean return of the external episodes (played through the gateway) an update took, per agent."""
TASK_COMPLETION = "task_completion"
"""Fraction of episodes whose task was completed, in [0, 1]."""
RESOURCE_UTILIZATION = "resource_utilization"
"""Mean resource utilization of the team's allocations, in [0, 1] (resource allocation scenario)."""
TEAM_SCORE = "team_score"
"""The environment's shared team score of an episode (before ``reward_alloc``)."""
FORMAT_VALID = "format_valid"
"""Fraction of turns whose output parsed as a valid action, in [0, 1]."""
KL = "kl"
ENTROPY = "entropy"
CLIP_FRAC = "clip_frac"
POLICY_LOSS = "policy_loss"
VALUE_LOSS = "value_loss"
TOKENS_PER_S = "tokens_per_s"
VERSION_LAG = "version_lag"
"""Mean policy versions between the learner and the turns it trained on (0 in the synchronous loop; at most
``max_staleness`` with asynchronous rollouts; ``version_lag_max`` is the largest, ``stale_dropped`` counts
trajectories not trained on because they, or a member of their group, exceeded the agent's bound)."""
BEHAVIOUR_KL = "behaviour_kl"
"""k3 estimate of KL(behaviour || learner) over the trained tokens: how far the weights that sampled the turns
are from the ones that train on them (docs/algorithms.md, "Off-policy correction")."""
AGENT_METRICS = (
    REWARD,
    KL,
    ENTROPY,
    CLIP_FRAC,
    POLICY_LOSS,
    VALUE_LOSS,
    TOKENS_PER_S,
    VERSION_LAG,
    BEHAVIOUR_KL,
    FORMAT_VALID,
)
"""Per-agent metric names the loop logs as ``<agent>/<name>``."""

_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _encode(value: float) -> float | str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _decode(value: Any) -> float:
    if isinstance(value, str):
        return _NONFINITE[value]
    return float(value)


def _check_metrics(step: int, metrics: Mapping[str, Any], what: str) -> dict[str, float]:
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise InvalidArgumentError(f"{what}: step must be an int >= 0, got {step!r}")
    if not isinstance(metrics, Mapping):
        raise InvalidArgumentError(
            f"{what}: metrics must be a mapping of key to number, got {type(metrics).__name__}"
        )
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key.strip():
            raise InvalidArgumentError(f"{what}: metric key must be a non-empty string, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise InvalidArgumentError(f"{what}: metric {key!r} must be a real number, got {value!r}")
        out[key] = float(value)
    return out


def flatten_table(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten a nested evaluation table: ``{"agent_1": {"reward": 1.0}}`` -> ``{"agent_1/reward": 1.0}``.

    Args:
        table: Mapping whose leaves are numbers; inner mappings add a ``/``-joined level.
        prefix: Key prefix of this level (used by the recursion).

    Returns:
        A flat mapping of ``/``-joined keys to leaf values (not yet validated).
    """
    flat: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_table(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


class RunWriter:
    """Writes a run's metrics to ``metrics.jsonl`` and ``eval.jsonl``, and to TensorBoard and wandb.

    Every logged step appends one JSON line and flushes it, so a crash loses nothing that was logged. With
    ``log_every = N > 1`` (``output.log_every``, OpenRLHF's ``--logging_steps``) only the steps that are
    multiples of N, and the final one, reach ``metrics.jsonl``, TensorBoard and wandb: :meth:`log` keeps a
    skipped step's metrics and :meth:`close` writes them when no later step was logged (a run that ends or
    stops between two multiples still records its last step). Evaluations are always written.

    Args:
        out_dir: The run directory (created if missing).
        config: The run's config; written to ``config.yaml`` and recorded as TensorBoard text / wandb config.
        use_tensorboard: Write TensorBoard event files under ``out_dir/tensorboard``.
        wandb: None or False: no wandb; True: wandb with the project/run name from ``config.output``
            (project defaults to the training name); a mapping: keyword arguments for ``wandb.init``. If wandb
            is not installed, a warning is logged once and the run goes on without it.
        clock: Wall clock in seconds since the epoch (recorded as each line's ``time``).
        log_every: Write the training metrics of every this many steps (>= 1), plus the final step.
        write_config: Write ``config`` to ``config.yaml`` now; the training loop passes False and records it
            once the job has started (:meth:`services.trainer.job.run.run_dir.RunFolder.record_start`).

    Raises:
        FailedPreconditionError: ``use_tensorboard`` is true but the ``tensorboard`` package is missing.
        InvalidArgumentError: ``log_every`` is not an int >= 1.
    """

    def __init__(
        self,
        out_dir: str | Path,
        config: TrainConfig | None = None,
        use_tensorboard: bool = True,
        wandb: bool | Mapping[str, Any] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        log_every: int = 1,
        write_config: bool = True,
    ) -> None:
        if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
            raise InvalidArgumentError(f"log_every must be an int >= 1, got {log_every!r}")
        self.log_every = log_every
        self._pending: tuple[int, dict[str, float]] | None = None
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self._closed = False
        if config is not None and write_config:
            (self.out_dir / CONFIG_FILE).write_text(dump_config(config), encoding="utf-8")
        self._metrics = (self.out_dir / METRICS_FILE).open("a", encoding="utf-8")
        self._evals = (self.out_dir / EVAL_FILE).open("a", encoding="utf-8")
        self._tb = self._open_tensorboard(config) if use_tensorboard else None
        self._wandb = self._open_wandb(config, wandb) if wandb else None

    @classmethod
    def from_config(cls, config: TrainConfig, out_dir: str | Path | None = None) -> RunWriter:
        """A writer for ``config``: its run directory and the loggers of ``output.log_with``."""
        return cls(
            config.run_dir if out_dir is None else out_dir,
            config,
            use_tensorboard="tensorboard" in config.output.log_with,
            wandb="wandb" in config.output.log_with,
            log_every=config.output.log_every,
        )

    def _open_tensorboard(self, config: TrainConfig | None) -> Any:
        if importlib.util.find_spec("tensorboard") is None:
            raise FailedPreconditionError(
                "TensorBoard logging is on but the 'tensorboard' package is not installed: install "
                "marti-agent[trainer], or set output.log_with without 'tensorboard'"
            )
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=str(self.out_dir / TENSORBOARD_DIR))
        if config is not None:
            writer.add_text("config", "```yaml\n" + dump_config(config) + "```", 0)
        return writer

    def _open_wandb(self, config: TrainConfig | None, wandb: bool | Mapping[str, Any]) -> Any:
        if importlib.util.find_spec("wandb") is None:
            _log.warning("wandb logging is configured but wandb is not installed; skipping it")
            return None
        import wandb as wandb_mod

        kwargs: dict[str, Any] = {"dir": str(self.out_dir)}
        if config is not None:
            kwargs["project"] = config.output.wandb_project or config.training_name
            if config.output.wandb_run_name:
                kwargs["name"] = config.output.wandb_run_name
            kwargs["config"] = config.model_dump(mode="json")
        if isinstance(wandb, Mapping):
            kwargs.update(wandb)
        return wandb_mod.init(**kwargs)

    def _check_open(self) -> None:
        if self._closed:
            raise FailedPreconditionError(f"RunWriter for {str(self.out_dir)!r} is closed")

    def log(self, step: int, metrics: Mapping[str, float], *, final: bool = False) -> bool:
        """Record training metrics of one step, when it is a logged step.

        Args:
            step: Training step (>= 0); logging a step at or below an earlier one (a resume) makes
                readers drop the earlier records from that step on.
            metrics: ``<scope>/<name>`` keys (``agent_1/reward``, ``team/task_completion``) to real numbers;
                NaN and infinities are kept.
            final: The run's last step: written whatever ``log_every`` says.

        Returns:
            True when the step was written now (``step % log_every == 0`` or ``final``); False when it was kept
            back (written by :meth:`close` unless a later step is logged first).

        Raises:
            InvalidArgumentError: Negative or non-int step, empty key, or a non-numeric value (named).
            FailedPreconditionError: The writer is closed.
        """
        self._check_open()
        values = _check_metrics(step, metrics, "log")
        if not final and int(step) % self.log_every:
            self._pending = (int(step), values)
            return False
        self._pending = None
        self._write(int(step), values)
        return True

    def _write(self, step: int, values: dict[str, float]) -> None:
        """Append one step's checked metrics to every sink."""
        line = {
            "step": int(step),
            "time": self._clock(),
            "metrics": {k: _encode(v) for k, v in values.items()},
        }
        self._metrics.write(json.dumps(line) + "\n")
        self._metrics.flush()
        if self._tb is not None:
            for key, value in values.items():
                self._tb.add_scalar(key, value, int(step))
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(values, step=int(step))

    def log_eval(self, step: int, table: Mapping[str, Any]) -> None:
        """Record one held-out evaluation.

        Args:
            step: Training step the evaluated policies had reached (0: before training).
            table: Metric key to number, flat (``team/task_completion``) or nested (``{"team": {...}}``).

        Raises:
            InvalidArgumentError: Bad step, key or value (named).
            FailedPreconditionError: The writer is closed.
        """
        self._check_open()
        values = _check_metrics(
            step, flatten_table(table) if isinstance(table, Mapping) else table, "log_eval"
        )
        line = {"step": int(step), "time": self._clock(), "table": {k: _encode(v) for k, v in values.items()}}
        self._evals.write(json.dumps(line) + "\n")
        self._evals.flush()
        if self._tb is not None:
            for key, value in values.items():
                self._tb.add_scalar(f"eval/{key}", value, int(step))
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({f"eval/{k}": v for k, v in values.items()}, step=int(step))

    def close(self) -> None:
        """Write the last step's metrics if :meth:`log` kept them back, then flush and close every sink; calling
        it again does nothing."""
        if self._closed:
            return
        if self._pending is not None:
            self._write(*self._pending)
            self._pending = None
        self._closed = True
        self._metrics.close()
        self._evals.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class MetricRecord:
    """One line of ``metrics.jsonl`` or ``eval.jsonl``.

    Attributes:
        step: Training step.
        time: Wall-clock time of the record, seconds since the epoch.
        values: Metric key to value (non-finite values restored as floats).
    """

    step: int
    time: float
    values: dict[str, float]


def _read(path: Path, field: str) -> list[MetricRecord]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    records: list[MetricRecord] = []
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
            values = {k: _decode(v) for k, v in obj[field].items()}
            records.append(MetricRecord(int(obj["step"]), float(obj["time"]), values))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            if number == len(lines):  # a line cut short by a crash mid-write
                _log.warning("%s:%d: skipping a truncated last line", path, number)
                break
            raise InvalidArgumentError(f"{path}:{number}: not a valid metrics record ({exc})") from None
    kept: list[MetricRecord] = []
    for rec in records:
        # A step at or below one already seen means the run resumed from an earlier checkpoint: the records
        # from that step on belong to the abandoned timeline and are dropped.
        while kept and kept[-1].step >= rec.step:
            kept.pop()
        kept.append(rec)
    return kept


def read_metrics(run_dir: str | Path) -> list[MetricRecord]:
    """Training records of a run, one per step, sorted by step (after a resume, the resumed timeline wins).

    Raises:
        InvalidArgumentError: A line other than the last is not a valid record (file and line named).
    """
    return _read(Path(run_dir) / METRICS_FILE, "metrics")


def read_evals(run_dir: str | Path) -> list[MetricRecord]:
    """Evaluation records of a run, one per step, sorted by step (after a resume, the resumed timeline wins)."""
    return _read(Path(run_dir) / EVAL_FILE, "table")


def series(records: list[MetricRecord], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of one metric across records (records without the key are skipped)."""
    steps = [r.step for r in records if key in r.values]
    return steps, [r.values[key] for r in records if key in r.values]
