"""Run-time effects of config keys that no builder of the key walk (test_key_walk.py) shows, one test each.

Each test sets the key to a non-default value and checks what the trainer's own code does with it, with fakes
for the models and services it would otherwise load or dial (no Ray, no gRPC, no model weights):

- ``agents.N.response_prefix``: :func:`services.trainer.rollout.engines.generation.generate_turns` appends the prefix's tokens to
  the prompt and starts the returned text with it;
- ``agents.N.critic_model``: :func:`services.trainer.ray.policy_worker.build_agent_critic` loads the critic from it;
- ``rollout.tis_cap``, ``micro_train_batch_size``, ``gradient_accumulation_steps``:
  :meth:`services.trainer.ray.policy_worker.PolicyWorker.train` hands them to the update;
- ``workflow.roles.N.system_prompt``: ``{capabilities}`` is filled with the agent's capabilities.

The module also holds the callables the key walk names by import path (``workflow.next_speakers``, ``factory``,
``reward_fn``, ``roles.N.prompt_builder`` / ``parser`` / ``scripted``; its ``HELPERS`` path).
"""

from __future__ import annotations

import copy
import threading
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from marti.config import TrainConfig, config_from_dict

BASE: dict[str, Any] = {
    "training_name": "t",
    "agents": [
        {"name": "a", "pretrain_model": "m", "role": "planner"},
        {"name": "b", "pretrain_model": "m", "role": "executor"},
    ],
    "device": "cpu",
}


# ---------------------------------------------------------------------------------------- import-path helpers
def first_speaker(state: Any) -> list[str]:
    """``workflow.next_speakers``: the first agent every turn."""
    return [state.agents[0]]


def last_speaker(state: Any) -> list[str]:
    """``workflow.next_speakers``: the last agent every turn."""
    return [state.agents[-1]]


def chain_of_the_last_agent(cfg: TrainConfig) -> Any:
    """``workflow.factory``: a chain in which only the last agent speaks."""
    from marti.team.workflow import Workflow

    return Workflow.chain([cfg.agents[-1].name])


def first_agent_wins(view: Any) -> dict[str, float]:
    """``workflow.reward_fn``: 1 for the first agent, nothing for the others."""
    return {view.agents[0]: 1.0}


def marked_prompt(ctx: Any) -> str:
    """``workflow.roles.N.prompt_builder``."""
    return f"built for {ctx.agent}: {ctx.observation}"


def shouting_parser(text: str) -> str:
    """``workflow.roles.N.parser``."""
    return text.upper()


def scripted_reply(chat: list[dict[str, str]]) -> str:
    """``workflow.roles.N.scripted``."""
    return "scripted: " + chat[-1]["content"]


# ---------------------------------------------------------------------------------------------- helpers
def _cfg(**dotted: Any) -> TrainConfig:
    raw = copy.deepcopy(BASE)
    for key, value in dotted.items():
        node: Any = raw
        parts = key.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
        node[parts[-1]] = value
    return config_from_dict(raw)


# ---------------------------------------------------------------------------------------------- the tests
class _Tokenizer:
    pad_token_id = 0
    eos_token_id = 0

    def apply_chat_template(self, messages, **kwargs):
        return [1, 2, 3]

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [7] * len(text.split())}


class _Engine:
    def __init__(self) -> None:
        self.prompts: list[Any] = []

    def generate(self, agent, prompts, sampling):
        from marti.types.inference import Generation

        self.prompts.append(list(prompts))
        return [Generation([1], [5], [-0.1], " 40", "stop") for _ in prompts]


@pytest.mark.parametrize("prefix", [None, "task_1: offer"])
def test_response_prefix_ends_the_prompt_and_starts_the_text(prefix):
    from services.trainer.rollout.engines.generation import generate_turns, generation_config

    cfg = generation_config(_cfg(**{"agents.0.response_prefix": prefix}))
    engine = _Engine()
    policy = SimpleNamespace(tokenizer=lambda agent: _Tokenizer())
    chats = [[{"role": "user", "content": "split 40 units"}]]
    gens = generate_turns(cfg, policy, engine, threading.Lock(), "a", chats)
    if prefix is None:
        assert engine.prompts == [chats] and gens[0].text == " 40"
    else:  # the chat template's ids, then the prefix's (never trained: they are prompt tokens)
        assert engine.prompts == [[[1, 2, 3, 7, 7]]] and gens[0].text == "task_1: offer 40"


@pytest.mark.parametrize(("critic_model", "loaded"), [(None, "m"), ("critic-base", "critic-base")])
def test_critic_model_is_the_model_the_critic_is_loaded_from(critic_model, loaded):
    import torch

    from services.trainer.ray.policy_worker import build_agent_critic, critic_settings

    cfg = _cfg(**{"agents.0.critic_model": critic_model, "algorithm.advantage_estimator": "gae"})
    names: list[str] = []

    def build_critic(model_name, **kwargs):
        names.append(model_name)
        return torch.nn.Linear(2, 1)

    with mock.patch("services.trainer.learn.critic.build_critic", build_critic):
        critic, engine = build_agent_critic(critic_settings(cfg, "a", ["a", "b"]), "cpu")
    assert names == [loaded] and engine is not None


@pytest.mark.parametrize(
    ("key", "value", "kwarg"),
    [
        ("rollout.tis_cap", 2.0, "tis_cap"),
        ("micro_train_batch_size", 3, "micro_batch_size"),
        ("gradient_accumulation_steps", 2, "grad_accum_steps"),
    ],
)
def test_the_policy_update_takes_its_settings_from_the_config(key, value, kwarg):
    from services.trainer.ray import policy_worker as worker_mod
    from services.trainer.ray.policy_worker import PolicyWorker
    from tests.trainer_data import one_turn

    def update_kwargs(cfg: TrainConfig) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        def update_agent(policy, engine, experience, config, **kwargs):
            seen.update(vars(config))
            return SimpleNamespace(stats={})

        policy = SimpleNamespace(
            tokenizer=lambda agent: _Tokenizer(), train=lambda mode: None, unit_of=lambda agent: agent,
            bump_version=lambda agent: 1,
        )  # fmt: skip
        fake = SimpleNamespace(
            cfg=worker_mod.policy_actor_config(cfg), policy=policy, strategies={"a": None}, algo=cfg.algorithm,
            critics={}, critic_engines={},
            device="cpu", reward_moments={}, _sync_engine=lambda agent, version: None,
        )  # fmt: skip
        with mock.patch.object(worker_mod, "update_agent", update_agent):
            PolicyWorker.train(fake, "a", [one_turn([1, 2], [3, 4], 1.0, "g", [-0.1, -0.2])])
        return seen

    default, changed = update_kwargs(_cfg()), update_kwargs(_cfg(**{key: value}))
    assert changed[kwarg] == value and default[kwarg] != value


def test_a_workflow_roles_system_prompt_lists_the_agents_capabilities():
    from services.trainer.job.connections.addresses import Addresses
    from services.trainer.job.run.loop import TrainingLoop
    from services.trainer.rollout.episodes.runner import EpisodeResult, _Live

    cfg = _cfg(
        **{
            "agents.0.capabilities": ["planning", "coordination"],
            "workflow.roles": [{"agent": "a", "system_prompt": "{name} ({role}) can do: {capabilities}"}],
        }
    )
    loop = TrainingLoop(cfg, Addresses("unused:1", "unused:1", "unused:1"), show_progress=False)
    runner = loop._runner(SimpleNamespace(versions=dict), greedy=False)
    live = _Live(None, 0, "e", {"a": "obs"}, {}, {}, EpisodeResult("e", 0))
    assert runner._turn_prompt(live, "a", 0)[0][0]["content"] == "a (planner) can do: planning, coordination"


@pytest.mark.parametrize("key", ["workflow.reward_team_share", "workflow.reward_env_weight"])
def test_reward_weights_alone_recredit_the_env_returns(key):
    from marti.team.workflow import EpisodeView
    from services.trainer.job.connections.addresses import Addresses
    from services.trainer.job.run.loop import TrainingLoop

    loop = TrainingLoop(_cfg(**{key: 0.5}), Addresses("u:1", "u:1", "u:1"), show_progress=False)
    runner = loop._runner(SimpleNamespace(versions=dict), greedy=False)
    view = EpisodeView(["a", "b"], [], {"a": 1.0, "b": 0.0}, {}, {}, 0)
    expected = {
        "workflow.reward_team_share": {"a": 0.75, "b": 0.25},
        "workflow.reward_env_weight": {"a": 0.5, "b": 0.0},
    }
    assert runner.workflow.rewards(view) == pytest.approx(expected[key])
