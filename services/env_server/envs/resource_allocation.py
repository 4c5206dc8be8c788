"""The ``collaborative_task_solving`` environment, scenario ``resource_allocation``.

A team (leader/planner, executor, evaluator by default) solves a seeded allocation problem
(:mod:`services.env_server.envs.allocation_problem`) in turns, up to ``max_turns``:

1. the leader proposes a plan (``task_1: 2`` lines or JSON);
2. the executor submits a concrete allocation in the same format; the environment scores it and posts
   feedback (value, violated constraints, resource use) to the shared transcript;
3. the evaluator writes ``score: X`` (its estimate of value / optimum, 0..1) and ``accept`` or ``revise``.

``accept`` after a submission ends the episode (terminated); otherwise the cycle repeats until ``max_turns``
(truncated). Without an evaluator a valid submission ends the episode; without a leader the executor plays alone
(the single-agent baseline). Every agent observes the whole problem and the shared transcript; only the acting
agent's action is read, the others send ``""``.

Rewards (``lambda`` = ``violation_penalty``, ``w`` = ``role_weight``):

* team score of a submission: ``value / optimum`` if it breaks no constraint else ``0``, minus
  ``min(lambda * violations, max_violation_penalty)``; an unreadable submission scores ``-parse_penalty``. With
  the defaults (0.1, cap 0.4, parse 0.5) the order is unreadable < readable but invalid (fewer violations
  better) < valid: an earlier uncapped penalty (0.25 each) made a readable plan with three violations score
  below unreadable text, and GRPO then taught the agents to stop writing allocations;
* role terms: leader ``plan quality`` (team-score formula applied to the plan), executor
  ``0.5 * valid + 0.5 * fidelity`` (fidelity = ``1 - sum|x - plan| / max(1, sum max(x, plan))``, or validity when
  there is no plan), evaluator ``1 - |score - true fraction|``; unreadable text gets ``-parse_penalty``, and so
  does an evaluator score outside ``[0, 1]`` (it is not clipped);
* ``dense``: each turn every live agent gets the change of the team score, and the actor also ``w * role term``;
  ``sparse``: zeros until the end, then ``final team score + w * mean(role terms of that agent)``.

Every agent's infos carry ``calibration_error`` = ``|score - true fraction|`` of the evaluator's latest readable
score, once it has written one (the key is absent before); it is a declared episode metric.
"""

from __future__ import annotations

import json
import random
from typing import Any

from marti.env.config import ConfigField
from marti.errors import InvalidArgumentError
from services.env_server.envs import allocation_problem as ap
from services.env_server.envs.text_base import TextTeamEnv, sanitize

ROLE_ORDER = ("leader", "executor", "evaluator")
ROLE_ALIASES = {"planner": "leader", "leader": "leader", "executor": "executor", "evaluator": "evaluator"}
DEFAULT_ROLES = {1: ["executor"], 2: ["leader", "executor"], 3: ["leader", "executor", "evaluator"]}

FIELDS = (
    ConfigField(
        "completion_threshold",
        "float",
        0.9,
        "task completion = valid allocation with value >= threshold * optimum",
        minimum=0.0,
        maximum=1.0,
    ),
    ConfigField("violation_penalty", "float", 0.1, "team-score penalty per violated constraint", minimum=0.0),
    ConfigField(
        "max_violation_penalty",
        "float",
        0.4,
        "cap of the violation penalty of one allocation; keep it below parse_penalty so that any readable "
        "allocation outscores unreadable text",
        minimum=0.0,
    ),
    ConfigField("parse_penalty", "float", 0.5, "penalty for an action that cannot be read", minimum=0.0),
    ConfigField("role_weight", "float", 0.5, "weight of each agent's role term in its reward", minimum=0.0),
)

ALLOCATION_FORMAT = "one line per task, e.g. 'task_1: 2' (or JSON {\"task_1\": 2, ...})"
EVALUATION_FORMAT = (
    "'score: X' with X in 0..1 (value as a fraction of the best possible), then 'accept' or 'revise'"
)

#: Role -> the action format its infos name (``infos[agent]["action_format"]``).
ACTION_FORMATS = {"leader": ALLOCATION_FORMAT, "executor": ALLOCATION_FORMAT, "evaluator": EVALUATION_FORMAT}

INSTRUCTIONS = {
    "leader": "You are the LEADER (planner). Propose an allocation plan for the executor, "
    + ALLOCATION_FORMAT
    + ". Aim for the highest total value that keeps every constraint.",
    "executor": "You are the EXECUTOR. Submit the allocation to carry out, "
    + ALLOCATION_FORMAT
    + ". Follow the leader's plan unless it breaks a constraint.",
    "executor_solo": "You are the EXECUTOR. Submit an allocation, "
    + ALLOCATION_FORMAT
    + ". Aim for the highest total value that keeps every constraint.",
    "evaluator": "You are the EVALUATOR. Judge the executor's latest allocation: write "
    + EVALUATION_FORMAT
    + ", with one sentence of feedback.",
}


def resolve_roles(config: dict[str, Any]) -> list[str]:
    """Work out each agent's role from ``num_agents`` and ``roles``.

    Args:
        config: Validated config.

    Returns:
        Canonical role names (``leader``, ``executor``, ``evaluator``), one per agent.

    Raises:
        InvalidArgumentError: Unknown role, a role used twice, no executor, or ``num_agents`` disagreeing with
            ``roles`` or above 3.
    """
    n, roles = config["num_agents"], config["roles"]
    if roles is None:
        n = 3 if n is None else n
        if n not in DEFAULT_ROLES:
            raise InvalidArgumentError(f"num_agents={n} is not supported by resource_allocation (1 to 3)")
        return list(DEFAULT_ROLES[n])
    out = []
    for r in roles:
        if not isinstance(r, str) or r.lower() not in ROLE_ALIASES:
            raise InvalidArgumentError(f"unknown role {r!r} (known: {', '.join(ROLE_ALIASES)})")
        out.append(ROLE_ALIASES[r.lower()])
    if n is not None and n != len(out):
        raise InvalidArgumentError(f"num_agents={n} but roles has {len(out)} entries")
    if len(set(out)) != len(out) or "executor" not in out:
        raise InvalidArgumentError(
            f"roles {roles!r} must hold one executor and at most one leader and evaluator"
        )
    return out


def describe_problem(problem: ap.Problem, values: bool = True, constraints: bool = True) -> list[str]:
    """Render a problem as observation lines.

    Args:
        problem: The instance.
        values: Show each task's value per unit.
        constraints: Show the resources and capacities, each task's use of them, its unit bounds, and the
            exclusive pairs.

    Returns:
        The lines: an introduction, then (``constraints``) the resources, then one line per task
        (``- task_1: value 6 per unit, uses cpu 4, gpu 0 per unit, at most 2 units``, with the parts asked for),
        then (``constraints``) one line per exclusive pair.
    """
    lines = [
        "Problem: decide how many units each task gets. Each unit earns the task's value and uses the "
        "listed resources. Maximise total value while keeping every constraint."
    ]
    if constraints:
        lines.append(
            "Resources: " + ", ".join(f"{r} capacity {c}" for r, c in problem.capacities.items()) + "."
        )
    lines.append("Tasks:")
    for t in problem.tasks:
        parts = [f"value {t.value} per unit"] if values else []
        if constraints:
            uses = ", ".join(f"{r} {d}" for r, d in t.demand.items())
            parts += [f"uses {uses} per unit", f"at most {t.max_units} units"]
            if t.min_units:
                parts.append(f"must get at least {t.min_units}")
        lines.append(f"- {t.name}: {', '.join(parts)}" if parts else f"- {t.name}")
    if constraints:
        for a, b in problem.exclusive:
            lines.append(f"Constraint: {a} and {b} cannot both get units.")
    return lines


def submission_feedback(problem: ap.Problem, actor: str, score: ap.Score, value: bool = True) -> str:
    """The environment's feedback line on a readable submission.

    Args:
        problem: The instance.
        actor: The agent that submitted.
        score: The submission's :class:`~services.env_server.envs.allocation_problem.Score`.
        value: Include the total value.

    Returns:
        ``"<actor>'s allocation has total value V; valid|INVALID: <violations>; used cpu 3/4, ..."``, or without
        ``value``: ``"<actor>'s allocation is valid|INVALID: <violations>; used cpu 3/4, ..."``.
    """
    use = ", ".join(f"{r} {score.used[r]}/{c}" for r, c in problem.capacities.items())
    verdict = "valid" if score.valid else "INVALID: " + "; ".join(score.violations)
    head = f"has total value {score.value};" if value else "is"
    return f"{actor}'s allocation {head} {verdict}; used {use}."


class ResourceAllocationEnv(TextTeamEnv):
    """Leader/executor/evaluator team solving seeded allocation problems (see module docstring).

    Args:
        config: Validated config (common text-env keys plus :data:`FIELDS`).
        seed: Seed of the first ``reset`` without a seed; ``None`` draws from the OS.
    """

    metadata = {
        "name": "collaborative_task_solving/resource_allocation",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
        # Episode metrics (info keys read after the last step) that trainers aggregate: see marti.env.make.
        "metrics": (
            "task_completion",
            "resource_utilization",
            "constraint_violations",
            "team_score",
            "calibration_error",
        ),
    }

    #: Role -> action format named in the infos.
    action_formats = ACTION_FORMATS

    def __init__(self, config: dict[str, Any], seed: int | None = None) -> None:
        super().__init__(config)
        self.role_of_list = resolve_roles(config)
        self.possible_agents = [f"agent_{i + 1}" for i in range(len(self.role_of_list))]
        self.role_of = dict(zip(self.possible_agents, self.role_of_list, strict=True))
        self.turn_order = [a for r in ROLE_ORDER for a in self.possible_agents if self.role_of[a] == r]
        self._seed = seed
        self._rng: random.Random | None = None
        self.problem: ap.Problem | None = None

    # ---- episode state ----
    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Draw a new problem and start the episode.

        Args:
            seed: Reseeds the problem generator; ``None`` continues the current stream.
            options: Ignored (accepted for the PettingZoo API).

        Returns:
            ``(observations, infos)`` for every agent.
        """
        if seed is not None or self._rng is None:
            self._rng = random.Random(self._seed if seed is None else seed)
        self.problem = self._generate_problem(self._rng)
        self.optimal_value, self.optimal_allocation = ap.solve(self.problem)
        self.agents = list(self.possible_agents)
        self.turn = 0
        self.transcript = []
        self.plan: dict[str, int] | None = None
        self.submission: dict[str, int] | None = None
        self.last_score: ap.Score | None = None
        self.team_score = 0.0
        self.parse_error = ""
        self.calibration_error: float | None = None
        self.role_terms: dict[str, list[float]] = {a: [] for a in self.agents}
        self.acting_agents = [self.turn_order[0]]
        return self._observations(), self._infos()

    def _generate_problem(self, rng: random.Random) -> ap.Problem:
        return ap.generate(rng, self.config["difficulty"])

    def _team_score(self, score: ap.Score) -> float:
        ratio = (
            score.value / self.optimal_value if self.optimal_value > 0 and score.valid else float(score.valid)
        )
        penalty = min(
            self.config["violation_penalty"] * len(score.violations), self.config["max_violation_penalty"]
        )
        return ratio - penalty

    def _fidelity(self, alloc: dict[str, int]) -> float:
        if self.plan is None:
            return 1.0
        diff = sum(abs(alloc[n] - self.plan[n]) for n in alloc)
        return 1.0 - diff / max(1, sum(max(alloc[n], self.plan[n]) for n in alloc))

    def _true_fraction(self) -> float:
        if self.last_score is None or not self.last_score.valid:
            return 0.0
        return self.last_score.value / self.optimal_value if self.optimal_value > 0 else 1.0

    def step(self, actions: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        """Play one turn: read the acting agent's text, update the team state and return PettingZoo tuples.

        Args:
            actions: Agent -> text. Only the acting agent's entry is read (absent means ``""``).

        Returns:
            ``(observations, rewards, terminations, truncations, infos)`` keyed by the agents live before the
            step; after the last step ``agents`` is empty.
        """
        actor = self.acting_agents[0]
        role = self.role_of[actor]
        text = actions.get(actor, self.missing_action)
        self.transcript.append((actor, role, text))
        self.turn += 1
        previous_team = self.team_score
        handler = {"leader": self._plan, "executor": self._execute, "evaluator": self._evaluate}[role]
        term, done = handler(actor, text)
        self.role_terms[actor].append(term)
        truncated = not done and self.turn >= self.config["max_turns"]
        live = list(self.agents)
        rewards = dict.fromkeys(live, 0.0)
        w = self.config["role_weight"]
        if self.config["reward_type"] == "dense":
            for a in live:
                rewards[a] = self.team_score - previous_team
            rewards[actor] += w * term
        elif done or truncated:
            for a in live:
                terms = self.role_terms[a]
                rewards[a] = self.team_score + (w * sum(terms) / len(terms) if terms else 0.0)
        nxt = self.turn_order[(self.turn_order.index(actor) + 1) % len(self.turn_order)]
        self.acting_agents = [] if done or truncated else [nxt]
        obs, infos = self._observations(), self._infos()
        terminations = dict.fromkeys(live, done)
        truncations = dict.fromkeys(live, truncated)
        if done or truncated:
            self.agents = []
        return obs, rewards, terminations, truncations, infos

    def _plan(self, actor: str, text: str) -> tuple[float, bool]:
        parsed = ap.parse_allocation(text, self.problem.task_names)
        if parsed.allocation is None:
            self.parse_error = f"{actor}'s plan could not be read: {parsed.error}"
            self.transcript.append(("environment", "feedback", self.parse_error))
            return -self.config["parse_penalty"], False
        self.parse_error = ""
        self.plan = parsed.allocation
        return self._team_score(ap.score(self.problem, parsed.allocation, parsed.unknown)), False

    def _read_submission(self, text: str) -> ap.ParsedAllocation:
        """Read a submitted allocation (:func:`~services.env_server.envs.allocation_problem.parse_allocation`)."""
        return ap.parse_allocation(text, self.problem.task_names)

    def _execute(self, actor: str, text: str) -> tuple[float, bool]:
        parsed = self._read_submission(text)
        if parsed.allocation is None:
            self.parse_error = f"{actor}'s allocation could not be read: {parsed.error}"
            self.transcript.append(("environment", "feedback", self.parse_error))
            self.team_score = -self.config["parse_penalty"]
            self.submission, self.last_score = None, None
            return -self.config["parse_penalty"], False
        self.parse_error = ""
        score = ap.score(self.problem, parsed.allocation, parsed.unknown)
        self.submission, self.last_score = parsed.allocation, score
        self.team_score = self._team_score(score)
        self._post_feedback(actor, score)
        term = 0.5 * float(score.valid) + 0.5 * (
            self._fidelity(parsed.allocation) if self.plan else score.valid
        )
        solo_done = "evaluator" not in self.role_of_list and score.valid
        return term, solo_done

    def _post_feedback(self, actor: str, score: ap.Score) -> None:
        """Append the environment's feedback on a readable submission to the transcript."""
        self.transcript.append(("environment", "feedback", submission_feedback(self.problem, actor, score)))

    def _evaluate(self, actor: str, text: str) -> tuple[float, bool]:
        parsed = ap.parse_evaluation(text)
        if parsed.score is None:
            reason = parsed.error or "has no score"
            self.parse_error = f"{actor}'s evaluation {reason}: write {EVALUATION_FORMAT}"
            self.transcript.append(("environment", "feedback", self.parse_error))
            return -self.config["parse_penalty"], False
        self.parse_error = ""
        self.calibration_error = abs(parsed.score - self._true_fraction())
        return 1.0 - self.calibration_error, parsed.accept and self.submission is not None

    # ---- observations and infos ----
    def _problem_lines(self, agent: str) -> list[str]:
        """The problem as the agent's observation shows it (here: the whole problem, the same for everyone)."""
        if getattr(self, "_problem_text_for", None) is not self.problem:
            self._problem_text_for = self.problem
            self._problem_text = describe_problem(self.problem)
        return self._problem_text

    def _problem_doc(self, agent: str) -> dict:
        """The problem as the agent's JSON observation shows it (here: the whole problem)."""
        return self.problem.to_dict()

    def _visible_transcript(self, agent: str) -> list[tuple[str, str, str]]:
        """The transcript entries the agent's observation quotes from (here: all of them)."""
        return self.transcript

    def _private_lines(self, agent: str) -> list[str]:
        """Lines only this agent's observation shows, after the problem (here: none)."""
        return []

    def _instructions(self, agent: str) -> str:
        role = self.role_of[agent]
        if role == "executor" and "leader" not in self.role_of_list:
            return INSTRUCTIONS["executor_solo"]
        return INSTRUCTIONS[role]

    def _turn_line(self, agent: str) -> str:
        if not self.acting_agents:
            return "The episode is over."
        nxt = self.acting_agents[0]
        if nxt == agent:
            return "It is your turn. Reply now in the requested format."
        return f"It is {nxt}'s turn ({self.role_of[nxt]}); reply with an empty message."

    def _observations(self) -> dict[str, str]:
        team = ", ".join(f"{a}: {self.role_of[a]}" for a in self.possible_agents)
        out = {}
        for agent in self.possible_agents:
            if self.config["observation_format"] == "json":
                q = self.config["max_quote_chars"]
                n = self.config["history_messages"]
                doc = {
                    "agent": agent,
                    "role": self.role_of[agent],
                    "instructions": self._instructions(agent),
                    "team": {a: self.role_of[a] for a in self.possible_agents},
                    "problem": self._problem_doc(agent),
                    "history": [
                        {"agent": s, "role": r, "text": sanitize(t, q)}
                        for s, r, t in (self._visible_transcript(agent)[-n:] if n else [])
                    ],
                    "turn": self.turn,
                    "max_turns": self.config["max_turns"],
                    "acting_agent": self.acting_agents[0] if self.acting_agents else None,
                    "your_turn": agent in self.acting_agents,
                }
                private = self._private_lines(agent)
                if private:
                    doc["private"] = private
                out[agent] = self._fit(json.dumps(doc, ensure_ascii=True))
                continue
            lines = [
                f"You are {agent} in a team of {len(self.possible_agents)} ({team}).",
                self._instructions(agent),
                *self._problem_lines(agent),
                *self._private_lines(agent),
            ]
            history = self._history_lines(self._visible_transcript(agent))
            lines.append(f"Turn {self.turn} of at most {self.config['max_turns']}.")
            if history:
                lines += ["Conversation so far:", *history]
            lines.append(self._turn_line(agent))
            out[agent] = self._fit("\n".join(lines))
        return out

    def _infos(self) -> dict[str, dict[str, Any]]:
        s = self.last_score
        valid = bool(s is not None and s.valid)
        completion = bool(valid and s.value >= self.config["completion_threshold"] * self.optimal_value)
        nxt = self.acting_agents[0] if self.acting_agents else ""
        common = {
            "acting_agent": nxt,
            "turn": self.turn,
            "task_completion": completion,
            "resource_utilization": float(s.utilization) if s is not None else 0.0,
            "constraint_violations": len(s.violations) if s is not None else 0,
            "optimal_value": float(self.optimal_value),
            "allocated_value": float(s.value) if s is not None else 0.0,
            "valid_allocation": valid,
            "team_score": float(self.team_score),
            "parse_error": self.parse_error,
        }
        if self.calibration_error is not None:
            common["calibration_error"] = float(self.calibration_error)
        out = {}
        for a in self.possible_agents:
            role = self.role_of[a]
            out[a] = {
                "role": role,
                "is_acting": a == nxt,
                "action_format": self.action_formats[role],
                **common,
            }
        return out
