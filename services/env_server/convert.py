"""The only bridge between ``marti.api.env.v1`` protos and the env server's domain types.

Values and spaces use the protocol codec shared with the client (:mod:`marti.codec.env`); this module
adds registry descriptions and session outcomes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marti.api.env.v1 import env_pb2 as pb
from marti.codec.env import (
    fill_map,
    fill_value,
    infos_json,
    map_from_proto,
    map_to_proto,
    space_to_proto,
    value_from_proto,
    value_to_proto,
)
from marti.envs import declared_metrics
from marti.errors import InvalidArgumentError

__all__ = ["map_from_proto", "map_to_proto", "space_to_proto", "value_from_proto", "value_to_proto"]


def agent_specs(env: Any) -> list[pb.AgentSpec]:
    """Describe every possible agent of an env (role from ``env.role_of`` when present)."""
    inner = getattr(env, "env", env)
    roles = getattr(inner, "role_of", {}) or {}
    return [
        pb.AgentSpec(
            agent=a,
            role=roles.get(a, ""),
            observation_space=space_to_proto(env.observation_space(a)),
            action_space=space_to_proto(env.action_space(a)),
        )
        for a in env.possible_agents
    ]


def describe_to_proto(spec: Any) -> pb.EnvDescription:
    """Encode an :class:`~marti.env_registry.EnvSpec` (agents from its default config)."""
    fields = []
    for f in spec.schema.fields:
        cf = pb.ConfigField(
            name=f.name,
            type=f.type,
            default_value=value_to_proto(f.default),
            description=f.description,
            choices=[value_to_proto(c) for c in f.choices],
        )
        if f.minimum is not None:
            cf.minimum = float(f.minimum)
        if f.maximum is not None:
            cf.maximum = float(f.maximum)
        fields.append(cf)
    out = pb.EnvDescription(
        env_id=spec.env_id,
        name=spec.name,
        version=spec.version,
        description=spec.description,
        config_schema=fields,
    )
    try:
        env = spec.factory(spec.schema.validate(spec.example_config), 0)
    except Exception:  # noqa: BLE001 - a missing optional dependency must not break the listing
        return out
    out.agents.extend(agent_specs(env))
    out.metrics.extend(declared_metrics(env))
    env.close()
    return out


def actions_from_proto(actions: Any) -> dict[str, Any]:
    """Decode repeated :class:`AgentAction` into ``{agent: action}``.

    Raises:
        InvalidArgumentError: The same agent twice (named).
    """
    out: dict[str, Any] = {}
    for a in actions:
        if a.agent in out:
            raise InvalidArgumentError(f"two actions for agent {a.agent!r}")
        out[a.agent] = value_from_proto(a.action)
    return out


def actions_to_proto(actions: Mapping[str, Any]) -> list[pb.AgentAction]:
    """Encode ``{agent: action}``."""
    return [pb.AgentAction(agent=k, action=value_to_proto(v)) for k, v in actions.items()]


def _fill_results(out: Any, outcome: Any) -> None:
    as_json = infos_json({r.agent: r.info for r in outcome.results})
    if as_json is not None:
        out.infos_json = as_json
    for r in outcome.results:
        item = out.results.add(agent=r.agent, reward=r.reward, terminated=r.terminated, truncated=r.truncated)
        fill_value(item.observation, r.observation)
        if as_json is None:
            item.info.SetInParent()
            fill_map(item.info, r.info)


def step_to_proto(outcome: Any, out: pb.StepResponse | None = None) -> pb.StepResponse:
    """Encode a step outcome (into ``out`` when given, avoiding a copy)."""
    out = pb.StepResponse() if out is None else out
    _fill_results(out, outcome)
    out.agents.extend(outcome.agents)
    out.acting_agents.extend(outcome.acting_agents)
    return out


def reset_to_proto(outcome: Any, out: pb.ResetResponse | None = None) -> pb.ResetResponse:
    """Encode a reset outcome (into ``out`` when given)."""
    out = pb.ResetResponse() if out is None else out
    _fill_results(out, outcome)
    out.agents.extend(outcome.agents)
    out.acting_agents.extend(outcome.acting_agents)
    return out
