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
import os
from typing import Any

# gRPC's C core installs fork handlers by default. marti processes fork only to exec (Ray's head and
# workers, the local stack), and Ray forks with a ``preexec_fn`` while gRPC threads are busy; gRPC's
# handlers then skip or abort in the child ("Other threads are currently calling into gRPC, skipping fork()
# handlers"), which failed jobs started from inside the trainer service. No marti child uses gRPC before
# exec, so the handlers are switched off (an explicit setting by the user wins). Read when gRPC starts, so
# this module must be imported before the first channel or server is created.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.1.0"

_LAZY = {
    "make": ("marti.envs", "make"),
    "list_envs": ("marti.envs", "list_envs"),
    "MartiCommClient": ("marti.clients.broker", "MartiCommClient"),
    "ExperienceSharingClient": ("marti.clients.experience", "ExperienceSharingClient"),
    "InferenceClient": ("marti.clients.inference", "InferenceClient"),
    "report_reward": ("marti.clients.inference", "report_reward"),
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
