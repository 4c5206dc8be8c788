"""Test helpers for envs of a user's own: a two-agent text env base and an env server on port 0 serving a
registry of such envs (real gRPC, in a thread)."""

from __future__ import annotations

import string
from collections.abc import Iterator
from contextlib import contextmanager

import gymnasium
from pettingzoo import ParallelEnv

from marti.env.registry import Registry
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
