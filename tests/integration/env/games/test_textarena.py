"""TextArena games hosted by env_server (``textarena-v1``), played remotely by text agents.

The agents are text-in, text-out policies, as an LLM wrapper would be: they read the observation string and
answer with a sentence holding a bracketed move. PettingZoo classic games are covered by the env server's own
contract tests (tests/contract/test_pettingzoo_contract.py)."""

from __future__ import annotations

import random
import re

import pytest
from pettingzoo.test import parallel_api_test

import marti
from marti.errors import InvalidArgumentError, NotFoundError

pytest.importorskip("textarena", reason="textarena is not installed (pip install textarena)")

_MOVES = re.compile(r"'(\[[^\]]+\])'")


def text_agent(observation: str, rng: random.Random) -> str:
    """A scripted stand-in for an LLM: picks one of the moves the observation lists, answers in prose."""
    available = [ln for ln in observation.splitlines() if "Available Moves" in ln or "Valid actions" in ln]
    moves = _MOVES.findall(available[-1]) if available else []
    if not moves:
        moves = sorted(set(re.findall(r"\[[a-z]+\]|\[\d+\]", observation))) or ["[0]"]
    return f"Let me think. I will play {rng.choice(moves)}."


def play(env, seed: int, policy_seed: int, max_steps: int = 200):
    """Play one episode; returns (actions, per-step rewards, last infos, all observations of the actor)."""
    rng = random.Random(policy_seed)
    obs, infos = env.reset(seed=seed)
    actions, rewards, seen = [], [], []
    for _ in range(max_steps):
        if not env.agents:
            break
        actor = next(a for a in env.agents if infos[a]["is_acting"])
        seen.append(obs[actor])
        act = text_agent(obs[actor], rng)
        actions.append((actor, act))
        obs, rew, term, trunc, infos = env.step({actor: act})
        rewards.append(rew)
    return actions, rewards, infos, seen, term, trunc


def test_tictactoe_remote_to_the_end_and_same_as_local(env_server):
    address, _ = env_server
    assert "textarena-v1" in [d["env_id"] for d in marti.list_envs(address)]
    remote = marti.make("textarena", game="TicTacToe-v0", address=address, transport="unary")
    try:
        assert remote.possible_agents == ["player_0", "player_1"]
        actions, rewards, infos, seen, term, trunc = play(remote, seed=5, policy_seed=1)
    finally:
        remote.close()
    assert "Tic Tac Toe" in seen[0] and "Available Moves" in seen[0]
    assert all(term.values()) and not any(trunc.values())
    final = rewards[-1]
    assert sorted(final.values()) in ([-1.0, 1.0], [0.0, 0.0])
    assert all(v == 0.0 for r in rewards[:-1] for v in r.values())
    assert infos["player_0"]["reason"] and infos["player_0"]["role"] == "Player 0"
    assert [a for a, _ in actions[:2]] == ["player_0", "player_1"]  # turns alternate
    local = marti.make("textarena", game="TicTacToe-v0")
    l_actions, l_rewards, l_infos, l_seen, _, _ = play(local, seed=5, policy_seed=1)
    assert l_actions == actions and l_rewards == rewards and l_seen == seen and l_infos == infos


def test_kuhn_poker_remote_is_seeded(env_server):
    address, _ = env_server
    results = []
    for _ in range(2):
        env = marti.make("textarena", game="KuhnPoker-v0", address=address)
        try:
            results.append(play(env, seed=11, policy_seed=3))
        finally:
            env.close()
    assert results[0][0] == results[1][0] and results[0][3] == results[1][3]
    assert sum(results[0][1][-1].values()) == 0.0 and all(results[0][4].values())


def test_limits_and_errors(env_server):
    address, _ = env_server
    env = marti.make(
        "textarena", game="ConnectFour-v0", max_turns=1, max_observation_chars=256, address=address
    )
    try:
        obs, infos = env.reset(seed=0)
        assert all(len(o) <= 256 and env.observation_space(a).contains(o) for a, o in obs.items())
        actor = next(a for a in env.agents if infos[a]["is_acting"])
        obs, rew, term, trunc, _ = env.step({actor: "[3]"})
        assert all(trunc.values()) and not any(term.values()) and set(rew.values()) == {0.0}
        assert env.agents == []
    finally:
        env.close()
    with pytest.raises(NotFoundError, match="'Nope-v0'"):
        marti.make("textarena", game="Nope-v0", address=address)
    with pytest.raises(InvalidArgumentError, match="num_players=3"):
        marti.make("textarena", game="TicTacToe-v0", num_players=3, address=address)
    with pytest.raises(InvalidArgumentError, match="max_observation_chars"):
        marti.make("textarena", game="TicTacToe-v0", max_observation_chars=255)
    with pytest.raises(InvalidArgumentError, match="max_action_chars"):
        long = marti.make("textarena", game="TicTacToe-v0", max_action_chars=16)
        long.reset(seed=0)
        long.step({"player_0": "[4]" + " " * 20})


def test_pettingzoo_api_local_and_remote(env_server):
    address, _ = env_server
    parallel_api_test(marti.make("textarena", game="TicTacToe-v0", seed=1), num_cycles=20)
    remote = marti.make("textarena", game="TicTacToe-v0", seed=1, address=address)
    try:
        parallel_api_test(remote, num_cycles=20)
    finally:
        remote.close()
