"""The private_allocation scenario through a real env server (port 0): PettingZoo's API test, the same episodes
as in-process (each agent's observation keeps only its own facts), scripted teams complete, config errors."""

from __future__ import annotations

import re
import warnings

import pytest
from pettingzoo.test import parallel_api_test

import marti.env.make as me
from marti.clients.env import EnvClient
from marti.errors import InvalidArgumentError

ENV = "collaborative_task_solving"
TEXTS = [
    "task_1 value 7",
    "task_1: 1\ntask_2: 1",
    "score: 1.5 accept",
    "task_2: 1",
    "\x00",
    "score: 0.5 revise",
]


def play(env, seed: int, texts: list[str]) -> list:
    out = [env.reset(seed=seed)]
    for text in texts:
        if not env.agents:
            break
        out.append(env.step({env.acting_agents[0]: text}))
    return out


@pytest.mark.parametrize("transport", ["stream", "unary"])
@pytest.mark.parametrize(
    "cfg",
    [
        {},
        {"difficulty": "hard", "observation_format": "json", "reward_type": "sparse"},
        {"difficulty": "pick", "observation_format": "json"},
    ],
)
def test_remote_equals_local(env_server, transport: str, cfg: dict) -> None:
    remote = me.make(
        ENV, scenario="private_allocation", address=env_server[0], seed=3, transport=transport, **cfg
    )
    try:
        got = play(remote, 8, TEXTS)
        assert got == play(me.make(ENV, scenario="private_allocation", seed=3, **cfg), 8, TEXTS)
        assert len(got) == len(TEXTS) + 1
        assert "calibration_error" in me.declared_metrics(remote)
        obs = got[-1][0]
        assert "capacity" not in obs["agent_1"] and not re.search(
            r"value\D{0,3}\d|value_per_unit", obs["agent_2"]
        )
    finally:
        remote.close()


def test_pettingzoo_parallel_api_remote(env_server) -> None:
    for cfg in (
        {},
        {"difficulty": "medium", "observation_format": "json", "num_agents": 2},
        {"difficulty": "pick", "num_agents": 2},
    ):
        remote = me.make(ENV, scenario="private_allocation", address=env_server[0], seed=0, **cfg)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                parallel_api_test(remote, num_cycles=60)
        finally:
            remote.close()


def test_scripted_pair_completes_remotely(env_server) -> None:
    remote = me.make(ENV, scenario="private_allocation", address=env_server[0], seed=0, num_agents=2)
    try:
        for seed in range(10):
            obs, _ = remote.reset(seed=seed)
            values = re.findall(r"- (task_\d+): value (\d+) per unit", obs["agent_1"])
            obs, *_ = remote.step({"agent_1": "\n".join(f"{n} value {v}" for n, v in values)})
            k = int(re.search(r"cpu capacity (\d+)", obs["agent_2"]).group(1))
            told = {n: int(v) for n, v in re.findall(r"(task_\d+) value (\d+)", obs["agent_2"])}
            chosen = sorted(told, key=lambda n: (-told[n], int(n[5:])))[:k]
            _, _, term, _, infos = remote.step(
                {"agent_2": "\n".join(f"{n}: {int(n in chosen)}" for n in told)}
            )
            assert infos["agent_1"]["task_completion"] and all(term.values())
    finally:
        remote.close()


def test_scenario_listed_and_config_errors_over_grpc(env_server) -> None:
    with EnvClient(env_server[0], timeout_s=10) as client:
        listed = {e["env_id"]: e for e in client.list_envs()}
    keys = {f["name"]: f for f in listed[f"{ENV}-v1"]["config_schema"]}
    assert "private_allocation" in keys["scenario"]["choices"]
    with pytest.raises(InvalidArgumentError, match="needs a leader and an executor"):
        me.make(ENV, scenario="private_allocation", num_agents=1, address=env_server[0])
