"""Registry of versioned environment ids and the factories that build a fresh instance per session.

Ids are ``name-vN`` (``collaborative_task_solving-v1``); the bare ``name`` resolves to the highest version.
A factory is a class or function ``factory(config: dict, seed: int | None) -> ParallelEnv``; the registry never
hands out a shared instance.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pettingzoo import ParallelEnv

from marti.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError
from services.env_server.core.config import ConfigSchema
from services.env_server.core.guard import DEFAULT_MAX_ACTION_CHARS, GuardedParallelEnv

_ID_RE = re.compile(r"^(?P<name>[A-Za-z0-9_./]+?)(?:-v(?P<version>\d+))?$")


@dataclass(frozen=True)
class EnvSpec:
    """A registered environment.

    Args:
        name: Env name without version, e.g. ``collaborative_task_solving``.
        version: Integer version; the id is ``f"{name}-v{version}"``.
        factory: ``factory(config, seed) -> ParallelEnv`` building a fresh instance.
        schema: The config keys the env accepts.
        description: One paragraph for ``ListEnvs`` and docs.
        example_config: Config used to describe agents and spaces in listings (defaults when empty).
    """

    name: str
    version: int
    factory: Callable[[dict[str, Any], int | None], ParallelEnv]
    schema: ConfigSchema
    description: str
    example_config: Mapping[str, Any] | None = None

    @property
    def env_id(self) -> str:
        """``name-vN``."""
        return f"{self.name}-v{self.version}"


class Registry:
    """Versioned env ids -> :class:`EnvSpec`."""

    def __init__(self) -> None:
        self._specs: dict[tuple[str, int], EnvSpec] = {}

    def register(self, spec: EnvSpec) -> None:
        """Add ``spec``.

        Raises:
            AlreadyExistsError: The id is taken.
        """
        key = (spec.name, spec.version)
        if key in self._specs:
            raise AlreadyExistsError(f"env id {spec.env_id!r} is already registered")
        self._specs[key] = spec

    def resolve(self, env_id: str) -> EnvSpec:
        """Find the spec for ``name-vN`` or bare ``name`` (highest version).

        Raises:
            NotFoundError: Unknown id; the message names it and lists the known ids.
        """
        m = _ID_RE.match(env_id or "")
        if m:
            name, version = m.group("name"), m.group("version")
            if version is not None and (name, int(version)) in self._specs:
                return self._specs[(name, int(version))]
            if version is None:
                versions = [v for (n, v) in self._specs if n == env_id]
                if versions:
                    return self._specs[(env_id, max(versions))]
        known = ", ".join(sorted(s.env_id for s in self._specs.values()))
        raise NotFoundError(f"unknown env id {env_id!r} (known: {known})")

    def specs(self) -> list[EnvSpec]:
        """All specs, sorted by id."""
        return sorted(self._specs.values(), key=lambda s: s.env_id)

    def make(
        self, env_id: str, config: Mapping[str, Any] | None = None, seed: int | None = None
    ) -> GuardedParallelEnv:
        """Build a fresh, guarded instance.

        Args:
            env_id: ``name-vN`` or ``name``.
            config: Env config; validated against the spec's schema (unknown keys are errors).
            seed: Seed of the first ``reset`` without a seed.

        Returns:
            A :class:`GuardedParallelEnv` around a new instance.

        Raises:
            NotFoundError: Unknown env id.
            InvalidArgumentError: Bad config (the message names the key) or seed.
        """
        spec = self.resolve(env_id)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InvalidArgumentError(f"seed must be an int or None, got {seed!r}")
        full = spec.schema.validate(config)
        env = spec.factory(full, seed)
        return GuardedParallelEnv(env, int(full.get("max_action_chars") or DEFAULT_MAX_ACTION_CHARS))


_DEFAULT: Registry | None = None


def default_registry() -> Registry:
    """Return the process-wide registry holding the built-in envs and adapters (built on first use)."""
    global _DEFAULT
    if _DEFAULT is None:
        from services.env_server.envs.builtin import register_builtins

        reg = Registry()
        register_builtins(reg)
        _DEFAULT = reg
    return _DEFAULT
