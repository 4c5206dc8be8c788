"""Runtime settings of the env server (env prefix ``MARTI_ENV_``)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from marti.rpc.settings import ServerSettings
from services.env_server.core.sessions import MAX_WORKERS

#: A module-name prefix: dotted identifiers, optionally ending in a dot (``pettingzoo.``, ``my_pkg.envs``).
_MODULE_PREFIX = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\.?", re.ASCII)


class EnvServerSettings(ServerSettings):
    """Env server settings: transport (inherited) plus session limits.

    Every field can be set as ``MARTI_ENV_<FIELD>``; the default port is 50052.
    """

    model_config = SettingsConfigDict(env_prefix="MARTI_ENV_", extra="ignore")

    port: int = Field(50052, ge=0, le=65535, description="TCP port; 0 asks the OS for a free one.")
    max_sessions: int = Field(
        1024, ge=1, description="Cap on concurrent sessions (RESOURCE_EXHAUSTED beyond)."
    )
    idle_timeout_s: float = Field(600.0, gt=0, description="Sessions unused this long are closed, seconds.")
    reap_interval_s: float = Field(5.0, gt=0, description="How often idle sessions are looked for, seconds.")
    idempotency_window: int = Field(64, ge=1, description="Recent request ids remembered per session.")
    idempotency_results: int = Field(
        1,
        ge=1,
        description="Of those, how many newest keep their whole outcome for a retry (older ids are refused with "
        "ALREADY_EXISTS rather than applied twice); at most idempotency_window.",
    )
    step_workers: int = Field(
        32,
        ge=1,
        le=MAX_WORKERS,
        description=f"Threads that run env calls (create, reset, step, close) off the event loop, 1..{MAX_WORKERS}; "
        "calls beyond wait in order.",
    )
    max_batch_steps: int = Field(4096, ge=1, description="Most steps in one BatchStep call.")
    allowed_modules: list[str] = Field(
        default_factory=lambda: ["pettingzoo.", "gymnasium."],
        description="Module prefixes adapter entry points may be imported from.",
    )

    @field_validator("allowed_modules")
    @classmethod
    def _module_prefixes(cls, value: list[str]) -> list[str]:
        """Each entry a module-name prefix (an empty one would allow every module, and a comma-separated string
        would be one prefix that allows none)."""
        for entry in value:
            if not _MODULE_PREFIX.fullmatch(entry):
                raise ValueError(
                    f"entry {entry!r} is not a module-name prefix such as 'pettingzoo.' or 'my_pkg.envs' (an empty "
                    "one would let clients import any module); give several as separate flag values "
                    '(--allowed-modules a. b.) or a JSON list (MARTI_ENV_ALLOWED_MODULES=\'["a.", "b."]\')'
                )
        return value
