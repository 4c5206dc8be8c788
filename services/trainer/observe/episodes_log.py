"""``eval_episodes.jsonl``: what the agents actually said in each held-out evaluation episode.

One line per episode per evaluation::

    {"step": 4, "seed": 1000001, "task": null, "returns": {"agent_1": 0.1, ...},
     "metrics": {"team_score": 0.7, ...}, "turns": [{"turn": 0, "agent": "agent_1", "text": "task_1: 2 ..."}, ...]}

Metrics say *how well* the team did; these transcripts say *what it did*, which is what a user reads first when a
curve is flat or a reward looks too good.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

EVAL_EPISODES_FILE = "eval_episodes.jsonl"


def episode_record(step: int, result: Any) -> dict[str, Any]:
    """The JSON record of one finished episode (a :class:`services.trainer.rollout.episodes.runner.EpisodeResult`).

    Args:
        step: Training step the evaluation ran after (0 = before training).
        result: The episode; its trajectories' turns give the transcript, ordered by turn then agent.

    Returns:
        ``{"step", "seed", "task", "returns", "metrics", "turns": [{"turn", "agent", "text"}]}``, plus
        ``"team_answer"`` when the env gave one (the ``dataset_task`` env: what a majority vote compares);
        non-finite numbers become ``None``.
    """
    turns = sorted(
        ((t.step, agent, t.response_text) for agent, traj in result.trajectories.items() for t in traj.turns),
        key=lambda x: (x[0], x[1]),
    )

    def num(v: float) -> float | None:
        return float(v) if math.isfinite(v) else None

    record = {
        "step": step,
        "seed": result.seed,
        "task": result.task,
        "returns": {a: num(v) for a, v in result.returns.items()},
        "metrics": {k: num(v) for k, v in result.metrics.items()},
        "turns": [{"turn": s, "agent": a, "text": text} for s, a, text in turns],
    }
    if getattr(result, "team_answer", None) is not None:
        record["team_answer"] = result.team_answer
    return record


def append_eval_episodes(run_dir: Path, step: int, results: Iterable[Any]) -> Path:
    """Append one record per episode to ``<run_dir>/eval_episodes.jsonl`` and return the file's path."""
    path = Path(run_dir) / EVAL_EPISODES_FILE
    with path.open("a", encoding="utf-8") as f:
        for result in results:
            f.write(json.dumps(episode_record(step, result), ensure_ascii=False) + "\n")
    return path


def evaluated_seeds(run_dir: Path, step: int) -> tuple[int, int] | None:
    """``(episodes, distinct seeds)`` the evaluation after step ``step`` played, read from
    ``<run_dir>/eval_episodes.jsonl`` (a resumed run's re-run evaluation of that step counts once per episode
    record, so the seeds are the figure to quote); None when the file is absent or holds no record of ``step``.
    Lines that do not parse are skipped (the report is best effort, the file is the record)."""
    path = Path(run_dir) / EVAL_EPISODES_FILE
    if not path.is_file():
        return None
    episodes, seeds = 0, set()
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("step") == step:
                episodes += 1
                seeds.add((record.get("task"), record.get("seed")))
    return (episodes, len(seeds)) if episodes else None
