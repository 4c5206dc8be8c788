"""marti-agent: open infrastructure for training teams of LLM agents with reinforcement learning.

The SDK entry points (imported lazily, so ``import marti`` stays light)::

    env = marti.make("collaborative_task_solving", scenario="resource_allocation", address="localhost:50052")
    comm = marti.MartiCommClient(agent_id="agent_1", address="localhost:50051", session="episode-7")
    store = marti.ExperienceSharingClient(agent_id="agent_1", address="localhost:50053")

Async twins live in :mod:`marti.aio`.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "make": ("marti.envs", "make"),
    "list_envs": ("marti.envs", "list_envs"),
    "MartiCommClient": ("marti.clients.broker", "MartiCommClient"),
    "ExperienceSharingClient": ("marti.clients.experience", "ExperienceSharingClient"),
    "Trajectory": ("marti.trajectory", "Trajectory"),
    "Turn": ("marti.trajectory", "Turn"),
    "load_config": ("marti.config", "load_config"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    """Import SDK names on first use (PEP 562)."""
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    if name in ("aio", "workflow", "gym_view"):
        return importlib.import_module(f"marti.{name}")
    raise AttributeError(f"module 'marti' has no attribute {name!r}")
