"""Typed clients of the trainer service (``marti.api.trainer.v1.TrainerService``).

:class:`TrainerClient` (sync, ``marti.TrainerClient``) and :class:`AsyncTrainerClient` (``marti.aio``) submit
training jobs, read their state and metrics, stop them and save checkpoints. They return the domain types
:class:`JobInfo` and :class:`MetricsRecord` and raise :class:`marti.errors.MartiError` subclasses. The token
is read from ``MARTI_TRAINER_TOKEN``, then ``MARTI_TOKEN``, when not given.

Modules (the broker package's layout): :mod:`.types` (domain types), :mod:`.protocol` (service names, the
clients' shared constructor, requests and response decoding), :mod:`.sync_client` and :mod:`.async_client`.
"""

from __future__ import annotations

from .async_client import AsyncTrainerClient
from .protocol import SERVICE
from .sync_client import TrainerClient
from .types import TERMINAL_STATES, JobInfo, MetricsRecord

__all__ = ["SERVICE", "TERMINAL_STATES", "AsyncTrainerClient", "JobInfo", "MetricsRecord", "TrainerClient"]
