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
    info_delta,
    infos_json,
    map_from_proto,
    map_to_proto,
    space_to_proto,
    text_edit,
    value_from_proto,
    value_to_proto,
)
from marti.env.make import declared_metrics
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
    """Encode an :class:`~marti.env.registry.EnvSpec` (agents from its default config)."""
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


def _fill_results(out: Any, outcome: Any, base: Any = None) -> None:
    """Fill results and infos; with ``base`` (the outcome the client holds), agents of both are sent as deltas:
    a text observation as a ``TextEdit`` when it keeps enough of the base's, a JSON info as its changed keys."""
    infos = {r.agent: r.info for r in outcome.results}
    old = {r.agent: r for r in base.results} if base is not None else {}
    deltas: dict[str, dict[str, Any]] = {}
    for agent, info in infos.items():
        prev = old.get(agent)
        if prev is not None:
            d = info_delta(prev.info, info)
            if d is not None:
                deltas[agent] = d
    as_json = infos_json({**infos, **deltas}) if deltas else infos_json(infos)
    if as_json is not None:
        out.infos_json = as_json
    for r in outcome.results:
        item = out.results.add(agent=r.agent, reward=r.reward, terminated=r.terminated, truncated=r.truncated)
        prev = old.get(r.agent)
        obs = r.observation
        edit = (
            text_edit(prev.observation, obs)
            if prev is not None and type(obs) is str and type(prev.observation) is str
            else None
        )
        if edit is not None:
            e = item.observation_edit
            e.prefix, e.suffix, e.text = edit
        else:
            fill_value(item.observation, obs)
        if as_json is None:
            item.info.SetInParent()
            fill_map(item.info, r.info)
        elif r.agent in deltas:
            item.info_delta = True


def step_to_proto(outcome: Any, out: pb.StepResponse | None = None, base: Any = None) -> pb.StepResponse:
    """Encode a step outcome (into ``out`` when given, avoiding a copy), as a delta against ``base`` (the
    session's previous outcome, which the client said it holds) when given."""
    out = pb.StepResponse() if out is None else out
    _fill_results(out, outcome, base)
    out.agents.extend(outcome.agents)
    out.acting_agents.extend(outcome.acting_agents)
    out.result_id = outcome.result_id
    if base is not None:
        out.delta_base = base.result_id
    return out


def reset_to_proto(outcome: Any, out: pb.ResetResponse | None = None) -> pb.ResetResponse:
    """Encode a reset outcome (into ``out`` when given); always in full."""
    out = pb.ResetResponse() if out is None else out
    _fill_results(out, outcome)
    out.agents.extend(outcome.agents)
    out.acting_agents.extend(outcome.acting_agents)
    out.result_id = outcome.result_id
    return out
