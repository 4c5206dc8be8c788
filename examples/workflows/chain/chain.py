"""Planner -> executor -> evaluator chain on the built-in resource allocation task (user code for chain.yaml).

The YAML picks ``workflow.kind: chain`` and names these functions by import path:

* :func:`executor_prompt` builds the executor's user message: the plan it received first, then the problem;
* :func:`evaluator_verdict` turns the evaluator's free text into the env's format (``score: X`` and ``accept`` or
  ``revise``), so a frozen (untrained) evaluator still gives readable verdicts;
* :func:`completion_bonus` adds 1 to every agent's reward when the team completed the task.
"""

from __future__ import annotations

import re

from marti.team.workflow import EpisodeView, PromptContext

_NUM_RE = re.compile(r"(\d+(?:\.\d+)?)")


def executor_prompt(ctx: PromptContext) -> str:
    """The planner's plan first (if any), then the observation with the problem."""
    plans = [t for s, t in ctx.messages if s != ctx.agent]
    head = f"Plan from your planner:\n{plans[-1]}\n\n" if plans else ""
    return f"{head}{ctx.observation}\nSubmit the allocation, one 'task_N: amount' line per task."


def evaluator_verdict(text: str) -> str:
    """``score: X`` (the first number, clipped to [0, 1]; 0.5 when none) and ``accept`` if X >= 0.9 or the
    text says accept, else ``revise``."""
    m = _NUM_RE.search(text)
    score = min(1.0, max(0.0, float(m.group(1)))) if m else 0.5
    score = score / 100 if m and float(m.group(1)) > 1.0 else score
    verdict = "accept" if score >= 0.9 or "accept" in text.lower() else "revise"
    return f"score: {score:.2f}\n{verdict}"


def completion_bonus(episode: EpisodeView) -> dict[str, float]:
    """1.0 to every agent when the env reports ``task_completion`` 1, else 0."""
    done = episode.metrics.get("task_completion", 0.0) >= 1.0
    return dict.fromkeys(episode.agents, 1.0 if done else 0.0)
