"""One config path: the ``algorithm`` section is the learner's algorithm config, and its keys the update does
not read itself (``ppo_epochs``, ``critic_learning_rate``, ``normalize_reward``) reach their named consumers.

The config is built from :class:`marti.config.AlgorithmConfig`'s own fields, so a key added later is covered
without touching this file.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import pytest
import yaml

import services.trainer.ray.policy_worker as worker_mod
from marti.config import AlgorithmConfig, TrainConfig, config_from_dict
from marti.errors import InvalidArgumentError
from services.trainer.ray.policy_worker import PolicyWorker, policy_actor_config, steps_per_batch
from tests.trainer_data import one_turn

ROOT = Path(__file__).resolve().parents[4]


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """The inner type of a field annotation (Annotated and Optional stripped) and whether None is allowed."""
    optional = False
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            optional = optional or len(args) < len(typing.get_args(annotation))
            assert len(args) == 1, f"no value picker for the union {annotation}"
            annotation = args[0]
        else:
            return annotation, optional


def _candidates(name: str, index: int) -> list[Any]:
    """Values to try for ``algorithm.<name>``, most distinctive first (distinct per field for numbers)."""
    info = AlgorithmConfig.model_fields[name]
    tp, optional = _unwrap(info.annotation)
    default = info.get_default(call_default_factory=True)
    if typing.get_origin(tp) is Literal:
        out: list[Any] = list(typing.get_args(tp))
    elif tp is bool:
        out = [not default] if default is not None else [True, False]
    elif tp is int:
        out = [2 + index, 3 + index, 7 + index, 1, 0]
    elif tp is float:
        out = [0.3 + 0.01 * index, 1.5 + 0.1 * index, 3.0 + index, 0.01 * (index + 1)]
    else:
        raise AssertionError(f"no value picker for algorithm.{name} of type {tp!r}: extend _candidates")
    if optional:
        out.append(None)
    return [v for v in out if v != default]


#: The estimator the config is built around: gae, so the worker holds critics and the critic's keys are read.
ESTIMATOR = "gae"


def non_default_algorithm() -> tuple[dict[str, Any], dict[str, str]]:
    """A value for every ``algorithm`` key of a config built around :data:`ESTIMATOR`: each different from its
    default where the config reads the key; a key the estimator leaves unread keeps its default (a non-default
    value is refused, :mod:`marti.config.unread`).

    Returns:
        ``(values, unread)``: the values, and for each key kept at its default the refusal its first candidate got.
    """
    values: dict[str, Any] = {"advantage_estimator": ESTIMATOR}
    unread: dict[str, str] = {}
    for index, name in enumerate(AlgorithmConfig.model_fields):
        if name in values:
            continue
        refusal = ""
        for value in _candidates(name, index):
            try:
                AlgorithmConfig(**{name: value})
            except InvalidArgumentError:
                continue
            try:
                _config({**values, name: value})
            except InvalidArgumentError as exc:
                refusal = refusal or str(exc)
                continue
            values[name] = value
            break
        else:
            assert refusal, f"found no valid non-default value for algorithm.{name}: extend _candidates"
            values[name] = AlgorithmConfig.model_fields[name].get_default(call_default_factory=True)
            unread[name] = refusal
    return values, unread


def _config(algorithm: dict[str, Any]) -> TrainConfig:
    data = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    data["algorithm"] = algorithm
    data["max_steps"] = 1
    return config_from_dict(data, source="tiny.yaml+every-algorithm-key")


def test_the_picked_values_cover_every_key_and_differ_from_the_defaults_where_read():
    values, unread = non_default_algorithm()
    assert set(values) == set(AlgorithmConfig.model_fields)
    section = _config(values).algorithm
    for name, info in AlgorithmConfig.model_fields.items():
        default = info.get_default(call_default_factory=True)
        assert getattr(section, name) == values[name], name
        if (
            name in unread
        ):  # only because the estimator does not read it (reached elsewhere: test_key_walk.py)
            assert f"algorithm.{name}=" in unread[name] and "not read" in unread[name], unread[name]
        else:
            assert values[name] != default, name
    # most keys are read under gae; adv_eps, group_by and normalize_per_agent are not
    assert len(unread) <= 4, unread


@pytest.fixture(scope="module")
def worker_run():
    """A PolicyWorker on a config with every algorithm key non-default, trained once with a recording learner."""
    values, _ = non_default_algorithm()
    cfg = _config(values)
    seen: dict[str, Any] = {}

    def record(policy, engine, experience, config, critic=None):
        seen.update(cfg=config.algo, batch=experience, critic=critic, **vars(config))
        return types.SimpleNamespace(stats={})

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(worker_mod, "update_agent", record)
        worker = PolicyWorker(policy_actor_config(cfg), num_threads=1)
        agent = worker.policy.trainable_agents[0]
        worker.train(agent, [one_turn([1, 2, 3], [4, 5], 1.0, 0), one_turn([1, 2, 3], [6], 0.0, 0)])
    return values, cfg, worker, agent, seen


def test_the_learner_gets_every_algorithm_key_from_the_policy_worker(worker_run):
    values, _, worker, _, seen = worker_run
    assert isinstance(seen["cfg"], AlgorithmConfig) and seen["cfg"] is worker.algo
    for key, value in values.items():
        assert getattr(seen["cfg"], key) == value, f"the learner's algorithm.{key} is not the config's"


def test_the_keys_the_update_does_not_read_reach_their_named_consumers(worker_run):
    values, cfg, worker, agent, seen = worker_run
    # ppo_epochs: passes over the batch in update_agent, and the LR schedule's length.
    assert seen["ppo_epochs"] == values["ppo_epochs"]
    strategy = worker.strategies[worker.policy.unit_of(agent)]
    assert strategy.cfg.total_steps == cfg.max_steps * values["ppo_epochs"] * steps_per_batch(cfg)
    # critic_learning_rate: the critic's optimizer (gae is the estimator, so the worker holds critics).
    assert values["advantage_estimator"] == "gae" and worker.critic_engines
    for engine in worker.critic_engines.values():
        assert engine.cfg.lr == pytest.approx(values["critic_learning_rate"])
    assert seen["critic"].engine is worker.critic_engines[agent]
    # normalize_reward: the batch the learner gets has its rewards normalised by the agent's running moments.
    assert values["normalize_reward"] is True
    assert seen["batch"].rewards.tolist() == pytest.approx(
        [1.0, -1.0], abs=1e-6
    )  # rewards 1 and 0: mean 0.5, std 0.5
    assert worker.reward_moments[agent].count == 2


def test_the_running_reward_moments_are_saved_with_the_checkpoint(worker_run, tmp_path):
    _, cfg, worker, agent, _ = worker_run
    worker.save(str(tmp_path / "ckpt"), {"step": 1})
    fresh = PolicyWorker(policy_actor_config(cfg), num_threads=1)
    assert fresh.reward_moments[agent].count == 0
    fresh.load(str(tmp_path / "ckpt"))
    assert fresh.reward_moments[agent] == worker.reward_moments[agent]
