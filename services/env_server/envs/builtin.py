"""The built-in ``collaborative_task_solving`` env and its registration (see :mod:`marti.env.registry`)."""

from __future__ import annotations

from typing import Any

from pettingzoo import ParallelEnv

from marti.env.config import ConfigSchema
from marti.env.registry import EnvSpec, Registry
from marti.errors import InvalidArgumentError
from services.env_server.envs import debate, private_allocation, resource_allocation
from services.env_server.envs.text_base import COMMON_FIELDS

SCENARIO_FIELDS = {
    "resource_allocation": {f.name for f in resource_allocation.FIELDS},
    "private_allocation": {f.name for f in private_allocation.FIELDS},
    "debate": {f.name for f in debate.FIELDS},
}

#: scenario -> the difficulty levels it has (the schema's ``difficulty`` choices are their union).
SCENARIO_DIFFICULTIES = {
    "resource_allocation": ("easy", "medium", "hard"),
    "private_allocation": tuple(private_allocation.PRIVATE_DIFFICULTIES),
    "debate": ("easy", "medium", "hard"),
}

COLLABORATIVE_SCHEMA = ConfigSchema(
    COMMON_FIELDS + resource_allocation.FIELDS + private_allocation.OWN_FIELDS + debate.FIELDS
)


def make_collaborative(config: dict[str, Any], seed: int | None) -> ParallelEnv:
    """Build ``collaborative_task_solving`` for ``config["scenario"]``.

    Args:
        config: Validated config.
        seed: Seed of the first reset without a seed.

    Returns:
        A :class:`ResourceAllocationEnv`, :class:`PrivateAllocationEnv` or :class:`DebateEnv`.

    Raises:
        InvalidArgumentError: A key that belongs only to other scenarios was set to a non-default value, a
            difficulty the scenario does not have (``pick`` outside ``private_allocation``), or the scenario's env
            rejects the config (e.g. its roles).
    """
    scenario = config["scenario"]
    defaults = COLLABORATIVE_SCHEMA.defaults()
    own = SCENARIO_FIELDS[scenario]
    for other, keys in SCENARIO_FIELDS.items():
        if other != scenario:
            for key in sorted(keys - own):
                if config[key] != defaults[key]:
                    raise InvalidArgumentError(
                        f"config key {key!r} belongs to scenario {other!r}, not {scenario!r}"
                    )
    if config["difficulty"] not in SCENARIO_DIFFICULTIES[scenario]:
        raise InvalidArgumentError(
            f"difficulty {config['difficulty']!r} is not a level of scenario {scenario!r} "
            f"(its levels: {', '.join(SCENARIO_DIFFICULTIES[scenario])})"
        )
    if scenario == "debate":
        return debate.DebateEnv(config, seed)
    if scenario == "private_allocation":
        return private_allocation.PrivateAllocationEnv(config, seed)
    return resource_allocation.ResourceAllocationEnv(config, seed)


def register_collaborative(registry: Registry) -> None:
    """Register ``collaborative_task_solving-v1`` into ``registry``.

    The provider of that name, declared as a ``marti.envs`` entry point in ``pyproject.toml``: the registry
    imports this module and calls this function the first time the name is used.
    """
    registry.register(
        EnvSpec(
            "collaborative_task_solving",
            1,
            make_collaborative,
            COLLABORATIVE_SCHEMA,
            "Team of LLM agents on text tasks. scenario=resource_allocation: leader plans, executor allocates, "
            "evaluator judges a seeded allocation problem with an exact optimum. scenario=private_allocation: "
            "the same problems split between the agents (the leader knows the values, the executor the "
            "resources and limits), so they must tell each other. scenario=debate: solvers debate a "
            "verifiable arithmetic or word problem, an aggregator answers.",
        )
    )
