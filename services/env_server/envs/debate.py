"""The ``collaborative_task_solving`` environment, scenario ``debate`` (multi-agent debate).

Several solvers answer a generated problem with a verifiable integer answer (arithmetic or a word problem from a
seeded generator). In round 1 every solver answers at once; in rounds 2..``debate_rounds`` each solver sees the
others' previous answers and answers again; then the aggregator reads everything and gives the team's answer.
One round (all solvers acting together) or the aggregator's answer is one turn, so an episode takes
``debate_rounds + 1`` turns (truncated earlier if ``max_turns`` is smaller).

Answers are read as ``answer: <integer>`` or, failing that, the last integer in the text.

Rewards (``w`` = ``team_weight``): correctness is 1 for the right answer, 0 otherwise.
``dense``: a solver gets ``(1 - w) * correct / debate_rounds`` each round; the aggregator's answer gives every
agent ``w * team_correct`` and the aggregator also ``(1 - w) * team_correct``. ``sparse``: all of it at the end,
``(1 - w) * own last correctness + w * team_correct``.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from marti.env.config import ConfigField
from marti.errors import InvalidArgumentError
from services.env_server.envs.text_base import TextTeamEnv, sanitize

FIELDS = (
    ConfigField(
        "debate_rounds", "int", 2, "solver rounds before the aggregator answers", minimum=1, maximum=20
    ),
    ConfigField(
        "team_weight",
        "float",
        0.5,
        "weight of team correctness in each agent's reward",
        minimum=0.0,
        maximum=1.0,
    ),
)

ANSWER_FORMAT = "brief reasoning, then a last line 'answer: <integer>'"

_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana")
_ITEMS = ("apples", "books", "coins", "marbles", "pencils", "stickers")


def generate_problem(rng: random.Random, difficulty: str) -> tuple[str, int]:
    """Draw a problem with an integer answer.

    Args:
        rng: Source of randomness.
        difficulty: ``easy`` (two-number sums and differences), ``medium`` (three numbers with a product) or
            ``hard`` (multi-step word problems); half of the problems at each level are word problems.

    Returns:
        ``(question text, answer)``.
    """
    word = rng.random() < 0.5
    if difficulty == "easy":
        a, b = rng.randint(2, 50), rng.randint(2, 50)
        if word:
            name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
            return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?", a + b
        op = rng.choice("+-")
        return f"What is {a} {op} {b}?", a + b if op == "+" else a - b
    if difficulty == "medium" or not word:
        a, b, c = rng.randint(2, 20), rng.randint(2, 12), rng.randint(1, 40)
        if word:
            name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
            return (
                f"{name} buys {a} boxes of {item} with {b} {item} in each box, then gives away {c}. "
                f"How many {item} are left?"
            ), a * b - c
        op = rng.choice("+-")
        return f"What is {a} * {b} {op} {c}?", a * b + c if op == "+" else a * b - c
    n1, n2 = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    a, b, c, d = rng.randint(3, 30), rng.randint(2, 6), rng.randint(1, 20), rng.randint(2, 5)
    text = (
        f"{n1} has {a} {item}. {n2} has {b} times as many as {n1}, then loses {c}. "
        f"They put all their {item} together and split them into groups of {d}, keeping the remainder aside. "
        f"How many full groups are there?"
    )
    return text, (a + a * b - c) // d


_ANSWER_RE = re.compile(r"answer\s*(?:is|=|:)?\s*(-?\d+)", re.IGNORECASE)
_INT_RE = re.compile(r"-?\d+")


def parse_answer(text: str) -> int | None:
    """Read an integer answer: the last ``answer: N`` if any, else the last integer, else ``None``."""
    found = _ANSWER_RE.findall(text)
    if found:
        return int(found[-1])
    ints = _INT_RE.findall(text)
    return int(ints[-1]) if ints else None


class DebateEnv(TextTeamEnv):
    """Solvers debate for a few rounds, then an aggregator answers (see module docstring).

    Args:
        config: Validated config (common text-env keys plus :data:`FIELDS`).
        seed: Seed of the first ``reset`` without a seed.

    Raises:
        InvalidArgumentError: Roles other than ``solver``/``aggregator``, not exactly one aggregator, or fewer
            than 2 agents.
    """

    metadata = {
        "name": "collaborative_task_solving/debate",
        "render_modes": ["ansi"],
        "is_parallelizable": True,
    }

    def __init__(self, config: dict[str, Any], seed: int | None = None) -> None:
        super().__init__(config)
        roles = config["roles"]
        n = config["num_agents"] or (len(roles) if roles else 3)
        if roles is None:
            roles = ["solver"] * (n - 1) + ["aggregator"]
        if len(roles) != n or n < 2:
            raise InvalidArgumentError(f"debate needs num_agents >= 2 matching roles; got {n} and {roles!r}")
        if any(r not in ("solver", "aggregator") for r in roles) or roles.count("aggregator") != 1:
            raise InvalidArgumentError(f"debate roles {roles!r} must be solvers and exactly one aggregator")
        self.possible_agents = [f"agent_{i + 1}" for i in range(n)]
        self.role_of = dict(zip(self.possible_agents, roles, strict=True))
        self.solvers = [a for a in self.possible_agents if self.role_of[a] == "solver"]
        self.aggregator = next(a for a in self.possible_agents if self.role_of[a] == "aggregator")
        self._seed = seed
        self._rng: random.Random | None = None

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """Draw a new problem; returns ``(observations, infos)`` for every agent.

        Args:
            seed: Reseeds the generator; ``None`` continues the current stream.
            options: Ignored.
        """
        if seed is not None or self._rng is None:
            self._rng = random.Random(self._seed if seed is None else seed)
        self.question, self.answer = generate_problem(self._rng, self.config["difficulty"])
        self.agents = list(self.possible_agents)
        self.turn = 0
        self.round = 0
        self.transcript = []
        self.answers: dict[str, int | None] = dict.fromkeys(self.possible_agents)
        self.team_correct = False
        self.acting_agents = list(self.solvers)
        return self._observations(), self._infos()

    def step(self, actions: dict[str, str]) -> tuple[dict, dict, dict, dict, dict]:
        """Play one turn (a solver round or the aggregator's answer).

        Args:
            actions: Agent -> text; only acting agents' entries are read.

        Returns:
            PettingZoo ``(observations, rewards, terminations, truncations, infos)``.
        """
        live = list(self.agents)
        rewards = dict.fromkeys(live, 0.0)
        w, rounds = self.config["team_weight"], self.config["debate_rounds"]
        dense = self.config["reward_type"] == "dense"
        for a in self.acting_agents:
            text = actions.get(a, self.missing_action)
            self.transcript.append((a, f"{self.role_of[a]}, round {self.round + 1}", text))
            self.answers[a] = parse_answer(text)
        self.turn += 1
        done = self.acting_agents == [self.aggregator]
        if done:
            self.team_correct = self.answers[self.aggregator] == self.answer
        else:
            self.round += 1
            if dense:
                for a in self.solvers:
                    rewards[a] += (1 - w) * float(self.answers[a] == self.answer) / rounds
        truncated = not done and self.turn >= self.config["max_turns"]
        if done:
            for a in live:
                own = self.team_correct if a == self.aggregator else self.answers[a] == self.answer
                rewards[a] += w * float(self.team_correct)
                if a == self.aggregator or not dense:
                    rewards[a] += (1 - w) * float(own)
        elif truncated and not dense:
            for a in self.solvers:
                rewards[a] += (1 - w) * float(self.answers[a] == self.answer)
        if done or truncated:
            self.acting_agents = []
        elif self.round >= rounds:
            self.acting_agents = [self.aggregator]
        obs, infos = self._observations(), self._infos()
        if done or truncated:
            self.agents = []
        return obs, rewards, dict.fromkeys(live, done), dict.fromkeys(live, truncated), infos

    def _observations(self) -> dict[str, str]:
        out = {}
        for a in self.possible_agents:
            role = self.role_of[a]
            mine = a in self.acting_agents
            if role == "solver":
                task = (
                    "Solve the problem."
                    if self.round == 0
                    else "Consider the other answers and answer again."
                )
            else:
                task = "Read the solvers' answers and give the team's final answer."
            if self.config["observation_format"] == "json":
                q = self.config["max_quote_chars"]
                doc = {
                    "agent": a,
                    "role": role,
                    "question": self.question,
                    "instructions": task,
                    "reply_format": ANSWER_FORMAT,
                    "round": self.round + 1,
                    "history": [
                        {"agent": s, "role": r, "text": sanitize(t, q)} for s, r, t in self.transcript
                    ],
                    "your_turn": mine,
                }
                out[a] = self._fit(json.dumps(doc, ensure_ascii=True))
                continue
            lines = [
                f"You are {a}, the {role.upper()} in a debate of {len(self.possible_agents)} agents.",
                f"Problem: {self.question}",
            ]
            history = self._history_lines()
            if history:
                lines += ["Answers so far:", *history]
            if mine:
                lines.append(f"{task} Reply with {ANSWER_FORMAT}.")
            elif self.acting_agents:
                lines.append(
                    f"Not your turn ({', '.join(self.acting_agents)} act now); reply with an empty message."
                )
            else:
                lines.append("The debate is over.")
            out[a] = self._fit("\n".join(lines))
        return out

    def _infos(self) -> dict[str, dict[str, Any]]:
        out = {}
        for a in self.possible_agents:
            ans = self.answers[a]
            out[a] = {
                "role": self.role_of[a],
                "is_acting": a in self.acting_agents,
                "acting_agent": ",".join(self.acting_agents),
                "turn": self.turn,
                "round": self.round,
                "answer": "" if ans is None else str(ans),
                "correct": ans == self.answer,
                "team_correct": bool(self.team_correct),
                "action_format": ANSWER_FORMAT,
            }
        return out
