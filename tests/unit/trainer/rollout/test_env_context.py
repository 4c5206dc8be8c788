"""An env's refusal of its config names the job's task and curriculum level (the trainer's ``_env_context``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import marti
from marti.config import load_config
from marti.errors import InvalidArgumentError
from services.trainer.job.connections.addresses import Addresses
from services.trainer.job.run.loop import TrainingLoop
from tests.refused_runs import train_over_an_old_run

ROOT = Path(__file__).resolve().parents[4]


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


def test_levels_a_task_reaches_later_are_checked_before_the_job_starts() -> None:
    """``check_envs`` (called first by ``run``) makes each task's env at its current level and every
    level above it, and closes it: a level that only a later level-up would reach fails at once."""
    overrides = [
        "environment.env_name=collaborative_task_solving",
        "curriculum.enabled=true",
        "curriculum.levels=[easy,pick]",
        "tasks=[{name: priv, scenario: private_allocation}, {name: plain, scenario: resource_allocation}]",
    ]
    loop = _loop(*overrides)
    loop._make_task_env(0, "plain")  # the starting level is fine: the job would start, then fail at 'pick'
    with pytest.raises(
        InvalidArgumentError, match=r"^task 'plain' .* at curriculum level 'pick': .*not a level"
    ):
        loop.check_envs()

    made: list[tuple[str, str]] = []
    fine = _loop(*overrides[:-1], "tasks=[{name: priv, scenario: private_allocation}]")

    def env_for(name, seed, config):
        env = marti.make(name, seed=seed, **config)
        made.append((config["difficulty"], "open"))
        close = env.close
        env.close = lambda: (made.append((config["difficulty"], "closed")), close())
        return env

    fine._env_for = env_for
    fine.check_envs()
    assert made == [("easy", "open"), ("easy", "closed"), ("pick", "open"), ("pick", "closed")]
    assert (
        _loop("environment.env_name=collaborative_task_solving").check_envs() is None
    )  # no curriculum: fine


@pytest.mark.parametrize("task", [False, True])
def test_a_bad_env_option_fails_before_the_job_starts_without_a_curriculum(task: bool) -> None:
    """``check_envs`` makes the starting env of each task (or of the ``environment`` section) even without a
    curriculum, so a value the env refuses fails before Ray and the models start, naming the key."""
    bad = "environment.options={ranked: true}"  # ranked needs pick or easy: the env refuses it at medium
    overrides = ["environment.env_name=collaborative_task_solving", "environment.scenario=private_allocation"]
    overrides += ["tasks=[{name: priv, difficulty: medium}]"] if task else ["environment.difficulty=medium"]
    with pytest.raises(InvalidArgumentError, match="ranked=True needs difficulty in"):
        _loop(*overrides, bad).check_envs()
    made: list[str] = []
    external = _loop(*overrides, bad, "rollout.source=external", "rollout.eval_every=0")
    external._env_for = lambda name, seed, config: made.append(name)
    external.check_envs()  # episodes only from outside and no evaluation: no env is played, none checked
    assert made == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ranked": True}, "curriculum level 'medium'.*ranked=True needs difficulty"),
        # named like marti.make's own arguments: still env options, refused as keys the env lacks
        ({"ranked": True, "seed": 3}, "unknown config key 'seed'"),
        ({"ranked": True, "timeout_s": 5}, "unknown config key 'timeout_s'"),
    ],
)
def test_a_bad_env_option_is_refused_before_an_overwrite_touches_the_old_run(
    tmp_path, options: dict, message: str
) -> None:
    """`marti train --overwrite` with an env option the env refuses (at a curriculum level above the first, or
    a key it lacks): the env is made in process before the run folder is prepared, so the job is refused naming
    the level or key, and the previous run is kept."""
    proc = train_over_an_old_run(
        tmp_path,
        {"training_name": "t", "num_agents": 2,
         "agents": [{"name": "a", "pretrain_model": "tiny-llama", "role": "planner"},
                    {"name": "b", "pretrain_model": "tiny-llama", "role": "executor"}],
         "environment": {"env_name": "collaborative_task_solving", "scenario": "private_allocation",
                         "options": options},
         "curriculum": {"enabled": True, "levels": ["pair", "easy", "medium"]}},
    )  # fmt: skip
    assert re.search(message, proc.stderr), proc.stderr


def test_the_in_process_check_is_for_a_job_that_starts_its_own_env_server(monkeypatch) -> None:
    """Only a job without ``--env``, ``MARTI_ENV_ADDR`` or ``services.env`` runs the envs this process makes; one
    given an env server is checked on that server (``TrainingLoop.check_envs``)."""
    from services.trainer.job.cli.train_cli import build_parser
    from services.trainer.job.run.prechecks import starts_own_env_server

    monkeypatch.delenv("MARTI_ENV_ADDR", raising=False)
    cfg = load_config(ROOT / "examples" / "tiny.yaml")
    assert starts_own_env_server(cfg, build_parser().parse_args([]).env)
    assert not starts_own_env_server(cfg, build_parser().parse_args(["--env", "127.0.0.1:5"]).env)
    given = load_config(ROOT / "examples" / "tiny.yaml", ["services.env=127.0.0.1:5"])
    assert not starts_own_env_server(given, build_parser().parse_args([]).env)
    monkeypatch.setenv("MARTI_ENV_ADDR", "127.0.0.1:5")
    assert not starts_own_env_server(cfg, build_parser().parse_args([]).env)


def test_a_registered_env_without_the_jobs_keys_is_told_which_keys_the_job_sets() -> None:
    """A user's env registered by name whose schema lacks the keys every job sets (``history_messages``, ...)
    refused a key the user never wrote (``difficulty``, which tiny.yaml sets); the message now says the job sets it, lists the keys and what to do."""
    from marti.env.config import ConfigField, ConfigSchema
    from marti.env.registry import EnvSpec, Registry
    from services.env_server.envs.builtin import make_collaborative

    registry = Registry()
    schema = ConfigSchema((ConfigField("max_turns", "int", 4, "turns"),))
    registry.register(EnvSpec("users_game", 1, make_collaborative, schema, "an env with its own keys"))
    loop = _loop("environment.env_name=users_game")
    loop._env_for = lambda name, seed, config: registry.make(name, config, seed)
    with pytest.raises(InvalidArgumentError) as err:
        loop._make_env(0)
    text = str(err.value)
    assert text.startswith("environment 'users_game': unknown config key 'difficulty'"), text
    assert "the job sets 'difficulty' in every env's config (max_turns, reward_type," in text
    assert "docs/workflows.md" in text
