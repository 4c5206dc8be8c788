"""Typed clients of the experience store: ``ExperienceSharingClient`` (sync) and its async twin.

Agents call :meth:`share_experience` with their trajectory of an episode; trainers call :meth:`sample` or read
everything back with :meth:`get_trajectories` / :meth:`get_all_experiences`. Trajectories are serialized and
zstd-compressed here, on the client, so the server only stores and forwards bytes. Every gRPC error becomes the
matching :class:`marti.errors.MartiError` subclass.

Modules (the broker package's layout): :mod:`.types` (domain types), :mod:`.protocol` (argument checks, request
builders and response decoding shared by both clients), :mod:`.sync_client` and :mod:`.async_client`.
"""

from __future__ import annotations

from marti.types.experience import SampledTrajectory

from .async_client import AsyncExperienceSharingClient
from .protocol import MAX_ITEM_BYTES, MAX_TIMEOUT_S, SERVICE
from .sync_client import ExperienceSharingClient
from .types import Inserted, SampleBatch, StoredTrajectory, TableInfo

__all__ = [
    "MAX_ITEM_BYTES",
    "MAX_TIMEOUT_S",
    "SERVICE",
    "AsyncExperienceSharingClient",
    "ExperienceSharingClient",
    "Inserted",
    "SampleBatch",
    "SampledTrajectory",
    "StoredTrajectory",
    "TableInfo",
]
