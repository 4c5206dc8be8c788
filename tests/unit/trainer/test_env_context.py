"""An env's refusal of its config names the job's task and curriculum level (the trainer's ``_env_context``)."""

from __future__ import annotations

from pathlib import Path

import pytest

import marti
from marti.config import load_config
from marti.errors import InvalidArgumentError
from services.trainer.loop import Addresses, TrainingLoop

ROOT = Path(__file__).resolve().parents[3]


def _loop(*overrides: str) -> TrainingLoop:
    cfg = load_config(ROOT / "examples" / "tiny.yaml", list(overrides))
    loop = TrainingLoop(cfg, Addresses("unused:1", "unused:1", "unused:1"), show_progress=False)
    # the real env, in this process, instead of a session on an env server: its refusal is the server's
    loop._env_for = lambda name, seed, config: marti.make(name, seed=seed, **config)
    return loop


def test_a_level_a_tasks_scenario_lacks_names_the_task_and_the_level() -> None:
    """A curriculum starting at ``pick`` (a level of private_allocation only) with a resource_allocation task."""
    loop = _loop(
        "environment.env_name=collaborative_task_solving",
        "curriculum.enabled=true",
        "curriculum.levels=[pick,easy]",
        "tasks=[{name: plain, scenario: resource_allocation, difficulty: pick}]",
    )
    with pytest.raises(InvalidArgumentError) as err:
        loop._make_task_env(0, "plain")
    text = str(err.value)
    assert text.startswith("task 'plain' (collaborative_task_solving) at curriculum level 'pick': ")
    assert "difficulty 'pick' is not a level of scenario 'resource_allocation'" in text


def test_without_a_task_the_curriculum_level_is_named_and_without_either_the_message_is_the_envs() -> None:
    loop = _loop(
        "environment.env_name=collaborative_task_solving",
        "environment.scenario=debate",
        "curriculum.enabled=true",
        "curriculum.levels=[pick,easy]",
        "environment.difficulty=pick",
    )
    with pytest.raises(InvalidArgumentError, match=r"^environment 'collaborative_task_solving' at curriculum "
                       r"level 'pick': .*not a level of scenario 'debate'"):  # fmt: skip
        loop._make_env(0)
    plain = _loop("environment.env_name=collaborative_task_solving", "environment.scenario=debate")
    plain._env_for = lambda name, seed, config: marti.make(name, seed=seed, **{**config, "max_turns": 0})
    with pytest.raises(InvalidArgumentError) as err:
        plain._make_env(0)
    assert not str(err.value).startswith(("environment '", "task '"))
