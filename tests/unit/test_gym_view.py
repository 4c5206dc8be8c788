"""marti.env.gym_view: one agent of a multi-agent env as a Gymnasium env, the others fixed partner policies."""

from __future__ import annotations

import gymnasium
import pytest
from pettingzoo import ParallelEnv
from pettingzoo.classic import rps_v2

import marti
from marti.env.gym_view import SingleAgentView, make
from marti.errors import FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError

PLAN = "task_1: 1\ntask_2: 1\ntask_3: 0"


def _leader(obs, info):
    return PLAN


def _evaluator(obs, info):
    return "score: 1.0 accept"


def test_resource_allocation_executor_view_matches_hand_driven_env():
    view = make(
        "collaborative_task_solving",
        "agent_2",
        {"agent_1": _leader, "agent_3": _evaluator},
        seed=4,
        scenario="resource_allocation",
    )
    assert isinstance(view, gymnasium.Env) and view.observation_space.contains("x")
    obs, info = view.reset(seed=4)
    assert info["partner_steps"] == 1 and info["is_acting"] and "It is your turn" in obs
    obs, reward, terminated, truncated, info = view.step(PLAN)
    assert info["partner_steps"] == 1  # the evaluator played after the executor
    # the same episode driven by hand on a second env: the executor's reward summed over both env steps
    raw = marti.make("collaborative_task_solving", seed=4, scenario="resource_allocation")
    raw.reset(seed=4)
    _, r1, *_ = raw.step({"agent_1": PLAN, "agent_2": "", "agent_3": ""})
    _, r2, *_ = raw.step({"agent_1": "", "agent_2": PLAN, "agent_3": ""})
    _, r3, t3, tr3, i3 = raw.step({"agent_1": "", "agent_2": "", "agent_3": "score: 1.0 accept"})
    assert reward == pytest.approx(r2["agent_2"] + r3["agent_2"])
    assert (terminated, truncated) == (t3["agent_2"], tr3["agent_2"])
    assert info["team_score"] == i3["agent_2"]["team_score"]
    with pytest.raises(FailedPreconditionError, match="reset"):
        view.step(PLAN)


def test_turn_based_pettingzoo_game_learner_second():
    def first_legal(obs, info):
        return str(info["legal_actions"][0])

    view = make(
        "pettingzoo", "player_2", first_legal, entry_point="pettingzoo.classic.tictactoe_v3:env", text=True
    )
    obs, info = view.reset(seed=0)
    assert info["partner_steps"] == 1 and info["is_acting"]
    total, done, steps = 0.0, False, 0
    while not done:
        obs, reward, term, trunc, info = view.step(str(info["legal_actions"][-1]))
        total += reward
        done = term or trunc
        steps += 1
    assert steps <= 5 and total in (-1.0, 0.0, 1.0)


def test_simultaneous_env_without_acting_agents():
    env = rps_v2.parallel_env(num_actions=3, max_cycles=4)  # a plain PettingZoo env, no marti wrapper
    view = SingleAgentView(env, "player_0", {"player_1": lambda obs, info: 2})  # partner: always scissors
    view.reset(seed=0)
    rewards = []
    for _ in range(4):
        _, r, term, trunc, info = view.step(0)  # rock beats scissors
        rewards.append(r)
        assert info["partner_steps"] == 0
    assert rewards == [1.0, 1.0, 1.0, 1.0] and trunc


class _Waiting(ParallelEnv):
    """``b`` acts ``wait`` times, then ``a`` acts once and the episode ends."""

    metadata = {"name": "waiting"}
    missing_action = None

    def __init__(self, wait: int) -> None:
        self.possible_agents = ["a", "b"]
        self.wait = wait
        self.agents: list[str] = []

    def observation_space(self, agent):
        return gymnasium.spaces.Discrete(1000)

    def action_space(self, agent):
        return gymnasium.spaces.Discrete(2)

    @property
    def acting_agents(self):
        return ["b"] if self.t < self.wait else ["a"]

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, ["a", "b"]
        return {"a": 0, "b": 0}, {"a": {}, "b": {}}

    def step(self, actions):
        assert ("a" in actions) == (self.acting_agents == ["a"])  # only the acting agent is asked
        self.t += 1
        done = self.t > self.wait
        if done:
            self.agents = []
        flags = {"a": done, "b": done}
        return (
            {"a": self.t, "b": self.t},
            {"a": 0.5, "b": 0.0},
            flags,
            {"a": False, "b": False},
            {"a": {}, "b": {}},
        )


def test_max_partner_steps_edge():
    obs, info = SingleAgentView(_Waiting(3), "a", {"b": lambda o, i: 1}, max_partner_steps=3).reset()
    assert obs == 3 and info["partner_steps"] == 3
    with pytest.raises(ResourceExhaustedError, match="max_partner_steps=2"):
        SingleAgentView(_Waiting(3), "a", {"b": lambda o, i: 1}, max_partner_steps=2).reset()
    view = SingleAgentView(_Waiting(0), "a", {"b": lambda o, i: 1})
    view.reset()
    assert view.step(1) == (1, 0.5, True, False, {"partner_steps": 0})


def test_bad_arguments_name_the_value():
    env = _Waiting(1)
    with pytest.raises(InvalidArgumentError, match="'c'"):
        SingleAgentView(env, "c", {"b": lambda o, i: 1})
    with pytest.raises(InvalidArgumentError, match=r"\['b'\]"):
        SingleAgentView(env, "a", {})
    with pytest.raises(InvalidArgumentError, match=r"\['z'\]"):
        SingleAgentView(env, "a", {"b": lambda o, i: 1, "z": lambda o, i: 1})
    with pytest.raises(InvalidArgumentError, match="max_partner_steps must be >= 1, got 0"):
        SingleAgentView(env, "a", {"b": lambda o, i: 1}, max_partner_steps=0)
