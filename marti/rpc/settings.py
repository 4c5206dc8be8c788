"""Typed runtime settings shared by every marti server (pydantic-settings, env prefix ``MARTI_``)."""

from __future__ import annotations

import os

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: Default largest message a server accepts or sends, in bytes (64 MiB). Client and server use the same value.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class ServerSettings(BaseSettings):
    """Settings every gRPC server understands.

    Each service subclasses this with its own env prefix (``MARTI_BROKER_``, ``MARTI_ENV_``,
    ``MARTI_STORE_``, ``MARTI_TRAINER_``) and its own limits. Values come from keyword arguments, then
    environment variables, then these defaults.
    """

    model_config = SettingsConfigDict(env_prefix="MARTI_", extra="ignore")

    host: str = Field("127.0.0.1", description="Interface to bind; 0.0.0.0 for all interfaces.")
    port: int = Field(0, ge=0, le=65535, description="TCP port; 0 asks the OS for a free one.")
    grace_s: float = Field(5.0, ge=0, description="Seconds in-flight calls may finish after SIGTERM.")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Prometheus HTTP port; None = off.")
    token: str | None = Field(None, description="Bearer token required on every call when set.")
    tls_cert_file: str | None = Field(None, description="PEM server certificate; enables TLS with key file.")
    tls_key_file: str | None = Field(None, description="PEM private key of the server certificate.")
    tls_client_ca_file: str | None = Field(
        None, description="PEM CA; when set clients must present a cert (mTLS)."
    )
    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES, gt=0, description="Largest message received or sent, bytes."
    )
    max_concurrent_rpcs: int | None = Field(None, gt=0, description="Cap on concurrently served rpcs.")
    keepalive_time_ms: int = Field(30_000, gt=0, description="Interval between keepalive pings, ms.")
    keepalive_timeout_ms: int = Field(
        10_000, gt=0, description="Wait for a keepalive ack before closing, ms."
    )
    log_level: str = Field("INFO", description="Python logging level of the service.")

    @model_validator(mode="after")
    def _shared_token(self) -> ServerSettings:
        """Fall back to ``MARTI_TOKEN`` (shared by every service) when no service-specific token is set."""
        if self.token is None and os.environ.get("MARTI_TOKEN"):
            self.token = os.environ["MARTI_TOKEN"]
        return self
