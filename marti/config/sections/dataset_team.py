"""Checks of a dataset job's team at config load: the workflow's turns against ``environment.max_turns``, and the
LLM judge (``reward.judge_agent``). Called by ``TrainConfig``'s validator, so a bad job is refused before it
starts (docs/datasets.md, "Workflows over your data")."""

from __future__ import annotations

from typing import Any


def workflow_turns(workflow: Any, agents: list[str]) -> int | None:
    """Turns of one pass of a ``chain`` (its length), ``debate`` (``rounds + 1``) or ``parallel_aggregate`` (2)
    workflow section; None for the kinds whose length the env or user code decides (``env``, ``custom``, a
    ``factory``)."""
    if workflow.factory:
        return None
    if workflow.kind == "chain":
        return len(workflow.order or agents)
    if workflow.kind == "debate":
        return workflow.rounds + 1
    if workflow.kind == "parallel_aggregate":
        return 2
    return None


def check_dataset_team(cfg: Any) -> None:
    """Refuse a dataset job whose ``environment.max_turns`` is not its workflow's turns, or whose judge is not a
    frozen agent of the team that speaks last.

    Raises:
        ValueError: Naming both numbers, or the judge and what is wrong with it (the config loader turns it
            into an ``InvalidArgumentError``).
    """
    names = [a.name for a in cfg.agents]
    turns = workflow_turns(cfg.workflow, names)
    if turns is not None and cfg.environment.max_turns != turns:
        raise ValueError(
            f"environment.max_turns is {cfg.environment.max_turns} but workflow.kind {cfg.workflow.kind} takes "
            f"{turns} turns (chain: its length, debate: rounds + 1, parallel_aggregate: 2); the dataset_task env "
            f"scores the answers after max_turns, so set environment.max_turns: {turns}"
        )
    judge = cfg.reward.judge_agent
    if judge is None:
        return
    if judge not in names:
        raise ValueError(f"reward.judge_agent {judge!r} is not in agents {names}")
    if cfg.agent(judge).is_tuning:
        raise ValueError(f"reward.judge_agent {judge!r} must set is_tuning: false (the judge is frozen)")
    opts = cfg.environment.options
    if opts.get("final", "agent") == "agent" and opts.get("final_agent") is None:
        raise ValueError(
            f"reward.judge_agent {judge!r} needs environment.options.final_agent (the agent whose answer it "
            "judges; otherwise the last speaker, the judge, would be the team's answer)"
        )
    if opts.get("final_agent") == judge:
        raise ValueError(
            f"reward.judge_agent {judge!r} is also environment.options.final_agent: the judge judges the team's "
            "answer, so final_agent must be the agent whose answer it judges"
        )
    w = cfg.workflow
    if w.kind == "chain" and not w.factory and (w.order or names)[-1] != judge:
        raise ValueError(f"reward.judge_agent {judge!r} must speak last: end workflow.order with it")
