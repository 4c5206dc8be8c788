"""Adapter ``kwargs`` the env's factory refuses (a key it does not take, a required key missing, a wrong-typed
value its TypeError names) are an InvalidArgumentError naming the env, the entry point and the TypeError, in process
and from the env server (INVALID_ARGUMENT; it answered INTERNAL with the bare TypeError, and in process the TypeError
itself came out)."""

from __future__ import annotations

import pytest

import marti
from marti.errors import InvalidArgumentError

CASES = [
    ("pettingzoo", "pettingzoo.classic.tictactoe_v3:env"),  # env(**kwargs) passes them on: TypeError inside
    ("gymnasium", "gymnasium.envs.classic_control.cartpole:CartPoleEnv"),  # the class itself refuses
]


@pytest.mark.parametrize("remote", [False, True], ids=["in_process", "env_server"])
@pytest.mark.parametrize(("env_id", "entry_point"), CASES)
def test_a_kwarg_the_env_does_not_take_is_named(env_server, remote, env_id, entry_point):
    address = env_server[0] if remote else None
    with pytest.raises(InvalidArgumentError) as info:
        marti.make(env_id, entry_point=entry_point, kwargs={"bad": 1}, address=address)
    msg = str(info.value)
    assert f"env '{env_id}'" in msg and f"entry_point '{entry_point}'" in msg, msg
    assert "does not accept the kwargs key 'bad'" in msg, msg


MAKE = "gymnasium.envs.registration:make"


@pytest.mark.parametrize("remote", [False, True], ids=["in_process", "env_server"])
@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({}, "missing a required argument: 'id'"),  # refused by the signature, before the call
        (
            {"id": "CartPole-v1", "max_episode_steps": "ten"},
            "Expect the `max_episode_steps` to be an integer",
        ),
    ],
    ids=["missing_key", "wrong_type"],
)
def test_a_missing_key_or_a_wrong_typed_value_is_named(env_server, remote, kwargs, fragment):
    address = env_server[0] if remote else None
    with pytest.raises(InvalidArgumentError) as info:
        marti.make("gymnasium", entry_point=MAKE, kwargs=kwargs, address=address)
    msg = str(info.value)
    assert f"env 'gymnasium': entry_point '{MAKE}' refused its kwargs (TypeError: " in msg, msg
    assert fragment in msg and f"kwargs given: {sorted(kwargs)}" in msg, msg
