"""The trainer's env sessions (:meth:`services.trainer.job.connections.connections.Connections.env`) on a real env server: the
env config travels as a mapping, so an option named like one of ``marti.make``'s own arguments is still an env
option, refused by the env as a key it lacks instead of being taken as that argument."""

from __future__ import annotations

import pytest

from marti.errors import InvalidArgumentError
from services.trainer.job.connections.addresses import Addresses
from services.trainer.job.connections.connections import Connections

CONFIG = {"scenario": "private_allocation", "difficulty": "pair", "ranked": True, "num_agents": 2}


@pytest.mark.parametrize("key", ["seed", "timeout_s", "address", "token"])
def test_an_option_named_like_a_make_argument_is_refused_by_the_env(env_server, key: str) -> None:
    address, _ = env_server
    connections = Connections(Addresses("", address, ""))
    try:
        with pytest.raises(InvalidArgumentError, match=f"'{key}'"):
            connections.env("collaborative_task_solving", 0, CONFIG | {key: 3})
        env = connections.env("collaborative_task_solving", 7, CONFIG)  # the same path plays a good config
        obs, _ = env.reset(seed=7)
        assert "Tasks, most valuable first" in obs["agent_1"]
        env.close()
    finally:
        connections.close()


def test_without_an_env_server_the_env_is_made_in_this_process_and_refuses_the_same_keys() -> None:
    connections = Connections(Addresses(None, None, None))
    with pytest.raises(InvalidArgumentError, match="'seed'"):
        connections.env("collaborative_task_solving", 0, CONFIG | {"seed": 3})
    env = connections.env("collaborative_task_solving", 7, CONFIG)
    assert type(env).__name__ != "RemoteParallelEnv"
    obs, _ = env.reset(seed=7)
    assert "Tasks, most valuable first" in obs["agent_1"]
