"""Runtime settings of the trainer service (env prefix ``MARTI_TRAINER_``)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from marti.rpc.settings import ServerSettings


class TrainerSettings(ServerSettings):
    """Trainer service settings: server options plus the services its jobs use."""

    model_config = SettingsConfigDict(env_prefix="MARTI_TRAINER_", extra="ignore")

    port: int = Field(50054, ge=0, le=65535, description="TCP port; 0 asks the OS for a free one.")
    broker: str | None = Field(None, description="comm_broker host:port used by jobs.")
    env: str | None = Field(None, description="env_server host:port used by jobs.")
    store: str | None = Field(None, description="experience_store host:port used by jobs.")
    service_token: str | None = Field(None, description="Bearer token jobs send to the services.")
    max_concurrent_jobs: int = Field(1, gt=0, description="Most jobs running at once.")
    allow_user_code: bool = Field(
        False, description="Let submitted configs import user code (custom envs, workflow functions)."
    )
    stream_poll_s: float = Field(1.0, gt=0, description="StreamMetrics wake-up interval, seconds.")
