"""The sections of the training config that shape who acts and how it is credited: ``workflow:`` (docs/workflows.md),
``reward_alloc:``, ``budget:``, ``tasks:``, ``curriculum:`` and ``allocation:``. Re-exported by
:mod:`marti.config.schema`, whose :class:`~marti.config.schema.TrainConfig` holds them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from marti.config.section import (
    NAME_RE,
    Difficulty,
    NonNegFloat,
    PositiveFloat,
    PositiveInt,
    Section,
    UnitFloat,
)
from marti.team.prompt_template import check_prompt_template


class RewardAllocConfig(Section):
    """Credit assignment: an agent's reward is ``team_weight * team_reward + role_weight * role_reward``."""

    team_weight: NonNegFloat = 1.0
    """Weight of the shared team reward."""
    role_weight: NonNegFloat = 0.5
    """Weight of the agent's own role reward."""

    @model_validator(mode="after")
    def _check(self) -> RewardAllocConfig:
        if self.team_weight == 0 and self.role_weight == 0:
            raise ValueError(
                "reward_alloc.team_weight and reward_alloc.role_weight are both 0: no reward left"
            )
        return self


class BudgetConfig(Section):
    """Limits that end a run early, besides ``max_steps``."""

    max_wall_time_s: PositiveFloat | None = None
    """Wall-time budget, seconds from the first evaluation: no step starts that would end, with the final
    evaluation, past it (estimated from the last step and the first evaluation); the run then checkpoints and
    writes its report. At least one step always runs. Null: no limit."""
    stop_after_steps: PositiveInt | None = None
    """Steps this run trains (counted from where it starts or resumes) before it stops as the wall-time budget
    does: it evaluates, checkpoints, writes its report, prints the resume command and exits 0. The LR schedule
    and the step count still span ``max_steps``, so ``marti train ... --resume`` goes on with the same run: a
    long job in chunks, or a short check of a long job's first steps. Null: run to ``max_steps``."""


class WorkflowRoleConfig(Section):
    """One agent's role in a workflow: prompt, parser and (optionally) a script instead of a model."""

    agent: str
    """The agent (a name from ``agents``)."""
    system_prompt: str | None = None
    """System prompt template (``{name}``, ``{role}``, ``{capabilities}``; another placeholder, such as a dataset
    column, is refused at load); null: the agent's own."""
    prompt_builder: str | None = None
    """Import path of ``build_prompt(PromptContext) -> str | marti.team.workflow.TurnPrompt``: the user message, or a
    ``TurnPrompt(user, reply_start)`` whose ``reply_start`` this turn's reply is made to start with (prefilled after
    the agent's ``response_prefix``, not trained); null: observation + messages."""
    parser: str | None = None
    """Import path of ``parser(text) -> action`` (reply text -> env action); null: the text unchanged."""
    scripted: str | None = None
    """Import path of ``policy(chat) -> str``: a scripted agent (needs ``is_tuning: false``); null: the model."""

    @field_validator("system_prompt")
    @classmethod
    def _check_template(cls, value: str | None) -> str | None:
        return value if value is None else check_prompt_template(value)


class WorkflowConfig(Section):
    """Who acts when and how prompts, actions and rewards are built (``marti.team.workflow``, docs/workflows.md)."""

    kind: Literal["env", "chain", "parallel_aggregate", "debate", "custom"] = "env"
    """``env``: the env's ``is_acting`` picks speakers; ``chain``: one agent per turn in ``order``;
    ``parallel_aggregate``: ``order`` at once, then ``aggregator``; ``debate``: ``rounds`` solver rounds, then
    ``aggregator``; ``custom``: ``next_speakers``."""
    order: list[str] = Field(default_factory=list)
    """Chain order, or the workers/solvers; empty: every agent (but the aggregator) in config order."""
    aggregator: str | None = None
    """The aggregating agent of ``parallel_aggregate`` and ``debate``."""
    rounds: PositiveInt = 2
    """Solver rounds before the aggregator (``debate``)."""
    next_speakers: str | None = None
    """Import path of ``next_speakers(WorkflowState) -> list[agent]`` (``custom``)."""
    factory: str | None = None
    """Import path of ``build(cfg) -> marti.team.workflow.Workflow``; overrides every other key of this section."""
    roles: list[WorkflowRoleConfig] = Field(default_factory=list)
    """Per-agent roles (prompt builder, parser, script)."""
    reward_fn: str | None = None
    """Import path of ``reward_fn(EpisodeView) -> {agent: reward}``; null: env rewards only."""
    reward_env_weight: NonNegFloat = 1.0
    """Weight of the env's return in an agent's reward."""
    reward_custom_weight: NonNegFloat = 1.0
    """Weight of ``reward_fn``'s value in an agent's reward."""
    reward_team_share: UnitFloat = 0.0
    """Fraction of the team mean reward mixed into each agent's reward, in [0, 1]."""

    @property
    def active(self) -> bool:
        """True when this section changes anything from the env-driven default path: another kind, a factory,
        roles, a ``reward_fn``, or reward weights that re-credit the env's returns (``reward_env_weight`` other
        than 1, ``reward_team_share`` above 0)."""
        return bool(
            self.kind != "env"
            or self.factory
            or self.roles
            or self.reward_fn
            or self.reward_env_weight != 1.0
            or self.reward_team_share != 0.0
        )


class TaskConfig(Section):
    """One task of a multi-task job: an env/scenario entry with a sampling weight."""

    name: str
    """Task name (letters, digits, ``_ . -``); metrics are logged as ``task/<name>/...``."""
    weight: PositiveFloat = 1.0
    """Sampling weight (relative; probabilities are weights over their sum)."""
    env_name: str | None = None
    """Env id or import path; null: ``environment.env_name``."""
    scenario: str | None = None
    """Scenario; null: ``environment.scenario``."""
    difficulty: Difficulty | None = None
    """Starting difficulty; null: ``environment.difficulty`` (or the curriculum's first level)."""
    max_turns: PositiveInt | None = None
    """Most turns; null: ``environment.max_turns``."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Extra env settings, merged over ``environment.options``."""

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError(f"task name {value!r} must match {NAME_RE.pattern}")
        return value


class CurriculumConfig(Section):
    """Raise a task's difficulty when its recent success rate passes a threshold."""

    enabled: bool = False
    """Turn the curriculum on."""
    levels: list[Difficulty] = Field(default_factory=lambda: ["easy", "medium", "hard"])
    """Difficulty levels, easiest first."""
    metric: str = "task_completion"
    """Episode metric read as success (an episode succeeds when it is >= ``success_value``)."""
    success_value: float = 1.0
    """Metric value at or above which an episode counts as a success."""
    threshold: UnitFloat = 0.8
    """Success rate over the last ``window`` episodes that moves a task up one level."""
    window: PositiveInt = 16
    """Episodes of a task the success rate is measured over (the window restarts after a level change)."""

    @field_validator("levels")
    @classmethod
    def _check_levels(cls, value: list[str]) -> list[str]:
        if not value or len(set(value)) != len(value):
            raise ValueError(f"curriculum.levels must be non-empty and distinct, got {value}")
        return value


class AllocationConfig(Section):
    """Priority-based split of the training budget across agents (docs/workflows.md defines each term)."""

    enabled: bool = False
    """Turn priority allocation on (off: every agent trains on all its samples)."""
    progress_weight: NonNegFloat = 0.5
    """Weight of task progress (recent change of the agent's reward)."""
    efficiency_weight: NonNegFloat = 0.3
    """Weight of resource efficiency (the cheapest agent's tokens per turn over the agent's)."""
    urgency_weight: NonNegFloat = 0.2
    """Weight of urgency (how far the agent's reward is behind the best agent's)."""
    min_share: UnitFloat = 0.1
    """Floor of every agent's share (``num trainable agents * min_share <= 1``), so no agent starves."""
    window: PositiveInt = 4
    """Steps of history each term is measured over."""
    budget_samples: PositiveInt | None = None
    """Training samples per step across agents; null: all samples collected this step."""

    @model_validator(mode="after")
    def _check(self) -> AllocationConfig:
        if self.progress_weight + self.efficiency_weight + self.urgency_weight <= 0:
            raise ValueError("allocation weights are all 0: priorities undefined")
        return self
