"""Plain-data descriptions of registered envs (what ``ListEnvs`` and ``marti.list_envs`` return)."""

from __future__ import annotations

from typing import Any

import gymnasium

from marti.envs import declared_metrics
from services.env_server.core.registry import EnvSpec, Registry, default_registry


def describe_space(space: gymnasium.Space) -> str:
    """Return a short human-readable description of a space, e.g. ``Text(0..4096 printable chars)``."""
    if isinstance(space, gymnasium.spaces.Text):
        return f"Text({space.min_length}..{space.max_length} chars)"
    return str(space)


def describe_spec(spec: EnvSpec) -> dict[str, Any]:
    """Describe one env id.

    Returns:
        ``{"env_id", "name", "version", "description", "config_schema": [{"name", "type", "default",
        "description", "choices", "minimum", "maximum"}], "agents", "roles": {agent: role},
        "observation_spaces": {agent: str}, "action_spaces": {agent: str}, "metrics": [str]}``; agents, roles,
        spaces and metrics (the env's ``metadata["metrics"]``) are those of the example (or default) config,
        empty when that config cannot be built here.
    """
    fields = [
        {
            "name": f.name,
            "type": f.type,
            "default": f.default,
            "description": f.description,
            "choices": list(f.choices),
            "minimum": f.minimum,
            "maximum": f.maximum,
        }
        for f in spec.schema.fields
    ]
    out: dict[str, Any] = {
        "env_id": spec.env_id,
        "name": spec.name,
        "version": spec.version,
        "description": spec.description,
        "config_schema": fields,
        "agents": [],
        "roles": {},
        "observation_spaces": {},
        "action_spaces": {},
        "metrics": [],
    }
    try:
        env = spec.factory(spec.schema.validate(spec.example_config), 0)
    except Exception:  # noqa: BLE001 - an optional dependency may be missing; the listing still works
        return out
    agents = list(env.possible_agents)
    roles = getattr(env, "role_of", {})
    out.update(
        agents=agents,
        roles={a: roles.get(a, "") for a in agents},
        observation_spaces={a: describe_space(env.observation_space(a)) for a in agents},
        action_spaces={a: describe_space(env.action_space(a)) for a in agents},
        metrics=list(declared_metrics(env)),
    )
    env.close()
    return out


def describe_all(registry: Registry | None = None) -> list[dict[str, Any]]:
    """Describe every env id of ``registry`` (the default registry when ``None``), sorted by id."""
    return [describe_spec(s) for s in (registry or default_registry()).specs()]
