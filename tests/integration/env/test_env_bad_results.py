"""An env (another package's code) whose ``step`` returns what PettingZoo's API does not allow is named, with the
bad part and agent, by ``InternalError`` in process and over a real env server alike. Before, in process the bad
result came back as it was, and remote a missing reward became 0.0, an agent missing from ``observations`` was
dropped with its reward, and a reward of text was ``internal error: ValueError: could not convert string to
float`` (no env, agent or part named)."""

from __future__ import annotations

import pytest

import marti.env.make as me
from marti.env.config import ConfigField, ConfigSchema
from marti.env.registry import EnvSpec, Registry
from marti.errors import InternalError, UnknownConfigKeyError
from tests.integration.env.two_text_agents import TwoTextAgents, serve_registry

OK = (
    {"a": "x", "b": "x"},
    {"a": 0.0, "b": 0.0},
    {"a": False, "b": False},
    {"a": False, "b": False},
    {"a": {}, "b": {}},
)
BAD = {
    "missing_reward": ((OK[0], {"a": 0.0}, *OK[2:]), r"rewards for agents \['a'\] but observations for \['a', 'b'\]"),
    "extra_reward": (({"a": "x"}, *OK[1:]), r"rewards for agents \['a', 'b'\] but observations for \['a'\]"),
    "text_reward": ((OK[0], {"a": 0.0, "b": "one"}, *OK[2:]), r"rewards\['b'\] = 'one' \(str\)"),
    "not_a_tuple": (None, r"returned None, not"),
    "four_parts": (OK[:4], r"not \(observations, rewards, terminations, truncations, infos\)"),
    "reset_none": (OK, r"reset returned None, not \(observations, infos\) dicts"),
    "reset_missing_info": (OK, r"reset returned infos for agents \['a'\] but observations for \['a', 'b'\]"),
}  # fmt: skip


#: Results PettingZoo allows but the wire cannot carry: ``InternalError`` naming the key path, in process as from
#: a server (in process they came back as they were, so an env that worked locally failed once served).
UNSENDABLE = {
    "object_observation": (({"a": "x", "b": object()}, *OK[1:]), r"observations\['b'\]: cannot send a value of type object"),
    "set_observation": (({"a": "x", "b": {1, 2}}, *OK[1:]), r"observations\['b'\]: cannot send a value of type set"),
    "int_key_observation": (({"a": "x", "b": {1: "x"}}, *OK[1:]), r"observations\['b'\]: map keys must be strings, got 1"),
    "huge_int_observation": (({"a": 2**63, "b": "x"}, *OK[1:]), r"observations\['a'\]=9223372036854775808 is outside the int64"),
    "surrogate_observation": (({"a": "x", "b": "\ud800"}, *OK[1:]), r"observations\['b'\] must be valid Unicode"),
    "nested_set_observation": (({"a": {"x": [1, {2}]}, "b": "x"}, *OK[1:]), r"observations\['a'\]\['x'\]\[1\]: cannot send a value of type set"),
    "set_info": ((*OK[:4], {"a": {}, "b": {"s": {1, 2}}}), r"infos\['b'\]\['s'\]: cannot send a value of type set"),
    "none_info": ((*OK[:4], {"a": {}, "b": None}), r"infos\['b'\] is of type NoneType, not a dict"),
}  # fmt: skip


class ScriptedEnv(TwoTextAgents):
    """Two agents; ``step`` (or, for the ``reset_*`` modes, ``reset``) returns ``BAD[mode]``'s result (the config
    key ``mode``), or a good one for ``ok``."""

    def reset(self, seed=None, options=None):
        obs, infos = super().reset(seed, options)
        mode = self.config["mode"]
        return (
            None
            if mode == "reset_none"
            else (obs, {"a": {}})
            if mode == "reset_missing_info"
            else ({**obs, "a": {1}}, infos)
            if mode == "reset_set_observation"
            else (obs, infos)
        )

    def step(self, actions):
        return OK if self.config["mode"] == "ok" else {**BAD, **UNSENDABLE}[self.config["mode"]][0]


def _registry() -> Registry:
    registry = Registry()
    schema = ConfigSchema((ConfigField("mode", "str", "ok", "which result step returns"),))
    registry.register(EnvSpec("scripted_results", 1, ScriptedEnv, schema, "a step result chosen by config"))
    return registry


@pytest.fixture(scope="module")
def address():
    with serve_registry(_registry()) as address:
        yield address


@pytest.mark.parametrize("where", ["in-process", "stream", "unary"])
@pytest.mark.parametrize("mode", sorted(BAD))
def test_a_bad_step_result_is_named_in_process_and_remote(address, where, mode):
    if where == "in-process":
        env = _registry().make("scripted_results", {"mode": mode})
    else:
        env = me.make("scripted_results", address=address, transport=where, mode=mode)
    try:
        with pytest.raises(InternalError, match=BAD[mode][1]) as err:
            env.reset(seed=0)
            env.step({"a": "hi", "b": "hi"})
        assert "scripted_results-v1" in str(err.value)
    finally:
        env.close()


@pytest.mark.parametrize("where", ["in-process", "stream"])
def test_a_good_step_result_passes(address, where):
    env = (
        _registry().make("scripted_results", {"mode": "ok"})
        if where == "in-process"
        else me.make("scripted_results", address=address, mode="ok")
    )
    env.reset(seed=0)
    assert env.step({"a": "hi", "b": "hi"})[1] == {"a": 0.0, "b": 0.0}
    env.close()


@pytest.mark.parametrize("mode", sorted(UNSENDABLE))
def test_a_result_the_wire_cannot_carry_is_the_same_internal_error_in_process_and_remote(address, mode):
    """Before: in process the result came back as it was; from a server the error named the agent only (a set),
    or was ``internal error: ValueError: Value out of range`` / ``UnicodeEncodeError`` naming nothing."""
    messages = []
    for where in ("in-process", "stream", "unary"):
        env = (
            _registry().make("scripted_results", {"mode": mode})  # what marti.make does in process
            if where == "in-process"
            else me.make("scripted_results", address=address, transport=where, mode=mode)
        )
        try:
            env.reset(seed=0)
            with pytest.raises(InternalError, match=UNSENDABLE[mode][1]) as err:
                env.step({"a": "hi", "b": "hi"})
            messages.append(str(err.value))
        finally:
            env.close()
    assert messages[0].startswith("env scripted_results-v1's step result cannot be sent: ")
    assert messages == [messages[0]] * 3


def test_a_reset_result_the_wire_cannot_carry_is_the_same_internal_error_in_process_and_remote(address):
    messages = []
    for where in ("in-process", "stream", "unary"):
        env = (
            _registry().make("scripted_results", {"mode": "reset_set_observation"})
            if where == "in-process"
            else me.make("scripted_results", address=address, transport=where, mode="reset_set_observation")
        )
        try:
            with pytest.raises(
                InternalError,
                match=r"reset result cannot be sent: observations\['a'\]: cannot send a value of type set",
            ) as err:
                env.reset(seed=0)
            messages.append(str(err.value))
        finally:
            env.close()
    assert messages == [messages[0]] * 3


def test_an_unknown_config_key_is_named_as_such_from_a_server(address):
    """The class and the key survive the wire (ErrorInfo reason ``UNKNOWN_CONFIG_KEY``), so the trainer can tell
    that the key is one it added itself (``tests/unit/trainer/rollout/test_env_context.py``)."""
    with pytest.raises(UnknownConfigKeyError, match="unknown config key 'history_messages'") as err:
        me.make("scripted_results", address=address, history_messages=0)
    assert err.value.metadata == {"config_key": "history_messages"}
