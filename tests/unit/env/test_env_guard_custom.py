"""Whose turn it is, and what a left-out action becomes, for an env of the user's own (docs/environments.md):
the env's ``acting_agents`` and ``missing_action`` say so; without them every live agent is acting (whatever its
infos say) and a left-out action is refused, text env or not."""

from __future__ import annotations

import string

import gymnasium
import pytest
from pettingzoo import ParallelEnv

from marti.env.guard import GuardedParallelEnv
from marti.errors import InvalidArgumentError


class TurnEnv(ParallelEnv):
    """Two text agents taking turns; ``infos[agent]["is_acting"]`` says whose turn it is."""

    metadata = {"name": "turns"}

    def __init__(self) -> None:
        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []
        self.turn = 0
        self.seen: list[dict] = []

    def observation_space(self, agent: str) -> gymnasium.Space:
        return gymnasium.spaces.Text(64, min_length=0, charset=string.printable)

    def action_space(self, agent: str) -> gymnasium.Space:
        return gymnasium.spaces.Text(64, min_length=0, charset=string.printable)

    def _infos(self) -> dict:
        return {a: {"is_acting": a == self.possible_agents[self.turn % 2]} for a in self.agents}

    def reset(self, seed=None, options=None):
        self.agents, self.turn = list(self.possible_agents), 0
        return {a: "go" for a in self.agents}, self._infos()

    def step(self, actions):
        self.seen.append(dict(actions))
        self.turn += 1
        live = self.agents
        return ({a: "go" for a in live}, {a: 0.0 for a in live}, {a: False for a in live},
                {a: False for a in live}, self._infos())  # fmt: skip


class DeclaredTurnEnv(TurnEnv):
    """The same game, saying whose turn it is and what a left-out action is."""

    missing_action = ""

    @property
    def acting_agents(self) -> list[str]:
        return [self.possible_agents[self.turn % 2]]


def test_without_acting_agents_every_live_agent_acts_and_a_left_out_action_is_refused():
    env = GuardedParallelEnv(TurnEnv())
    _, infos = env.reset(seed=0)
    assert infos["b"]["is_acting"] is False and env.acting_agents == ["a", "b"]
    with pytest.raises(InvalidArgumentError, match="missing action for agent.*b"):
        env.step({"a": "hi"})


def test_an_env_that_declares_them_gets_its_acting_agents_and_missing_action():
    inner = DeclaredTurnEnv()
    env = GuardedParallelEnv(inner)
    env.reset(seed=0)
    assert env.acting_agents == ["a"]
    env.step({"a": "hi"})
    assert inner.seen == [{"a": "hi"}]
    env.step({"a": "ignored"})  # b's turn: b left out gets missing_action, a's text is passed through
    assert inner.seen[-1] == {"a": "ignored", "b": ""}
