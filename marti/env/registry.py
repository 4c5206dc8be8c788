"""Registry of versioned environment ids, the lazy table of where envs live, and their plain-data descriptions.

Ids are ``name-vN`` (``collaborative_task_solving-v1``); the bare ``name`` resolves to the highest version.
A factory is a class or function ``factory(config: dict, seed: int | None) -> ParallelEnv``; the registry never
hands out a shared instance, and every instance is wrapped in :class:`marti.env.guard.GuardedParallelEnv`.

Layering: this module is the one registry used by the in-process path (``marti.make`` without an address) and
by the env server, and it imports no environment and nothing of ``services``. Envs are found through
*providers*: a provider is a ``"module:function"`` string, where ``function(registry)`` registers the env
name(s) it owns (and every version of them). A registry maps each env name to its provider and imports the
provider's module (:func:`marti.plumbing.loader.load_attr`) only when that name is first resolved (``make``,
``resolve``) or when every env is listed (``specs``, ``describe_all``). Every env, built-in or not, is declared
in the ``marti.envs`` entry-point group (entry name = env name, value = provider), read with
:func:`importlib.metadata.entry_points`: the built-in envs live in the env server's env library
(``services/env_server/envs/``, outside its core) and are declared in this package's ``pyproject.toml``, so
the SDK names no ``services`` module; other installed packages add theirs the same way, e.g.::

    [project.entry-points."marti.envs"]
    my_game = "my_pkg.envs:register"
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from typing import Any

import gymnasium
from pettingzoo import ParallelEnv

from marti.env.config import ConfigSchema
from marti.env.guard import (
    DEFAULT_MAX_ACTION_CHARS,
    GuardedParallelEnv,
    check_env_id,
    check_seed,
    declared_metrics,
)
from marti.errors import AlreadyExistsError, NotFoundError
from marti.plumbing.loader import load_attr

_LOG = logging.getLogger(__name__)
_ID_RE = re.compile(r"^(?P<name>[A-Za-z0-9_./]+?)(?:-v(?P<version>\d+))?$")

#: Entry-point group through which installed packages add envs (entry name = env name, value = provider).
ENTRY_POINT_GROUP = "marti.envs"

#: The distribution whose ``marti.envs`` entry points are the built-in envs (this package, ``marti-agent``): its
#: entries win a name clash with another package's.
BUILTIN_DISTRIBUTION = "marti-agent"


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


def load_provider(target: str) -> Callable[[Registry], None]:
    """Import a provider given as ``"module:function"`` (through :func:`marti.plumbing.loader.load_attr`).

    Args:
        target: ``"package.module:function"``.

    Returns:
        The function, ``function(registry)``.

    Raises:
        InvalidArgumentError: ``target`` is not ``module:function``.
        NotFoundError: The module or function does not exist (named).
    """
    return load_attr(target, what="env provider", form="'module:function'")


class Registry:
    """Versioned env ids -> :class:`EnvSpec`, filled directly or lazily from providers.

    Args:
        providers: Env name -> provider (``"module:function"``) loaded on first use of that name.
    """

    def __init__(self, providers: Mapping[str, str] | None = None) -> None:
        self._specs: dict[tuple[str, int], EnvSpec] = {}
        self._providers: dict[str, str] = dict(providers or {})
        self._loaded: set[str] = set()
        self._failed: dict[str, Exception] = {}

    def register(self, spec: EnvSpec) -> None:
        """Add ``spec``.

        Raises:
            AlreadyExistsError: The id is taken.
        """
        key = (spec.name, spec.version)
        if key in self._specs:
            raise AlreadyExistsError(f"env id {spec.env_id!r} is already registered")
        self._specs[key] = spec

    def add_provider(self, name: str, target: str) -> None:
        """Name the provider (``"module:function"``) that registers env ``name``; it is imported on first use.

        Raises:
            AlreadyExistsError: ``name`` already has a different provider.
        """
        known = self._providers.get(name)
        if known is not None and known != target:
            raise AlreadyExistsError(f"env name {name!r} is already provided by {known!r}")
        self._providers[name] = target

    def providers(self) -> dict[str, str]:
        """Env name -> provider, as configured (loaded or not)."""
        return dict(self._providers)

    def _load(self, target: str) -> None:
        """Run provider ``target`` once; a provider that fails is remembered with its error and not run again.

        Raises:
            Exception: Whatever importing or running the provider raised (its first run only).
        """
        if target in self._loaded:
            return
        self._loaded.add(target)
        try:
            load_provider(target)(self)
        except Exception as exc:  # noqa: BLE001 - a provider is another package's code: any error is remembered
            self._failed[target] = exc
            raise

    def _load_name(self, name: str) -> None:
        """Load the provider of env ``name`` (if it has one).

        Raises:
            NotFoundError: The provider cannot be imported or raised when run, now or on an earlier use or
                listing; the message names the env, the provider and the error.
        """
        target = self._providers.get(name)
        if target is None:
            return
        with contextlib.suppress(Exception):
            self._load(target)
        exc = self._failed.get(target)
        if exc is not None:
            raise NotFoundError(
                f"env {name!r} is provided by {target!r}, which cannot be loaded: {type(exc).__name__}: {exc}"
            ) from exc

    def resolve(self, env_id: str) -> EnvSpec:
        """Find the spec for ``name-vN`` or bare ``name`` (highest version), loading its provider first.

        Raises:
            NotFoundError: Unknown id (the message names it, lists the known ids and, when the name has a
                provider, says that it registered no such env), or the name's provider cannot be loaded (named
                with its error, on every call: not only the first).
        """
        m = _ID_RE.match(env_id or "")
        if m:
            name, version = m.group("name"), m.group("version")
            self._load_name(name)
            if version is not None and (name, int(version)) in self._specs:
                return self._specs[(name, int(version))]
            if version is None:
                versions = [v for (n, v) in self._specs if n == env_id]
                if versions:
                    return self._specs[(env_id, max(versions))]
        known = ", ".join(sorted({s.env_id for s in self.specs()}))
        target = self._providers.get(m.group("name")) if m else None
        hint = f"; its provider {target!r} registered no such version or name" if target else ""
        raise NotFoundError(f"unknown env id {env_id!r}{hint} (known: {known})")

    def specs(self) -> list[EnvSpec]:
        """All specs, sorted by id (every provider is loaded; one that cannot be is skipped with a warning)."""
        for target in sorted(set(self._providers.values())):
            try:
                self._load(target)
            except Exception as exc:  # noqa: BLE001 - one broken provider must not hide the other envs
                _LOG.warning("env provider %s cannot be loaded: %s: %s", target, type(exc).__name__, exc)
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
            InvalidArgumentError: ``env_id`` not a string, a seed that is not an int64 (checked first, as the
                remote client does before any rpc), or bad config (the message names the key).
        """
        check_env_id(env_id)
        seed = check_seed(seed)
        spec = self.resolve(env_id)
        full = spec.schema.validate(config)
        env = spec.factory(full, seed)
        return GuardedParallelEnv(
            env, int(full.get("max_action_chars") or DEFAULT_MAX_ACTION_CHARS), env_id=spec.env_id
        )


def entry_point_providers() -> dict[str, str]:
    """Env name -> provider declared in the :data:`ENTRY_POINT_GROUP` group by the installed packages: the
    built-in envs (:data:`BUILTIN_DISTRIBUTION`'s entries, see ``pyproject.toml``) and any other package's. A
    built-in name is never replaced by another package's entry of the same name. Unreadable package metadata
    is logged and yields ``{}``."""
    try:
        eps = list(importlib_metadata.entry_points(group=ENTRY_POINT_GROUP))
    except Exception:  # noqa: BLE001 - broken package metadata must not break the process
        _LOG.warning("cannot read the %s entry points", ENTRY_POINT_GROUP, exc_info=True)
        return {}
    eps.sort(key=lambda ep: _distribution(ep) == BUILTIN_DISTRIBUTION)  # the built-ins last: they win
    return {ep.name: ep.value for ep in eps}


def _distribution(ep: importlib_metadata.EntryPoint) -> str | None:
    """The name of the distribution that declares ``ep`` (None when unknown)."""
    dist = getattr(ep, "dist", None)
    return getattr(dist, "name", None)


_DEFAULT: Registry | None = None


def default_registry() -> Registry:
    """The process-wide registry of the ``marti.envs`` entry points (:func:`entry_point_providers`: the built-in
    envs and installed packages' envs). Built on first use; no env module is imported until used."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Registry(entry_point_providers())
    return _DEFAULT


def describe_space(space: gymnasium.Space) -> str:
    """Return a short human-readable description of a space, e.g. ``Text(0..4096 chars)``."""
    if isinstance(space, gymnasium.spaces.Text):
        return f"Text({space.min_length}..{space.max_length} chars)"
    return str(space)


def describe_spec(spec: EnvSpec) -> dict[str, Any]:
    """Describe one env id.

    Returns:
        ``{"env_id", "name", "version", "description", "config_schema": [{"name", "type", "default",
        "description", "choices", "minimum", "maximum"}], "agents", "roles": {agent: role},
        "observation_spaces": {agent: str}, "action_spaces": {agent: str}, "metrics": [str]}``; agents, roles,
        spaces and metrics (the env's ``metadata["metrics"]``) are those of the example (or default) config,
        empty when that config cannot be built here.
    """
    fields = [
        {
            "name": f.name,
            "type": f.type,
            "default": f.default,
            "description": f.description,
            "choices": list(f.choices),
            "minimum": f.minimum,
            "maximum": f.maximum,
        }
        for f in spec.schema.fields
    ]
    out: dict[str, Any] = {
        "env_id": spec.env_id,
        "name": spec.name,
        "version": spec.version,
        "description": spec.description,
        "config_schema": fields,
        "agents": [],
        "roles": {},
        "observation_spaces": {},
        "action_spaces": {},
        "metrics": [],
    }
    try:
        env = spec.factory(spec.schema.validate(spec.example_config), 0)
    except Exception:  # noqa: BLE001 - an optional dependency may be missing; the listing still works
        return out
    agents = list(env.possible_agents)
    roles = getattr(env, "role_of", {})
    out.update(
        agents=agents,
        roles={a: roles.get(a, "") for a in agents},
        observation_spaces={a: describe_space(env.observation_space(a)) for a in agents},
        action_spaces={a: describe_space(env.action_space(a)) for a in agents},
        metrics=list(declared_metrics(env)),
    )
    env.close()
    return out


def describe_all(registry: Registry | None = None) -> list[dict[str, Any]]:
    """Describe every env id of ``registry`` (the default registry when ``None``), sorted by id."""
    return [describe_spec(s) for s in (registry or default_registry()).specs()]


__all__ = [
    "BUILTIN_DISTRIBUTION",
    "ENTRY_POINT_GROUP",
    "EnvSpec",
    "Registry",
    "default_registry",
    "describe_all",
    "describe_space",
    "describe_spec",
    "entry_point_providers",
    "load_provider",
]
