"""marti-agent: open infrastructure for training teams of LLM agents with reinforcement learning.

The SDK entry points (imported lazily, so ``import marti`` stays light)::

    env = marti.make("collaborative_task_solving", scenario="resource_allocation", address="localhost:50052")
    comm = marti.MartiCommClient(agent_id="agent_1", address="localhost:50051", session="episode-7")
    store = marti.ExperienceSharingClient(agent_id="agent_1", address="localhost:50053")
    llm = marti.InferenceClient(gateway)  # gateway: host:port of the job's inference gateway (gRPC)
    out = llm.generate("agent_1", [{"role": "user", "content": "hi"}], episode_id="ep-1")
    marti.report_reward(gateway, "ep-1", {"agent_1": 1.0})

Async twins live in :mod:`marti.aio`.
"""

from __future__ import annotations

import importlib
from typing import Any

# Fork: gRPC's own fork handlers (on by default in its C core) stay on, so a program that makes rpcs, then
# forks workers (multiprocessing's default on Linux) can keep calling the services from the children; the
# SDK's aio channels are re-made in a child (marti.rpc.client.transport). A process that forks while other threads
# are inside gRPC and only execs in the child (the trainer service starting Ray) sets
# GRPC_ENABLE_FORK_SUPPORT=false itself, before its first channel or server.

__version__ = "0.1.0"

_LAZY = {
    "make": ("marti.env.make", "make"),
    "list_envs": ("marti.env.make", "list_envs"),
    "MartiCommClient": ("marti.clients.broker", "MartiCommClient"),
    "ExperienceSharingClient": ("marti.clients.experience", "ExperienceSharingClient"),
    "InferenceClient": ("marti.clients.inference", "InferenceClient"),
    "report_reward": ("marti.clients.inference", "report_reward"),
    "TrainerClient": ("marti.clients.trainer", "TrainerClient"),
    "Trajectory": ("marti.types.trajectory", "Trajectory"),
    "Turn": ("marti.types.trajectory", "Turn"),
    "load_config": ("marti.config", "load_config"),
}

#: Modules reached as attributes of ``marti`` after ``import marti`` (``marti.aio.EnvPool``): name -> module.
_LAZY_MODULES = {"aio": "marti.aio", "workflow": "marti.team.workflow", "gym_view": "marti.env.gym_view"}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    """Import SDK names on first use (PEP 562)."""
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    if name in _LAZY_MODULES:
        return importlib.import_module(_LAZY_MODULES[name])
    raise AttributeError(f"module 'marti' has no attribute {name!r}")
