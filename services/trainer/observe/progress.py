"""A training progress bar with ETA: a live rich bar on a terminal, plain throttled lines in logs and CI."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from marti.errors import FailedPreconditionError, InvalidArgumentError

__all__ = ["ProgressBar", "estimate_eta_s", "format_duration"]


def estimate_eta_s(elapsed_s: float, steps_done: int, steps_left: int) -> float | None:
    """Remaining time at the mean pace so far: ``elapsed_s / steps_done * steps_left``.

    Args:
        elapsed_s: Seconds since the bar started (>= 0).
        steps_done: Steps completed since the bar started (a resumed run counts only its own steps).
        steps_left: Steps still to run (>= 0).

    Returns:
        Seconds left, 0.0 when nothing is left, or None when no step has finished yet (no pace known).
    """
    if steps_left <= 0:
        return 0.0
    if steps_done <= 0:
        return None
    return elapsed_s / steps_done * steps_left


def format_duration(seconds: float | None) -> str:
    """``H:MM:SS`` for a number of seconds (rounded down), ``?`` for None or a non-finite value."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    whole = max(0, int(seconds))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def _format_postfix(postfix: Mapping[str, Any]) -> str:
    parts = []
    for key, value in postfix.items():
        if isinstance(value, float):
            parts.append(f"{key}={value:.4g}")
        else:
            parts.append(f"{key}={value}")
    return " ".join(parts)


class ProgressBar:
    """Progress of a training run, with elapsed time and ETA, as a context manager.

    On a terminal it draws a live ``rich`` bar; otherwise (logs, CI, pipes) it prints one plain line per
    update, at most one every ``min_interval_s`` seconds, plus the final step::

        step 3/8 [ 37%] elapsed 0:01:02 eta 0:01:43 | agent_1/reward=0.31 team/task_completion=0.5

    Args:
        total_steps: Steps of the whole run (>= 1).
        start_step: Steps already done when the bar starts (a resumed run); the ETA uses only the pace of
            the steps run under this bar.
        stream: Where to draw; default ``sys.stderr``.
        min_interval_s: Least seconds between two plain lines (>= 0; the final step always prints).
        live: Force the live bar (True) or plain lines (False); None: live iff ``stream`` is a terminal.
        clock: Monotonic clock in seconds.

    Raises:
        InvalidArgumentError: ``total_steps < 1``, ``start_step`` outside ``[0, total_steps]`` or a negative
            ``min_interval_s``.
    """

    def __init__(
        self,
        total_steps: int,
        *,
        start_step: int = 0,
        stream: IO[str] | None = None,
        min_interval_s: float = 5.0,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise InvalidArgumentError(f"total_steps must be an int >= 1, got {total_steps!r}")
        if not 0 <= start_step <= total_steps:
            raise InvalidArgumentError(f"start_step must be in [0, {total_steps}], got {start_step!r}")
        if min_interval_s < 0:
            raise InvalidArgumentError(f"min_interval_s must be >= 0, got {min_interval_s!r}")
        self.total_steps = total_steps
        self.start_step = start_step
        self.step = start_step
        self._stream = sys.stderr if stream is None else stream
        self._min_interval_s = min_interval_s
        self._live = live if live is not None else bool(getattr(self._stream, "isatty", lambda: False)())
        self._clock = clock
        self._t0: float | None = None
        self._last_print: float | None = None
        self._progress: Any = None
        self._task: Any = None
        self._postfix: dict[str, Any] = {}

    def __enter__(self) -> ProgressBar:
        self._t0 = self._clock()
        if self._live:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[postfix]}"),
                console=Console(file=self._stream),
            )
            self._progress.start()
            self._task = self._progress.add_task(
                "train", total=self.total_steps, completed=self.step, postfix=""
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    @property
    def eta_s(self) -> float | None:
        """Estimated seconds left (see :func:`estimate_eta_s`); None before the first step under this bar."""
        if self._t0 is None:
            return None
        return estimate_eta_s(
            self._clock() - self._t0, self.step - self.start_step, self.total_steps - self.step
        )

    def line(self) -> str:
        """The plain progress line for the current state."""
        elapsed = 0.0 if self._t0 is None else self._clock() - self._t0
        pct = 100.0 * self.step / self.total_steps
        text = (
            f"step {self.step}/{self.total_steps} [{pct:3.0f}%] elapsed {format_duration(elapsed)} "
            f"eta {format_duration(self.eta_s)}"
        )
        return f"{text} | {_format_postfix(self._postfix)}" if self._postfix else text

    def update(self, step: int, postfix: Mapping[str, Any] | None = None) -> None:
        """Report that ``step`` steps are complete, with a few headline metrics.

        Args:
            step: Steps completed so far, in ``[current step, total_steps]`` (never backwards).
            postfix: Metrics shown after the bar (floats printed with 4 significant digits).

        Raises:
            InvalidArgumentError: ``step`` goes backwards or beyond ``total_steps``.
            FailedPreconditionError: The bar is not entered (use ``with ProgressBar(...) as bar``).
        """
        if self._t0 is None:
            raise FailedPreconditionError("ProgressBar.update called outside its 'with' block")
        if isinstance(step, bool) or not isinstance(step, int) or not self.step <= step <= self.total_steps:
            raise InvalidArgumentError(
                f"step must be an int in [{self.step}, {self.total_steps}], got {step!r}"
            )
        self.step = step
        self._postfix = dict(postfix or {})
        if self._progress is not None:
            self._progress.update(self._task, completed=step, postfix=_format_postfix(self._postfix))
            return
        now = self._clock()
        due = self._last_print is None or now - self._last_print >= self._min_interval_s
        if due or step == self.total_steps:
            self._last_print = now
            self._stream.write(self.line() + "\n")
            self._stream.flush()
