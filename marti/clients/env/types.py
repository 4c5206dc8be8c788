"""Domain types of the env SDK: a session's agents, a created session, a decoded step result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium


@dataclass(frozen=True)
class AgentInfo:
    """An agent of a session.

    Args:
        agent: Agent id.
        role: Role name, or ``""``.
        observation_space: Its gymnasium observation space.
        action_space: Its gymnasium action space.
    """

    agent: str
    role: str
    observation_space: gymnasium.Space
    action_space: gymnasium.Space


@dataclass(frozen=True)
class SessionInfo:
    """A created session.

    Args:
        session_id: Opaque id.
        env_id: Resolved ``name-vN``.
        agents: Every possible agent, in order.
        idle_timeout_ms: The server closes the session after this long unused, milliseconds.
        metrics: Names of the episode metrics the env reports in its infos (its ``metadata["metrics"]``).
    """

    session_id: str
    env_id: str
    agents: tuple[AgentInfo, ...]
    idle_timeout_ms: int
    metrics: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepResult:
    """Decoded reset or step result (PettingZoo dicts keyed by agent).

    Args:
        observations: Agent -> observation.
        rewards: Agent -> reward (0.0 after a reset).
        terminations: Agent -> terminated.
        truncations: Agent -> truncated.
        infos: Agent -> info dict.
        agents: Live agents afterwards.
        acting_agents: Agents whose action the next step reads.
    """

    observations: dict[str, Any]
    rewards: dict[str, float]
    terminations: dict[str, bool]
    truncations: dict[str, bool]
    infos: dict[str, dict[str, Any]]
    agents: list[str]
    acting_agents: list[str]

    def as_tuple(self) -> tuple[dict, dict, dict, dict, dict]:
        """PettingZoo step tuple ``(observations, rewards, terminations, truncations, infos)``."""
        return self.observations, self.rewards, self.terminations, self.truncations, self.infos


@dataclass(frozen=True)
class EnvServerInfo:
    """What an env server offers and how full it is (one ``ListEnvs`` answer).

    Args:
        envs: One dict per env id (as :meth:`~.sync_client.EnvClient.list_envs` returns them).
        live_sessions: Sessions open on the server now; ``None`` when the server does not say.
        max_sessions: The server's session cap; ``None`` when the server does not say.
    """

    envs: list[dict[str, Any]]
    live_sessions: int | None
    max_sessions: int | None
