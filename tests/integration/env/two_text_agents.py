"""Test helpers for envs of a user's own: a two-agent text env base and an env server on port 0 serving a
registry of such envs (real gRPC, in a thread)."""

from __future__ import annotations

import string
from collections.abc import Iterator
from contextlib import contextmanager

import gymnasium
from pettingzoo import ParallelEnv

from marti.env.config import ConfigField, ConfigSchema
from marti.env.registry import EnvSpec, Registry
from marti.rpc.testing import serve_in_thread
from services.env_server.core.sessions import SessionManager
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings


class TwoTextAgents(ParallelEnv):
    """Agents ``a`` and ``b`` with text spaces of up to ``max_chars`` characters; ``reset`` observes ``"x"``.
    Subclasses write ``step``."""

    metadata = {"name": "two_text_agents"}
    max_chars = 64

    def __init__(self, config: dict, seed: int | None = None) -> None:
        self.config = config
        self.possible_agents = ["a", "b"]
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> gymnasium.Space:
        """A ``Text`` of at most ``max_chars`` characters."""
        return gymnasium.spaces.Text(self.max_chars, min_length=0, charset=string.printable)

    def action_space(self, agent: str) -> gymnasium.Space:
        """A ``Text`` of at most 64 characters."""
        return gymnasium.spaces.Text(64, min_length=0, charset=string.printable)

    def reset(self, seed=None, options=None):
        """Both agents live, each observing ``"x"``."""
        self.agents = list(self.possible_agents)
        return {a: "x" for a in self.agents}, {a: {} for a in self.agents}


@contextmanager
def serve_registry(registry: Registry, **settings: object) -> Iterator[str]:
    """An env server on a free loopback port serving ``registry`` (``settings``: ``EnvServerSettings`` fields);
    yields its address."""
    server_settings = EnvServerSettings(port=0, **settings)
    sessions = SessionManager(registry, max_sessions=64, idle_timeout_s=600.0)
    with serve_in_thread(
        lambda: [env_service(server_settings, sessions=sessions)], server_settings
    ) as server:
        yield server.address


class EchoSized(TwoTextAgents):
    """Each step observes ``"x" * big`` (for each agent) when an action says ``big``, else ``"ok"``; a reset with
    the option ``big`` observes ``"x" * big`` too. Subclasses set ``big`` (characters)."""

    big = 1

    def step(self, actions):
        """Observations of ``big`` characters when an action says ``big``; no reward, nobody done."""
        text = "x" * self.big if "big" in actions.values() else "ok"
        live = self.agents
        return ({a: text for a in live}, {a: 0.0 for a in live}, {a: False for a in live},
                {a: False for a in live}, {a: {} for a in live})  # fmt: skip

    def reset(self, seed=None, options=None):
        """As :class:`TwoTextAgents`, or observations of ``big`` characters with the option ``big``."""
        obs, infos = super().reset(seed, options)
        return ({a: "x" * self.big for a in obs} if (options or {}).get("big") else obs), infos


@contextmanager
def serve_echo(env_id: str, big: int, **settings: object) -> Iterator[str]:
    """An env server (:func:`serve_registry`, ``settings`` as there) of one env ``env_id``: an
    :class:`EchoSized` whose big observations are ``big`` characters; yields its address."""
    env = type("Echo", (EchoSized,), {"big": big, "max_chars": 4 * big})
    registry = Registry()
    schema = ConfigSchema((ConfigField("max_action_chars", "int", 64, "longest action"),))
    registry.register(EnvSpec(env_id, 1, env, schema, "observations of a chosen size"))
    with serve_registry(registry, **settings) as address:
        yield address
