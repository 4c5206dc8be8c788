"""Shared pieces of the built-in turn-based text environments (PettingZoo ``ParallelEnv`` semantics).

Observations and actions are text: the observation space of every agent is a printable-ASCII
``gymnasium.spaces.Text`` and the action space a ``Text`` that also admits the empty string (agents that are not
acting this turn send ``""``). Anything an agent writes is sanitised to printable ASCII before other agents see it,
so every observation stays inside its space.
"""

from __future__ import annotations

import re
import string
from typing import Any

import gymnasium
from pettingzoo import ParallelEnv

from marti.env.config import ConfigField

#: Characters allowed in observations and actions: Python's ``string.printable`` (ASCII letters, digits,
#: punctuation and whitespace).
PRINTABLE = string.printable
_NON_PRINTABLE = re.compile("[^" + re.escape(PRINTABLE) + "]")


def text_space(max_length: int, min_length: int = 0) -> gymnasium.spaces.Text:
    """Return a printable-ASCII ``Text`` space.

    Args:
        max_length: Longest allowed text, in characters.
        min_length: Shortest allowed text, in characters.

    Returns:
        ``gymnasium.spaces.Text(max_length, min_length=min_length, charset=string.printable)``.
    """
    return gymnasium.spaces.Text(max_length, min_length=min_length, charset=PRINTABLE)


def sanitize(text: str, max_chars: int) -> str:
    """Make agent text safe to show other agents.

    Args:
        text: Any text.
        max_chars: Longest result, in characters; longer text is cut and ends with ``" [...]"``.

    Returns:
        The text with every non-printable-ASCII character replaced by ``?``, trimmed, and cut to ``max_chars``.
    """
    clean = _NON_PRINTABLE.sub("?", text).strip()
    if len(clean) > max_chars:
        clean = clean[: max(max_chars - 6, 0)] + " [...]"
    return clean


#: Config keys every built-in text environment accepts (the design YAML's ``environment`` block, plus limits).
COMMON_FIELDS = (
    ConfigField(
        "scenario",
        "str",
        "resource_allocation",
        "which scenario to play",
        choices=("resource_allocation", "private_allocation", "debate"),
    ),
    ConfigField(
        "max_turns",
        "int",
        12,
        "most turns (one agent acting = one turn) before truncation",
        minimum=1,
        maximum=10_000,
    ),
    ConfigField(
        "reward_type",
        "str",
        "dense",
        "dense: per-turn rewards; sparse: all reward at episode end",
        choices=("dense", "sparse"),
    ),
    ConfigField(
        "observation_format",
        "str",
        "natural_language",
        "observation text format",
        choices=("natural_language", "json"),
    ),
    ConfigField(
        "difficulty",
        "str",
        "easy",
        "problem size (pick, pair: collaborative_task_solving's private_allocation only)",
        choices=("pick", "pair", "easy", "medium", "hard"),
    ),
    ConfigField(
        "num_agents", "int", None, "number of agents (default depends on the scenario)", minimum=1, maximum=16
    ),
    ConfigField(
        "roles", "list", None, "role of each agent, in agent order (default depends on the scenario)"
    ),
    ConfigField(
        "max_observation_chars",
        "int",
        8192,
        "length limit of every observation text",
        minimum=512,
        maximum=1_000_000,
    ),
    ConfigField(
        "max_action_chars",
        "int",
        4096,
        "length limit of every action text (longer is an error)",
        minimum=16,
        maximum=1_000_000,
    ),
    ConfigField(
        "max_quote_chars",
        "int",
        600,
        "longest quote of another agent's message in an observation",
        minimum=16,
        maximum=100_000,
    ),
    ConfigField(
        "history_messages",
        "int",
        6,
        "how many past messages each observation quotes",
        minimum=0,
        maximum=1000,
    ),
)


class TextTeamEnv(ParallelEnv):
    """Base class: fixed agents, text spaces, a turn pointer and a shared transcript.

    Subclasses set ``possible_agents`` and ``roles`` and implement ``reset`` and ``step``.

    Attributes:
        missing_action: Action assumed for agents absent from a ``step`` call (the empty string).
        acting_agents: Agents whose action this turn is read; the others' actions are ignored.
    """

    metadata: dict[str, Any] = {"name": "text_team", "render_modes": ["ansi"], "is_parallelizable": True}
    missing_action = ""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.possible_agents: list[str] = []
        self.agents: list[str] = []
        self.acting_agents: list[str] = []
        self._obs_space = text_space(config["max_observation_chars"], min_length=1)
        self._act_space = text_space(config["max_action_chars"], min_length=0)
        self.transcript: list[tuple[str, str, str]] = []  # (speaker, role, text)
        self._quote_cache: dict[tuple[str, str, str], str] = {}

    def observation_space(self, agent: str) -> gymnasium.spaces.Text:
        """Return the agent's observation space (the same object on every call)."""
        return self._obs_space

    def action_space(self, agent: str) -> gymnasium.spaces.Text:
        """Return the agent's action space (the same object on every call)."""
        return self._act_space

    def _history_lines(self, transcript: list[tuple[str, str, str]] | None = None) -> list[str]:
        entries = self.transcript if transcript is None else transcript
        n = self.config["history_messages"]
        shown = entries[-n:] if n else []
        skipped = len(entries) - len(shown)
        lines = [f"({skipped} earlier messages not shown)"] if skipped else []
        q = self.config["max_quote_chars"]
        cache = self._quote_cache
        for speaker, role, text in shown:
            key = (speaker, role, text)
            if key not in cache:
                if len(cache) > 4096:
                    cache.clear()
                cache[key] = f"[{speaker} ({role})]: {sanitize(text, q) or '(empty)'}"
            lines.append(cache[key])
        return lines

    def _fit(self, text: str) -> str:
        limit = self.config["max_observation_chars"]
        text = sanitize(text, limit) if len(text) > limit else text
        return text or "(no observation)"

    def render(self) -> str:
        """Return the transcript as text (``ansi`` mode)."""
        return "\n".join(f"[{s} ({r})]: {t}" for s, r, t in self.transcript)

    def close(self) -> None:
        """Release nothing (pure Python env); present for the PettingZoo API."""
