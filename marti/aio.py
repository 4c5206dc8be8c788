"""Async (asyncio / grpc.aio) twins of the SDK clients."""

from marti.clients.broker import AsyncMartiCommClient as MartiCommClient
from marti.clients.env import AsyncEnvClient as EnvClient
from marti.clients.experience import AsyncExperienceSharingClient as ExperienceSharingClient

__all__ = ["EnvClient", "ExperienceSharingClient", "MartiCommClient"]
