"""The ``collaborative_task_solving`` environment, scenario ``private_allocation``: no agent sees the whole problem.

The problem generator, the exact optimum, the turn order, the rewards and the metrics are those of
:mod:`services.env_server.envs.resource_allocation` (this env is a subclass); what differs is who observes what
(and the easy level, below):

* the leader (planner) observes the task list and each task's value per unit, but no resource, capacity, use of
  a resource, unit bound or exclusive pair;
* the executor observes the resources and their capacities, each task's use of them per unit, its unit bounds and
  the exclusive pairs, but no value;
* the evaluator observes only the task names;
* every agent observes the transcript of the agents' messages (the last ``history_messages``), so the leader and
  the executor can tell each other what they know.

The environment's feedback on a submission is split the same way (in the transcript and in a
``Latest submission:`` line that shows even with ``history_messages=0``): the evaluator gets the full line (total
value, valid or the violated constraints, resource use), the executor the same without the total value, the
leader only the total value.

A leader message that holds no allocation at all (no ``task_N: amount`` line, no JSON object of amounts), such
as ``task_1 value 7``, is a message: role term 0, no parse error. A leader message with an allocation is a plan
and is scored as in ``resource_allocation``. The team needs both a leader and an executor.

Single-agent baselines (config key ``solo_view``, only with ``num_agents=1``): one agent, in the executor's seat,
plays the same problems alone and submits; a valid submission ends the episode, as for ``resource_allocation``'s
single agent. ``solo_view="executor"`` shows it the executor's part and feedback, ``"leader"`` the leader's part
and feedback (it submits without seeing any limit), ``"all"`` both parts and the full feedback: what one agent of
the team can do alone, against the same model with all the information.

Difficulty levels (:data:`PRIVATE_DIFFICULTIES`): ``pick`` is one resource of capacity 1 and five tasks that each
use one unit of it and may get at most one unit, so the optimum is one unit to the most valuable task; at this
level an agent that knows the values observes only their order (``Tasks, most valuable first: task_3, task_1,
...``, :data:`RANKED_LEVELS`), so the rule once the executor has the leader's facts is "one unit to the first task
the leader names"; at these levels a submission may name tasks instead of giving amounts (one unit to each task
named, :func:`~services.env_server.envs.allocation_problem.parse_names`), so the rule's reply is the leader's first
task alone. The executor's facts are the same on every ``pick`` problem, so the exchange is one way: the
executor needs the leader's order, the leader needs nothing from the executor (alone with the leader's part, one
agent can submit the optimum). ``easy`` is the same tasks with a capacity ``k`` drawn uniformly from 1..4, so the
optimum is the ``k`` highest-value tasks: either agent finds it with the other's facts, while the best either can
submit from its own facts alone completes about a third of the seeds (measured in the tests). ``pair`` is ``easy``
with ``k`` drawn from 1..2 (a step between ``pick`` and ``easy`` in a curriculum; the same tasks as ``pick`` and
``easy`` for the same seed). ``medium`` and
``hard`` are ``resource_allocation``'s levels of the same names (the same problem for the same seed). The config
key ``ranked`` (:func:`resolve_ranked`) plays ``pair`` and ``easy`` ranked too, as ``pick`` is played: the leader observes the
order of the values and a submission may name tasks, so the rule is "the first ``k`` tasks the leader names".
"""

from __future__ import annotations

import random
from typing import Any

from marti.env.config import ConfigField
from marti.errors import InvalidArgumentError
from services.env_server.envs import allocation_problem as ap
from services.env_server.envs import resource_allocation as ra

#: What a single agent (``num_agents=1``) observes: the executor's part, the leader's part, or both.
SOLO_VIEWS = ("executor", "leader", "all")

#: Config keys only this scenario has.
OWN_FIELDS = (
    ConfigField(
        "solo_view",
        "str",
        None,
        "private_allocation with num_agents=1: the one agent (who submits) sees the executor's part, the "
        "leader's part, or all of the problem; null: a team",
        choices=SOLO_VIEWS,
    ),
    ConfigField(
        "ranked",
        "bool",
        None,
        "private_allocation at pick, pair or easy: the leader (and a solo leader view) observes only the order of "
        "the values and a submission may name tasks (one unit each); null: the level's default (true at pick only)",
    ),
)

#: Config keys of the scenario: those of ``resource_allocation`` (same rewards and completion rule) and
#: :data:`OWN_FIELDS`.
FIELDS = ra.FIELDS + OWN_FIELDS

#: difficulty -> spec of the scenario's problems.
PRIVATE_DIFFICULTIES: dict[str, ap.ProblemSpec] = {
    "pick": ap.ProblemSpec(1, 5, 1, demand=(1, 1), capacity="one"),
    "pair": ap.ProblemSpec(1, 5, 1, demand=(1, 1), capacity="random", max_capacity=2),
    "easy": ap.ProblemSpec(1, 5, 1, demand=(1, 1), capacity="random"),
    "medium": ap.DIFFICULTIES["medium"],
    "hard": ap.DIFFICULTIES["hard"],
}

#: Levels at which the views that show values show only their order (see :func:`ranked_task_line`) unless the
#: config's ``ranked`` says otherwise.
RANKED_LEVELS = ("pick",)
#: Levels that may be played ranked (``ranked: true``): every task uses one unit of one resource and may get at
#: most one unit, so the order of the values decides the optimum and a task's name says its amount.
RANKABLE_LEVELS = ("pick", "pair", "easy")

LEADER_FORMAT = (
    "the values, one line per task like 'task_1 value 7' (a line 'task_1: 7' is read as a plan of 7 units), or a "
    "plan: " + ra.ALLOCATION_FORMAT
)

INSTRUCTIONS = {
    "leader": "You are the LEADER (planner). Only you know the tasks' values; only the executor knows the "
    "resources, what each task uses and the limits. Tell the executor the values, one line per task like "
    "'task_1 value 7' (a line 'task_1: 7' would be read as a plan of 7 units). Once you know the limits you may "
    "also propose a plan, " + ra.ALLOCATION_FORMAT + ".",
    "executor": "You are the EXECUTOR. Only you know the resources, what each task uses and the limits; only "
    "the leader knows the tasks' values and will tell you. Submit the allocation to carry out, "
    + ra.ALLOCATION_FORMAT
    + ". Aim for the highest total value that keeps every constraint.",
    "evaluator": "You are the EVALUATOR. You see the environment's feedback on each submission; the leader "
    "knows the tasks' values and the executor the limits, and they tell each other. Judge the executor's "
    "latest allocation: write " + ra.EVALUATION_FORMAT + ", with one sentence of feedback.",
}

#: The leader's instructions and action format at :data:`RANKED_LEVELS`.
RANKED_LEADER_INSTRUCTIONS = (
    "You are the LEADER (planner). Only you know which tasks are worth the most; only the executor knows the "
    "resources and the limits. Tell the executor the tasks, most valuable first."
)
RANKED_LEADER_FORMAT = "the task names, most valuable first (e.g. 'task_3, task_1, task_2'), or a plan: " + (
    ra.ALLOCATION_FORMAT
)
_AIM = "Aim for the highest total value that keeps every constraint."
#: What a submission is at :data:`RANKED_LEVELS` (the executor's and a solo agent's action format): the tasks
#: that get one unit each, named (:func:`~services.env_server.envs.allocation_problem.parse_names`), or an
#: allocation.
PICK_FORMAT = "the names of the tasks that get one unit each, e.g. 'task_3' (or an allocation, " + (
    ra.ALLOCATION_FORMAT + ")"
)
#: The executor's instructions at :data:`RANKED_LEVELS`.
RANKED_EXECUTOR_INSTRUCTIONS = (
    "You are the EXECUTOR. Only you know the resources and the limits; only the leader knows which tasks are "
    f"worth the most and will tell you. Submit {PICK_FORMAT}. {_AIM}"
)
#: Role -> its instructions at :data:`RANKED_LEVELS` in a team.
RANKED_INSTRUCTIONS = {
    **INSTRUCTIONS,
    "leader": RANKED_LEADER_INSTRUCTIONS,
    "executor": RANKED_EXECUTOR_INSTRUCTIONS,
}
#: solo_view -> what the single agent is told it knows.
_SOLO_FACTS = {
    "executor": "You work alone. You know the resources, what each task uses and the limits, but not the tasks' "
    "values.",
    "leader": "You work alone. You know each task's value, but not the resources, what each task uses or the "
    "limits.",
    "all": "You work alone and see the whole problem.",
}
#: solo_view -> the single agent's instructions.
SOLO_INSTRUCTIONS = {
    view: f"{facts} Submit an allocation, {ra.ALLOCATION_FORMAT}. {_AIM}"
    for view, facts in _SOLO_FACTS.items()
}
#: solo_view -> what the single agent is told it knows at :data:`RANKED_LEVELS` (the leader's part is the order of
#: the values).
_RANKED_SOLO_FACTS = {
    **_SOLO_FACTS,
    "leader": "You work alone. You know which tasks are worth the most, but not the resources, what each task "
    "uses or the limits.",
}
#: solo_view -> the single agent's instructions at :data:`RANKED_LEVELS` (a submission is :data:`PICK_FORMAT`).
RANKED_SOLO_INSTRUCTIONS = {
    view: f"{facts} Submit {PICK_FORMAT}. {_AIM}" for view, facts in _RANKED_SOLO_FACTS.items()
}

#: An agent's view -> (shows the values, shows the constraints, which feedback of :func:`private_feedback`).
VIEWS = {
    "leader": (True, False, "leader"),
    "executor": (False, True, "executor"),
    "evaluator": (False, False, "evaluator"),
    "all": (True, True, "evaluator"),
}


def ranked_task_names(problem: ap.Problem) -> list[str]:
    """The task names ordered by value per unit, most valuable first; equal values keep task order.

    Args:
        problem: The instance.

    Returns:
        The names, e.g. ``["task_3", "task_1", "task_2"]``: what an agent that knows the values observes at
        :data:`RANKED_LEVELS` instead of the values (``tasks_most_valuable_first`` in the JSON format).
    """
    return [t.name for t in sorted(problem.tasks, key=lambda t: -t.value)]  # sorted is stable


def ranked_task_line(problem: ap.Problem) -> str:
    """:func:`ranked_task_names` as one observation line: ``"Tasks, most valuable first: task_3, task_1."``."""
    return "Tasks, most valuable first: " + ", ".join(ranked_task_names(problem)) + "."


def private_feedback(problem: ap.Problem, actor: str, score: ap.Score) -> dict[str, str]:
    """Split the environment's feedback on a readable submission by role.

    Args:
        problem: The instance.
        actor: The agent that submitted.
        score: The submission's :class:`~services.env_server.envs.allocation_problem.Score`.

    Returns:
        Role -> feedback: ``evaluator`` the full line of
        :func:`~services.env_server.envs.resource_allocation.submission_feedback`; ``executor`` validity or the
        violated constraints and resource use, without the total value; ``leader`` the total value only.
    """
    return {
        "evaluator": ra.submission_feedback(problem, actor, score),
        "executor": ra.submission_feedback(problem, actor, score, value=False),
        "leader": f"{actor}'s allocation has total value {score.value}.",
    }


def resolve_ranked(config: dict[str, Any]) -> bool:
    """Whether the episode is played ranked: the config's ``ranked``, or the level's default.

    Args:
        config: Validated config with ``difficulty`` and ``ranked`` (null: ranked at :data:`RANKED_LEVELS`).

    Returns:
        True when the views that show values show only their order and submissions may name tasks.

    Raises:
        InvalidArgumentError: ``ranked: true`` at a level outside :data:`RANKABLE_LEVELS` (there a task may get
            several units or use several resources, so neither the order nor a name says enough).
    """
    level, ranked = config["difficulty"], config.get("ranked")
    if ranked is None:
        return level in RANKED_LEVELS
    if ranked and level not in RANKABLE_LEVELS:
        raise InvalidArgumentError(
            f"ranked=True needs difficulty in {RANKABLE_LEVELS} (one-unit tasks of one resource), got "
            f"difficulty={level!r}"
        )
    return bool(ranked)


class PrivateAllocationEnv(ra.ResourceAllocationEnv):
    """Leader/executor/evaluator team whose problem facts are split between them (see module docstring).

    Args:
        config: Validated config (common text-env keys plus :data:`FIELDS`).
        seed: Seed of the first ``reset`` without a seed; ``None`` draws from the OS.

    Raises:
        InvalidArgumentError: Without ``solo_view``, the roles lack a leader or an executor (e.g.
            ``num_agents=1``); ``solo_view`` set with more than one agent; or any error of
            :func:`~services.env_server.envs.resource_allocation.resolve_roles`.
    """

    metadata = {**ra.ResourceAllocationEnv.metadata, "name": "collaborative_task_solving/private_allocation"}
    action_formats = {**ra.ACTION_FORMATS, "leader": LEADER_FORMAT}

    def __init__(self, config: dict[str, Any], seed: int | None = None) -> None:
        super().__init__(config, seed)
        solo = config.get("solo_view")
        if solo is not None and len(self.role_of_list) != 1:
            raise InvalidArgumentError(
                f"solo_view={solo!r} needs num_agents=1 (one agent who sees that part and submits), got roles "
                f"{self.role_of_list}; a team takes no solo_view"
            )
        if solo is None and "leader" not in self.role_of_list:
            raise InvalidArgumentError(
                f"private_allocation needs a leader and an executor, got roles {self.role_of_list} "
                "(num_agents must be 2 or 3, or 1 with solo_view)"
            )
        self.solo_view: str | None = solo
        #: agent -> its view (a key of :data:`VIEWS`): its role in a team, ``solo_view`` alone.
        self.view_of = {a: solo or r for a, r in self.role_of.items()}
        #: Ranked (by default at :data:`RANKED_LEVELS`, or with ``ranked: true``): the views that show values show
        #: only their order, and a submission may name tasks.
        self.ranked = resolve_ranked(config)
        if self.ranked:
            self.action_formats = {
                **self.action_formats,
                "leader": RANKED_LEADER_FORMAT,
                "executor": PICK_FORMAT,
            }
        self._variants: dict[int, dict[str, str]] = {}
        self._latest_feedback: dict[str, str] = {}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Draw a new problem and start the episode (see :meth:`ResourceAllocationEnv.reset`).

        Args:
            seed: Reseeds the problem generator; ``None`` continues the current stream.
            options: Ignored (accepted for the PettingZoo API).

        Returns:
            ``(observations, infos)`` for every agent; each observation shows only that agent's facts.
        """
        self._variants = {}
        self._latest_feedback = {}
        return super().reset(seed=seed, options=options)

    def _generate_problem(self, rng: random.Random) -> ap.Problem:
        return ap.generate(rng, PRIVATE_DIFFICULTIES[self.config["difficulty"]])

    def _plan(self, actor: str, text: str) -> tuple[float, bool]:
        if ap.parse_allocation(text, self.problem.task_names).absent:
            self.parse_error = ""
            return 0.0, False
        return super()._plan(actor, text)

    def _read_submission(self, text: str) -> ap.ParsedAllocation:
        if self.ranked:
            return ap.parse_names(text, self.problem.task_names)
        return super()._read_submission(text)

    def _execute(self, actor: str, text: str) -> tuple[float, bool]:
        term, done = super()._execute(actor, text)
        if self.last_score is None:  # unreadable: the parse-error line says nothing private
            self._latest_feedback = dict.fromkeys(ra.ROLE_ORDER, self.transcript[-1][2])
        return term, done

    def _post_feedback(self, actor: str, score: ap.Score) -> None:
        variants = private_feedback(self.problem, actor, score)
        self.transcript.append(("environment", "feedback", variants["evaluator"]))
        self._variants[len(self.transcript) - 1] = variants
        self._latest_feedback = variants

    def _instructions(self, agent: str) -> str:
        if self.solo_view is not None:
            return (RANKED_SOLO_INSTRUCTIONS if self.ranked else SOLO_INSTRUCTIONS)[self.solo_view]
        if self.ranked:
            return RANKED_INSTRUCTIONS[self.role_of[agent]]
        return INSTRUCTIONS[self.role_of[agent]]

    def _problem_lines(self, agent: str) -> list[str]:
        if getattr(self, "_problem_text_for", None) is not self.problem:
            self._problem_text_for = self.problem
            self._problem_text_by_view = {}
        view = self.view_of[agent]
        if view not in self._problem_text_by_view:
            values, constraints, _ = VIEWS[view]
            if self._sees_ranking(view):
                intro = ra.describe_problem(self.problem, values=False, constraints=False)[0]
                self._problem_text_by_view[view] = [intro, ranked_task_line(self.problem)]
            else:
                self._problem_text_by_view[view] = ra.describe_problem(
                    self.problem, values=values, constraints=constraints
                )
        return self._problem_text_by_view[view]

    def _problem_doc(self, agent: str) -> dict:
        if self._sees_ranking(self.view_of[agent]):
            return {"tasks_most_valuable_first": ranked_task_names(self.problem)}
        values, constraints, _ = VIEWS[self.view_of[agent]]
        return self.problem.to_dict(values=values, constraints=constraints)

    def _sees_ranking(self, view: str) -> bool:
        """At :data:`RANKED_LEVELS`, a view that shows the values but not the limits (the leader's) sees only
        their order."""
        values, constraints, _ = VIEWS[view]
        return self.ranked and values and not constraints

    def _visible_transcript(self, agent: str) -> list[tuple[str, str, str]]:
        feedback = VIEWS[self.view_of[agent]][2]
        return [
            (s, r, self._variants[i][feedback]) if i in self._variants else (s, r, t)
            for i, (s, r, t) in enumerate(self.transcript)
        ]

    def _private_lines(self, agent: str) -> list[str]:
        text = self._latest_feedback.get(VIEWS[self.view_of[agent]][2])
        return [f"Latest submission: {text}"] if text else []
