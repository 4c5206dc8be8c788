"""Async (asyncio / grpc.aio) twins of the SDK clients."""

from marti.clients.broker import AsyncMartiCommClient as MartiCommClient
from marti.clients.env import AsyncEnvClient as EnvClient
from marti.clients.env import AsyncEnvPool as EnvPool
from marti.clients.experience import AsyncExperienceSharingClient as ExperienceSharingClient
from marti.clients.inference import AsyncInferenceClient as InferenceClient
from marti.clients.inference import report_reward_async as report_reward
from marti.clients.trainer import AsyncTrainerClient as TrainerClient

__all__ = [
    "EnvClient",
    "EnvPool",
    "ExperienceSharingClient",
    "InferenceClient",
    "MartiCommClient",
    "TrainerClient",
    "report_reward",
]
