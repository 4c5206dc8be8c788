"""Observability of a training run: metrics files, TensorBoard / wandb, a progress bar and report.md."""

from services.trainer.observe.metrics import MetricRecord, RunWriter, read_evals, read_metrics, series
from services.trainer.observe.progress import ProgressBar, estimate_eta_s
from services.trainer.observe.report import write_report

__all__ = [
    "MetricRecord",
    "ProgressBar",
    "RunWriter",
    "estimate_eta_s",
    "read_evals",
    "read_metrics",
    "series",
    "write_report",
]
