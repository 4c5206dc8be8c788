"""Adapters: PettingZoo AEC turn-by-turn conversion, the discrete text wrapper, Gymnasium, entry-point rules."""

from __future__ import annotations

import numpy as np
import pytest

import marti.env.make as me
from marti.errors import InvalidArgumentError, NotFoundError
from services.env_server.envs.adapters import parse_discrete_action

TTT = "pettingzoo.classic.tictactoe_v3:env"


def test_tictactoe_turns_and_win_reward() -> None:
    env = me.make("pettingzoo", entry_point=TTT)
    obs, _ = env.reset(seed=0)
    assert env.acting_agents == ["player_1"] and obs["player_1"]["action_mask"].sum() == 9
    # player_1 takes 0, 1, 2 (a line: squares 0,1,2 form a column in tictactoe_v3); player_2 takes 3, 4
    for agent, square in [("player_1", 0), ("player_2", 3), ("player_1", 1), ("player_2", 4)]:
        _, rew, term, _, _ = env.step({agent: square})
        assert rew == {"player_1": 0.0, "player_2": 0.0} and not any(term.values())
    _, rew, term, _, _ = env.step({"player_1": 2})
    assert rew == {"player_1": 1.0, "player_2": -1.0} and all(term.values()) and env.agents == []


def test_text_wrapper_lists_legal_actions_and_penalises_illegal_ones() -> None:
    env = me.make("pettingzoo", entry_point=TTT, text=True, illegal_action_penalty=0.2)
    obs, infos = env.reset(seed=0)
    assert "Legal actions: 0, 1, 2, 3, 4, 5, 6, 7, 8" in obs["player_1"]
    assert infos["player_1"]["legal_actions"] == list(range(9)) and infos["player_2"]["is_acting"] is False
    env.step({"player_1": "I play 4"})
    obs, rew, _, _, infos = env.step({"player_2": "4"})  # taken square: illegal, no progress
    assert rew == {"player_1": 0.0, "player_2": -0.2}
    assert "not legal" in obs["player_2"] and infos["player_2"]["illegal_action"]
    assert env.acting_agents == ["player_2"] and 4 not in infos["player_2"]["legal_actions"]
    assert "X" in obs["player_1"] and "O" in obs["player_2"]  # the board shows the move
    _, rew, *_ = env.step({"player_2": "nonsense"})
    assert rew["player_2"] == -0.2
    env.step({"player_2": "0"})
    assert env.acting_agents == ["player_1"]


def test_rps_text_names_and_connect_four_columns() -> None:
    env = me.make("pettingzoo", entry_point="pettingzoo.classic.rps_v2:parallel_env", text=True, max_turns=3)
    obs, infos = env.reset(seed=0)
    assert infos["player_0"]["legal_action_names"] == ["rock", "paper", "scissors"]
    _, rew, *_ = env.step({"player_0": "paper!", "player_1": "rock"})
    assert rew == {"player_0": 1.0, "player_1": -1.0}
    c4 = me.make("pettingzoo", entry_point="pettingzoo.classic.connect_four_v3:env", text=True)
    obs, _ = c4.reset(seed=0)
    assert "column numbers" in obs["player_0"] and "Legal actions: 0, 1, 2, 3, 4, 5, 6" in obs["player_0"]


def test_gymnasium_adapter() -> None:
    env = me.make("gymnasium", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_turns=5)
    obs, _ = env.reset(seed=1)
    assert env.possible_agents == ["agent_0"] and obs["agent_0"].shape == (4,)
    for _ in range(5):
        _, rew, term, trunc, _ = env.step({"agent_0": 0})
        if term["agent_0"]:
            break
    assert rew["agent_0"] == 1.0 and (term["agent_0"] or trunc["agent_0"]) and env.agents == []
    with pytest.raises(InvalidArgumentError, match="not in its action space"):
        env.reset()
        env.step({"agent_0": 7})


def test_entry_point_rules() -> None:
    with pytest.raises(InvalidArgumentError, match="'os' is not allowed"):
        me.make("pettingzoo", entry_point="os:system")
    with pytest.raises(InvalidArgumentError, match="module:factory"):
        me.make("pettingzoo", entry_point="pettingzoo.classic.tictactoe_v3")
    with pytest.raises(NotFoundError, match="no attribute 'nope'"):
        me.make("pettingzoo", entry_point="pettingzoo.classic.tictactoe_v3:nope")
    with pytest.raises(NotFoundError, match="cannot import"):
        me.make("pettingzoo", entry_point="pettingzoo.nothing_here:env")
    with pytest.raises(InvalidArgumentError, match="Discrete"):
        me.make("gymnasium", entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv", text=True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2", 2), ("3", None), ("I pick 2 then", 2), ("paper", 1), ("9", None), ("", None), ("-1", None)],
)
def test_parse_discrete_action(text: str, expected: int | None) -> None:
    assert parse_discrete_action(text, 3, ["rock", "paper", "scissors"]) == expected


def test_board_planes_render_with_int8() -> None:
    env = me.make("pettingzoo", entry_point=TTT)
    obs, _ = env.reset(seed=0)
    assert obs["player_1"]["observation"].dtype == np.int8


def test_make_seed_fixes_the_first_episode_of_adapted_envs() -> None:
    def first_obs(seed):
        env = me.make(
            "gymnasium", entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", seed=seed
        )
        return env.reset()[0]["agent_0"]

    assert np.array_equal(first_obs(5), first_obs(5))
    assert not np.array_equal(first_obs(5), first_obs(6))


def test_a_type_error_from_inside_the_env_naming_no_kwargs_key_is_not_made_a_user_error(monkeypatch) -> None:
    from services.env_server.envs import adapters

    def factory(size: int = 3) -> None:
        return None + size  # the env's own bug: a TypeError that names no kwargs key

    monkeypatch.setattr(adapters, "load_entry_point", lambda path: factory)
    with pytest.raises(TypeError, match="unsupported operand") as info:
        adapters.build_from_entry_point("gymnasium", {"entry_point": "gymnasium.x:f", "kwargs": {"size": 2}})
    assert not isinstance(info.value, InvalidArgumentError)


def test_an_allowed_prefix_package_itself_is_refused_saying_so() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        me.make("gymnasium", entry_point="gymnasium:make")
    assert str(info.value) == (
        "entry_point module 'gymnasium' is not allowed: its name must start with one of 'pettingzoo.', "
        "'gymnasium.' ('gymnasium' itself does not; name a module inside it, 'gymnasium.<module>')"
    )
