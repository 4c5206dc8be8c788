"""Multi-task scheduling: which task each episode plays, and the difficulty curriculum (pure Python).

A job lists tasks with sampling weights (``tasks:`` in the config). At every training step the scheduler draws
one task per group of ``group_size`` episodes (``task_sampling: group``; the group's episodes share a task and a
seed, so group advantages compare like with like) or one per episode (``episode``), with probabilities
``weight / sum(weights)``, from a generator seeded by ``(seed, step)``: the same config draws the same tasks at the
same step, also after a resume. The curriculum keeps a difficulty level per task and moves it up one level when
the task's success rate over its last ``window`` episodes reaches ``threshold``.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marti.errors import InvalidArgumentError


@dataclass(frozen=True)
class TaskSpec:
    """A task: its name and sampling weight (> 0)."""

    name: str
    weight: float = 1.0


class TaskScheduler:
    """Seeded weighted sampling of tasks.

    Args:
        tasks: The tasks (distinct names, positive weights).
        seed: Base seed; step ``s`` draws from ``random.Random(seed * 1_000_003 + s)``.
        sampling: ``"group"`` (one task per group) or ``"episode"`` (one per episode).

    Raises:
        InvalidArgumentError: No tasks, a repeated name, a weight <= 0 or an unknown sampling mode (named).
    """

    def __init__(self, tasks: Sequence[TaskSpec], seed: int, sampling: str = "group") -> None:
        if not tasks:
            raise InvalidArgumentError("the task scheduler needs at least one task")
        names = [t.name for t in tasks]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"task names must be distinct, got {names}")
        bad = [t.name for t in tasks if not t.weight > 0]
        if bad:
            raise InvalidArgumentError(f"task weights must be > 0; bad: {bad}")
        if sampling not in ("group", "episode"):
            raise InvalidArgumentError(f"task_sampling must be 'group' or 'episode', got {sampling!r}")
        self.tasks = list(tasks)
        self.seed = seed
        self.sampling = sampling

    @property
    def probabilities(self) -> dict[str, float]:
        """Per task, ``weight / sum(weights)``."""
        total = sum(t.weight for t in self.tasks)
        return {t.name: t.weight / total for t in self.tasks}

    def assign(self, step: int, num_episodes: int, group_size: int) -> list[str]:
        """Task of every episode of a step.

        Args:
            step: Training step (>= 0).
            num_episodes: Episodes this step (a multiple of ``group_size``).
            group_size: Episodes per group.

        Returns:
            ``num_episodes`` task names; with ``group`` sampling, runs of ``group_size`` equal names.

        Raises:
            InvalidArgumentError: ``step < 0``, ``group_size < 1`` or ``num_episodes`` not a multiple of it.
        """
        if step < 0 or group_size < 1 or num_episodes % group_size:
            raise InvalidArgumentError(
                f"bad assignment request step={step}, num_episodes={num_episodes}, group_size={group_size}"
            )
        rng = random.Random(self.seed * 1_000_003 + step)
        names = [t.name for t in self.tasks]
        weights = [t.weight for t in self.tasks]
        if self.sampling == "episode":
            return rng.choices(names, weights, k=num_episodes)
        out: list[str] = []
        for name in rng.choices(names, weights, k=num_episodes // group_size):
            out.extend([name] * group_size)
        return out


class Curriculum:
    """Per-task difficulty level that rises when the recent success rate passes a threshold.

    Args:
        tasks: Task names.
        levels: Difficulty levels, easiest first (e.g. ``["easy", "medium", "hard"]``).
        threshold: Success rate in [0, 1] that moves a task up one level.
        window: Episodes the rate is measured over (a full window is needed; it restarts after a move).
        start: Optional starting level per task (must be in ``levels``); default the first level.

    Raises:
        InvalidArgumentError: Empty or repeated levels, threshold outside [0, 1], window < 1, unknown start.
    """

    def __init__(
        self,
        tasks: Sequence[str],
        levels: Sequence[str],
        threshold: float,
        window: int,
        start: Mapping[str, str | None] | None = None,
    ) -> None:
        if not levels or len(set(levels)) != len(levels):
            raise InvalidArgumentError(
                f"curriculum levels must be non-empty and distinct, got {list(levels)}"
            )
        if not 0.0 <= threshold <= 1.0:
            raise InvalidArgumentError(f"curriculum threshold must be in [0, 1], got {threshold}")
        if window < 1:
            raise InvalidArgumentError(f"curriculum window must be >= 1, got {window}")
        self.levels = list(levels)
        self.threshold = threshold
        self.window = window
        self.index: dict[str, int] = {}
        for t in tasks:
            first = (start or {}).get(t)
            if first is not None and first not in self.levels:
                raise InvalidArgumentError(f"task {t!r} starts at {first!r}, not one of {self.levels}")
            self.index[t] = self.levels.index(first) if first else 0
        self._recent: dict[str, deque[bool]] = {t: deque(maxlen=window) for t in tasks}

    def level(self, task: str) -> str:
        """The task's current difficulty."""
        return self.levels[self.index[task]]

    def success_rate(self, task: str) -> float:
        """Success rate of the task's episodes in the current window (0 before any)."""
        r = self._recent[task]
        return sum(r) / len(r) if r else 0.0

    def record(self, task: str, successes: Sequence[bool]) -> bool:
        """Add finished episodes of a task (one step's worth); move it up one level if the full window's rate
        >= threshold. At most one level per call: the episodes were all played at the old level.

        Returns:
            True if the level rose.

        Raises:
            InvalidArgumentError: Unknown task.
        """
        if task not in self._recent:
            raise InvalidArgumentError(f"unknown task {task!r}; tasks are {sorted(self._recent)}")
        recent = self._recent[task]
        recent.extend(bool(s) for s in successes)
        full = len(recent) == self.window
        if full and self.success_rate(task) >= self.threshold and self.index[task] < len(self.levels) - 1:
            self.index[task] += 1
            recent.clear()
            return True
        return False

    def state(self) -> dict[str, Any]:
        """Serialisable state (levels and windows) for checkpoints."""
        return {
            "index": dict(self.index),
            "recent": {t: [int(x) for x in r] for t, r in self._recent.items()},
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state` (tasks not in it keep their level)."""
        for t, i in state.get("index", {}).items():
            if t in self.index:
                self.index[t] = min(int(i), len(self.levels) - 1)
        for t, r in state.get("recent", {}).items():
            if t in self._recent:
                self._recent[t].clear()
                self._recent[t].extend(bool(x) for x in r)
