"""The ``dataset_task`` env: a team answers one problem row of the user's dataset, scored by a built-in verifier.

The row (its columns, a JSON-able dict) comes in the env config (``row``), so a remote env server needs no
access to the user's files; ``rows`` holds several and ``reset(seed)`` plays ``rows[seed % len(rows)]`` (a
reset without a seed plays the make seed's row first, then the next row each time).

Each agent's observation is exactly the text of its column of the row (``input_key``, or its
``agent_inputs`` column), every turn, unchanged: full Unicode, never the printable-ASCII sanitising of the
built-in scenarios. Every agent is acting every turn (the trainer's workflow decides who speaks; agents that
do not speak send ``""``); an agent's answer is its last non-empty action. The episode ends (every agent
terminated) after ``max_turns`` steps, and only then are rewards given:

* the team's answer is ``final_agent``'s last answer (default: the last agent that spoke; agents that speak in
  the same step count in team order), or with ``final: majority`` the most common answer (what the verifier
  reads, :func:`marti.rewards.team.answer_of`, normalised; ties go to the answer of the earliest agent in team
  order) among the agents' last answers;
* an agent's reward is ``(1 - own_weight) * team_correct + own_weight * own_correct`` when it gave an answer,
  else ``team_correct`` (``own_weight`` default 0.5: half for the team's answer, half for its own).

The final infos carry each agent's ``answer`` (extracted; ``""`` when none), ``correct``, ``spoke``, the
``team_answer`` and ``team_correct``, and the declared metrics ``task_completion`` (team correctness, 0/1) and
``accuracy/<agent>`` (its own correctness, 0 when it gave no answer), in every agent's info.
"""

from __future__ import annotations

from typing import Any

import gymnasium
from pettingzoo import ParallelEnv

from marti.env.config import ConfigField, ConfigSchema
from marti.env.registry import EnvSpec, Registry
from marti.errors import InvalidArgumentError
from marti.rewards.team import OWN_WEIGHT, answer_of, credit, team_reply
from marti.rewards.verifiers import VERIFIERS
from services.env_server.envs import dataset_rows as dr
from services.env_server.envs.text_base import PRINTABLE

FIELDS = (
    ConfigField("row", "dict", None, "the problem: column -> value (required unless rows is given)"),
    ConfigField("rows", "list", None, "several problems; reset(seed) plays rows[seed % len(rows)]"),
    ConfigField("input_key", "str", "prompt", "column holding the problem text every agent sees"),
    ConfigField("label_key", "str", "label", "column holding the reference answer"),
    ConfigField("agents", "list", None, "the team's agent names (default agent_1..agent_<num_agents>)"),
    ConfigField(
        "num_agents", "int", None, "team size when agents is not given (default 1)", minimum=1, maximum=64
    ),
    ConfigField("agent_inputs", "dict", None, "agent -> column that agent sees instead of input_key"),
    ConfigField(
        "max_turns", "int", 1, "steps in an episode (e.g. debate rounds + 1)", minimum=1, maximum=1000
    ),
    ConfigField("final_agent", "str", None, "whose last answer is the team's (default: the last that spoke)"),
    ConfigField(
        "final", "str", "agent", "team answer: final_agent's, or majority vote", choices=("agent", "majority")
    ),
    ConfigField("verifier", "str", "exact", "built-in verifier scoring answers", choices=tuple(VERIFIERS)),
    ConfigField("tolerance", "float", None, "numeric verifier: relative tolerance (1e-6)", minimum=0.0),
    ConfigField("abs_tolerance", "float", None, "numeric verifier: absolute tolerance (1e-9)", minimum=0.0),
    ConfigField("pattern", "str", None, "regex verifier: pattern extracting the answer (group 1 if any)"),
    ConfigField("ignore_case", "bool", None, "exact / regex verifiers: compare ignoring case"),
    ConfigField("letters", "str", None, "multiple_choice verifier: the choice letters (ABCDEFGHIJ)"),
    ConfigField("max_chars", "int", None, "math verifier: longest answer read (1000)", minimum=1),
    ConfigField(
        "math_timeout_s",
        "float",
        None,
        "math verifier: seconds math-verify may take per answer (5)",
        minimum=0.001,
    ),
    ConfigField(
        "regex_timeout_s",
        "float",
        None,
        "regex verifier: seconds a match may take per reply, then no match (1)",
        minimum=0.001,
    ),
    ConfigField(
        "own_weight",
        "float",
        OWN_WEIGHT,
        "weight of an agent's own correctness in its reward",
        minimum=0.0,
        maximum=1.0,
    ),
    ConfigField(
        "max_action_chars", "int", 16384, "length limit of every action", minimum=16, maximum=1_000_000
    ),
)

SCHEMA = ConfigSchema(FIELDS)


class DatasetTaskEnv(ParallelEnv):
    """A team answers one problem row (see the module docstring).

    Args:
        config: Validated config (:data:`SCHEMA`).
        seed: Row index (modulo ``len(rows)``) of the first ``reset`` without a seed; ``None`` is row 0.

    Raises:
        InvalidArgumentError: Missing ``row``/``rows``, a row without its input or label column (named with the
            row), a label the verifier cannot read (not a number for ``numeric``), bad agents or
            ``agent_inputs``, a ``final_agent`` not in the team or given with ``final: majority``, or a bad
            verifier option.
        FailedPreconditionError: ``verifier: math`` without math-verify installed.
    """

    metadata: dict[str, Any] = {"name": "dataset_task", "render_modes": ["ansi"], "is_parallelizable": True}
    missing_action = ""

    def __init__(self, config: dict[str, Any], seed: int | None = None) -> None:
        self.config = config
        self.possible_agents = dr.agent_names(config)
        self.columns = dr.agent_columns(config, self.possible_agents)
        final_agent = config["final_agent"]
        if final_agent is not None and config["final"] == "majority":
            raise InvalidArgumentError(
                "dataset_task final_agent is for final: agent; final: majority takes no final_agent"
            )
        if final_agent is not None and final_agent not in self.possible_agents:
            raise InvalidArgumentError(
                f"dataset_task final_agent {final_agent!r} is not in the team ({', '.join(self.possible_agents)})"
            )
        self.verifier = dr.team_verifier(config)
        self.rows = dr.problem_rows(config)
        self.texts = [self._row_texts(where, row) for where, row in self.rows]
        self.labels = [self._row_label(where, row) for where, row in self.rows]
        shown = {c for texts in self.texts for t in texts.values() for c in t}
        longest = max(len(t) for texts in self.texts for t in texts.values())
        self._obs_space = gymnasium.spaces.Text(longest, min_length=1, charset=frozenset(PRINTABLE) | shown)
        self._act_space = gymnasium.spaces.Text(config["max_action_chars"], min_length=0, charset=PRINTABLE)
        self.metadata = {
            **type(self).metadata,
            "metrics": ("task_completion", *(f"accuracy/{a}" for a in self.possible_agents)),
        }
        self._next = 0 if seed is None else seed % len(self.rows)
        self.agents: list[str] = []
        self.acting_agents: list[str] = []

    def _row_texts(self, where: str, row: dict[str, Any]) -> dict[str, str]:
        return {a: dr.input_text(where, row, column) for a, column in self.columns.items()}

    def _row_label(self, where: str, row: dict[str, Any]) -> str:
        label = dr.label_text(where, row, self.config["label_key"])
        try:
            self.verifier(label, label)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"dataset_task {where}: {e.message}") from None
        return label

    def observation_space(self, agent: str) -> gymnasium.spaces.Text:
        """The agent's observation space: text up to the longest problem text, whose charset holds printable
        ASCII and every character of the rows' texts (so every observation lies in it)."""
        return self._obs_space

    def action_space(self, agent: str) -> gymnasium.spaces.Text:
        """The agent's action space: any Unicode text up to ``max_action_chars`` is accepted (its charset,
        printable ASCII, is what ``sample()`` draws from)."""
        return self._act_space

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Start an episode on ``rows[seed % len(rows)]`` (the next row without a seed).

        Args:
            seed: Picks the row; ``None`` takes the next one.
            options: Unused (accepted for the PettingZoo API).

        Returns:
            ``(observations, infos)``: each agent's column text, and infos with ``is_acting`` true.
        """
        index = self._next if seed is None else seed % len(self.rows)
        self._next = (index + 1) % len(self.rows)
        self.where, self.index, self.label = self.rows[index][0], index, self.labels[index]
        self.agents = list(self.possible_agents)
        self.acting_agents = list(self.possible_agents)
        self.turn = 0
        self.last_text: dict[str, str] = {}
        self.last_speaker: str | None = None
        self.result: dict[str, Any] | None = None
        return self._observations(), self._infos()

    def step(self, actions: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        """Record the speakers' answers; after ``max_turns`` steps score them and end the episode.

        Args:
            actions: Agent -> text; ``""`` (or leaving an agent out) means it did not speak.

        Returns:
            PettingZoo ``(observations, rewards, terminations, truncations, infos)``; rewards are 0 until the
            last step.
        """
        live = list(self.agents)
        for agent in self.possible_agents:
            text = actions.get(agent, "")
            if agent in live and text:
                self.last_text[agent] = text
                self.last_speaker = agent
        self.turn += 1
        done = self.turn >= self.config["max_turns"]
        rewards = dict.fromkeys(live, 0.0)
        if done:
            self.result = self._score()
            rewards = {a: self.result["rewards"][a] for a in live}
            self.acting_agents = []
        obs, infos = self._observations(), self._infos()
        if done:
            self.agents = []
        return obs, rewards, dict.fromkeys(live, done), dict.fromkeys(live, False), infos

    def _answer(self, text: str) -> str | None:
        return answer_of(
            text, self.config["verifier"], self.config["pattern"], self.config["regex_timeout_s"]
        )

    def _score(self) -> dict[str, Any]:
        """Score the team's reply and each agent's own (:mod:`marti.rewards.team`, shared with the trainer)."""
        team_text = team_reply(
            self.last_text,
            self.possible_agents,
            final=self.config["final"],
            final_agent=self.config["final_agent"],
            last_speaker=self.last_speaker,
            verifier=self.config["verifier"],
            pattern=self.config["pattern"],
            regex_timeout_s=self.config["regex_timeout_s"],
        )
        team = bool(team_text is not None and self.verifier(team_text, self.label) >= 1.0)
        own = {a: self.verifier(t, self.label) >= 1.0 for a, t in self.last_text.items()}
        rewards = credit(float(team), own, self.possible_agents, self.config["own_weight"])
        team_answer = "" if team_text is None else (self._answer(team_text) or "")
        return {"team": team, "own": own, "rewards": rewards, "team_answer": team_answer}

    def _observations(self) -> dict[str, str]:
        return dict(self.texts[self.index])

    def _infos(self) -> dict[str, dict[str, Any]]:
        r = self.result
        common: dict[str, Any] = {
            "acting_agent": ",".join(self.acting_agents),
            "turn": self.turn,
            "row": self.where,
            "team_answer": r["team_answer"] if r else "",
            "team_correct": bool(r and r["team"]),
            "task_completion": float(bool(r and r["team"])),
        }
        for a in self.possible_agents:
            common[f"accuracy/{a}"] = float(bool(r and r["own"].get(a)))
        return {
            a: {
                **common,
                "is_acting": a in self.acting_agents,
                "spoke": a in self.last_text,
                "answer": self._answer(self.last_text.get(a, "")) or "",
                "correct": bool(r and r["own"].get(a)),
            }
            for a in self.possible_agents
        }

    def render(self) -> str:
        """Return the agents' last answers as text (``ansi`` mode)."""
        return "\n".join(f"[{a}]: {t}" for a, t in self.last_text.items())

    def close(self) -> None:
        """Release nothing (pure Python env); present for the PettingZoo API."""


def make_dataset_task(config: dict[str, Any], seed: int | None) -> DatasetTaskEnv:
    """Factory of ``dataset_task-v1`` (see :class:`DatasetTaskEnv`)."""
    return DatasetTaskEnv(config, seed)


def register(registry: Registry) -> None:
    """Register ``dataset_task-v1`` into ``registry`` (the ``marti.envs`` entry point of that name)."""
    registry.register(
        EnvSpec(
            "dataset_task",
            1,
            make_dataset_task,
            SCHEMA,
            "A team answers one problem row of the user's dataset (given in the config as row, or rows), "
            "scored at the end by a built-in verifier (exact, numeric, multiple_choice, math, regex): the "
            "team's answer (final_agent's, or a majority vote) and each agent's own. Observations are the "
            "row's text, full Unicode.",
            example_config={"row": {"prompt": "What is 2 + 3?", "label": "5"}},
        )
    )
