"""One contract of hostile calls, run on an in-process env and on remote envs over both transports.

docs/environments.md promises that ``marti.make`` gives the same env with or without ``address=``: the same
observations, rewards and errors. Every case below is a mistake a user makes (wrong types, wrong order, a closed
env, unknown agents, bad seeds and actions); each must raise the same ``marti.errors`` class, naming the
argument, on all three flavours, and leave the env usable (the next valid calls give the same results as an
env that never saw the mistake). The env server is real, on a free port.

Also here, because it is a local-versus-remote promise too: a PettingZoo AEC game that ends by emptying
``agents`` without setting any flag (item 11 of issue 29) ends every agent truncated, with
``infos[agent]["truncated_reason"]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium
import pytest
from pettingzoo import AECEnv

import marti
import marti.env.make
from marti.clients.env import AsyncEnvClient, EnvClient, RemoteParallelEnv
from marti.env.guard import VANISHED_REASON
from marti.errors import FailedPreconditionError, InvalidArgumentError, MartiError, NotFoundError
from marti.rpc.testing import serve_in_thread
from services.env_server.envs import adapters
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings

ENV = "collaborative_task_solving"
CONFIG = {"num_agents": 2, "max_turns": 4}
#: env id -> its config in the contract; every env here must pass the hostile-call cases on every flavour.
ENV_CONFIGS: dict[str, dict[str, Any]] = {
    ENV: CONFIG,
    "dataset_task": {
        "rows": [{"prompt": "求 $\\frac{1}{2}$ 的两倍", "label": "1"}, {"prompt": "2 + 2 = ?", "label": "4"}],
        "num_agents": 2,
        "max_turns": 3,
        "verifier": "math",
        "max_action_chars": 4096,
    },
}
FLAVOURS = ("local", "stream", "unary")


class VanishingGame(AECEnv):
    """A two-player AEC game that ends after ``turns`` moves by emptying ``agents``, with no flag set."""

    metadata = {"name": "vanishing_v0", "is_parallelizable": False}

    def __init__(self, turns: int = 3) -> None:
        super().__init__()
        self.turns = turns
        self.possible_agents = ["p0", "p1"]

    def observation_space(self, agent: str) -> gymnasium.Space:
        return gymnasium.spaces.Discrete(100)

    def action_space(self, agent: str) -> gymnasium.Space:
        return gymnasium.spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = "p0"
        self.moves = 0

    def observe(self, agent: str) -> int:
        return self.moves

    def step(self, action: int) -> None:
        self.rewards = dict.fromkeys(self.possible_agents, 0.0)
        self.rewards[self.agent_selection] = float(action)
        self.moves += 1
        if self.moves >= self.turns:
            self.agents = []  # the game is over; it says so only by emptying agents
        else:
            self.agent_selection = "p1" if self.agent_selection == "p0" else "p0"


def vanishing_game(turns: int = 3) -> VanishingGame:
    """Entry point of :class:`VanishingGame` for ``marti.make("pettingzoo", entry_point=...)``."""
    return VanishingGame(turns)


@pytest.fixture(scope="module")
def address():
    """A real env server on a free port that may host this module's game."""
    settings = EnvServerSettings(port=0, allowed_modules=[*adapters.DEFAULT_ALLOWED_MODULES, __name__])
    try:
        with serve_in_thread(lambda: [env_service(settings)], settings) as server:
            yield server.address
    finally:
        adapters.set_allowed_modules(adapters.DEFAULT_ALLOWED_MODULES)


def make_env(flavour: str, address: str, env_id: str = ENV, **kw: Any) -> Any:
    """``marti.make`` in-process (``local``) or on the server over the ``stream`` or ``unary`` transport."""
    config = {**ENV_CONFIGS.get(env_id, {}), **kw}
    if flavour == "local":
        return marti.make(env_id, **config)
    return marti.make(env_id, address=address, transport=flavour, **config)


def _step(env: Any, actions: Any) -> Any:
    return env.step(actions)


def _closed(env: Any) -> Any:
    env.close()
    return env.step({"agent_1": "task_1: 1"})


def _reset_closed(env: Any) -> Any:
    env.close()
    env.close()  # closing twice is fine
    return env.reset(seed=1)


def _finished(env: Any) -> Any:
    while env.agents:
        env.step({a: "nothing readable" for a in env.agents})
    return env.step({"agent_1": "task_1: 1"})


#: name -> (whether to reset first, the hostile call, the error class, text the message must contain)
CASES: dict[str, tuple[bool, Callable[[Any], Any], type[MartiError], str]] = {
    "step_before_reset": (False, lambda e: e.step({"agent_1": "x"}), FailedPreconditionError, "reset"),
    "actions_list_before_reset": (False, lambda e: _step(e, ["x"]), InvalidArgumentError, "actions"),
    "step_after_episode_end": (True, _finished, FailedPreconditionError, "over"),
    "step_after_close": (True, _closed, FailedPreconditionError, "closed"),
    "reset_after_close": (True, _reset_closed, FailedPreconditionError, "closed"),
    "actions_list": (True, lambda e: _step(e, [("agent_1", "x")]), InvalidArgumentError, "actions"),
    "actions_none": (True, lambda e: _step(e, None), InvalidArgumentError, "actions"),
    "actions_str": (True, lambda e: _step(e, "task_1: 1"), InvalidArgumentError, "actions"),
    "agent_not_str": (True, lambda e: _step(e, {1: "x"}), InvalidArgumentError, "agent names"),
    "unknown_agent": (True, lambda e: _step(e, {"agent_9": "x"}), InvalidArgumentError, "agent_9"),
    "action_not_text": (True, lambda e: _step(e, {"agent_1": 5}), InvalidArgumentError, "agent_1"),
    "action_object": (True, lambda e: _step(e, {"agent_1": object()}), InvalidArgumentError, "agent_1"),
    "action_too_long": (
        True,
        lambda e: _step(e, {"agent_1": "x" * 5000}),
        InvalidArgumentError,
        "max_action",
    ),
    "seed_str": (True, lambda e: e.reset(seed="x"), InvalidArgumentError, "seed"),
    "seed_float": (True, lambda e: e.reset(seed=1.5), InvalidArgumentError, "seed"),
    "seed_bool": (True, lambda e: e.reset(seed=True), InvalidArgumentError, "seed"),
    "seed_2_70": (True, lambda e: e.reset(seed=2**70), InvalidArgumentError, "seed"),
    "seed_minus_2_70": (True, lambda e: e.reset(seed=-(2**70)), InvalidArgumentError, "seed"),
    "seed_2_63": (True, lambda e: e.reset(seed=2**63), InvalidArgumentError, "seed"),
    "options_list": (True, lambda e: e.reset(seed=1, options=[1]), InvalidArgumentError, "options"),
    "options_object": (
        True,
        lambda e: e.reset(options={"o": object()}),
        InvalidArgumentError,
        "options['o']",
    ),
    "options_nested_set": (
        True,
        lambda e: e.reset(options={"a": [1, {"s": {2}}]}),
        InvalidArgumentError,
        "options['a'][1]['s']: cannot send a value of type set",
    ),
    "options_int_2_70": (True, lambda e: e.reset(options={"a": 2**70}), InvalidArgumentError, "options['a']"),
    "options_nested_int_2_70": (
        True,
        lambda e: e.reset(options={"a": {"b": [1, -(2**70)]}}),
        InvalidArgumentError,
        "options['a']['b'][1]",
    ),
    "options_surrogate_value": (
        True,
        lambda e: e.reset(options={"a": "x\udcff"}),
        InvalidArgumentError,
        "options['a']",
    ),
    "options_surrogate_key": (
        True,
        lambda e: e.reset(options={"\udcff": 1}),
        InvalidArgumentError,
        "options",
    ),
    "action_surrogate": (
        True,
        lambda e: _step(e, {"agent_1": "a\x00b\udcff", "agent_2": "x"}),
        InvalidArgumentError,
        "actions['agent_1']",
    ),
    "agent_surrogate": (True, lambda e: _step(e, {"agent\udcff": "x"}), InvalidArgumentError, "actions"),
}


@pytest.mark.parametrize("env_id", sorted(ENV_CONFIGS))
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_call_gives_the_same_error_everywhere(
    case: str, flavour: str, env_id: str, address: str
) -> None:
    reset_first, call, error, named = CASES[case]
    env = make_env(flavour, address, env_id, seed=3)
    try:
        if reset_first:
            env.reset()
        with pytest.raises(error) as info:
            call(env)
        assert named in str(info.value), str(info.value)
    finally:
        env.close()


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize(
    "seed, named", [("x", "seed"), (2**70, "seed"), (1.5, "seed"), (True, "seed"), (-(2**64), "seed")]
)
def test_make_with_a_bad_seed_is_refused_everywhere(
    flavour: str, seed: Any, named: str, address: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=named):
        make_env(flavour, address, seed=seed)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize(
    "env_id, error",
    [
        (5, InvalidArgumentError),
        ("", InvalidArgumentError),
        ("nope", NotFoundError),
        ("env\udcff", InvalidArgumentError),
    ],
)
def test_make_with_a_bad_env_id_is_refused_everywhere(
    flavour: str, env_id: Any, error: type, address: str
) -> None:
    with pytest.raises(error, match="env"):
        make_env(flavour, address, env_id=env_id)


def _play_with_mistakes(env: Any) -> list[Any]:
    """Reset, make every kind of mistake between valid steps, and return what the valid calls gave."""
    seen: list[Any] = [env.reset(seed=11)]
    mistakes = [None, ["x"], {1: "x"}, {"agent_9": "x"}, {"agent_1": object()}]
    while env.agents:
        for bad in mistakes:
            with pytest.raises(InvalidArgumentError):
                env.step(bad)
        with pytest.raises(InvalidArgumentError):
            env.reset(seed="x")
        seen.append(env.step({a: "task_1: 1" if env.acting_agents == [a] else "" for a in env.agents}))
        seen.append((list(env.agents), list(env.acting_agents)))
    return seen


@pytest.mark.parametrize("env_id", sorted(ENV_CONFIGS))
def test_refused_calls_leave_every_flavour_playing_the_same_episode(env_id: str, address: str) -> None:
    envs = {f: make_env(f, address, env_id, seed=3) for f in FLAVOURS}
    try:
        played = {f: _play_with_mistakes(e) for f, e in envs.items()}
    finally:
        for e in envs.values():
            e.close()
    assert played["stream"] == played["local"]
    assert played["unary"] == played["local"]


# --------------------------------------------------------------------------- a game that ends by itself


@pytest.mark.parametrize("text", [False, True])
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_aec_game_that_empties_agents_ends_them_truncated(flavour: str, text: bool, address: str) -> None:
    env = make_env(flavour, address, env_id="pettingzoo", entry_point=f"{__name__}:vanishing_game", text=text)
    try:
        env.reset(seed=0)
        last = None
        for _ in range(3):
            assert env.agents, "the game ended early"
            last = env.step({a: ("1" if text else 1) for a in env.acting_agents})
        _, _, terms, truncs, infos = last
        assert env.agents == []
        assert terms == {"p0": False, "p1": False}
        assert truncs == {"p0": True, "p1": True}
        assert all(infos[a]["truncated_reason"] == VANISHED_REASON for a in ("p0", "p1"))
        with pytest.raises(FailedPreconditionError):
            env.step({"p0": "1" if text else 1})
    finally:
        env.close()


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("space", ["observation_space", "action_space"])
def test_space_of_an_unknown_agent_is_refused_everywhere(flavour: str, space: str, address: str) -> None:
    env = make_env(flavour, address)
    try:
        with pytest.raises(InvalidArgumentError, match="agent_9"):
            getattr(env, space)("agent_9")
        assert getattr(env, space)("agent_1") == getattr(marti.make(ENV, **CONFIG), space)("agent_1")
    finally:
        env.close()


# --------------------------------------------------------------------------- SDK arguments of a wrong type

#: name -> (call given the server address and a reset remote env, the argument its error must name)
BAD_ARGUMENTS: dict[str, tuple[Callable[[str, Any], Any], str]] = {
    "make_token_int": (lambda a, e: marti.make(ENV, address=a, token=5), "token"),
    "make_tls_ca_file_int": (lambda a, e: marti.make(ENV, address=a, tls_ca_file=5), "tls_ca_file"),
    "make_channel_str": (lambda a, e: marti.make(ENV, address=a, channel="x"), "channel"),
    "client_address_int": (lambda a, e: EnvClient(5), "address"),
    "aio_client_address_int": (lambda a, e: AsyncEnvClient(5), "address"),
    "client_step_session_int": (lambda a, e: e.client.step(5, {}), "session_id"),
    "client_reset_session_none": (lambda a, e: e.client.reset(None), "session_id"),
    "client_close_session_int": (lambda a, e: e.client.close_session(5), "session_id"),
    "client_batch_not_list": (lambda a, e: e.client.batch_step(5), "steps"),
    "client_batch_item_not_pair": (lambda a, e: e.client.batch_step([5]), "steps[0]"),
    "client_create_config_list": (lambda a, e: e.client.create_session(ENV, [1]), "config"),
    "step_batch_max_batch_str": (
        lambda a, e: RemoteParallelEnv.step_batch([e], [{}], max_batch="x"),
        "max_batch",
    ),
    "step_batch_env_int": (lambda a, e: RemoteParallelEnv.step_batch([5], [{}]), "envs[0]"),
    "step_many_envs_int": (lambda a, e: marti.env.make.step_many(5, [{}]), "envs"),
    "step_many_env_int": (lambda a, e: marti.env.make.step_many([e, 5], [{}, {}]), "envs[1]"),
    "step_many_actions_none": (lambda a, e: marti.env.make.step_many([e], None), "actions"),
    "step_many_lengths": (lambda a, e: marti.env.make.step_many([e], []), "action dicts"),
    "step_many_errors_mode": (lambda a, e: marti.env.make.step_many([e], [{}], errors="skip"), "errors"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_sdk_argument_of_a_wrong_type_is_named(case: str, address: str) -> None:
    call, named = BAD_ARGUMENTS[case]
    env = make_env("unary", address, seed=1)
    try:
        env.reset()
        with pytest.raises(InvalidArgumentError) as info:
            call(address, env)
        assert named in str(info.value), str(info.value)
        env.step({env.acting_agents[0]: "task_1: 1"})  # nothing was sent: the env still plays
    finally:
        env.close()
