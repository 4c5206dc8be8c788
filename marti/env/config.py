"""Typed config schemas for environments: defaults, type checks, ranges and unknown-key errors.

Every registered environment declares its config keys once as a :class:`ConfigSchema`; the same schema validates
configs for in-process and remote environments and is listed over gRPC, so agent code in any language can see
which keys exist, their types, defaults and limits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marti.errors import InvalidArgumentError, UnknownConfigKeyError

_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "list": (list, tuple),
    "dict": (dict,),
}


@dataclass(frozen=True)
class ConfigField:
    """One config key of an environment.

    Args:
        name: The key, e.g. ``"max_turns"``.
        type: One of ``int``, ``float``, ``str``, ``bool``, ``list``, ``dict``.
        default: Value used when the key is absent or given as ``None`` (a ``None`` default means "no value";
            allowed for any type).
        description: One line for docs and ``ListEnvs``.
        choices: Allowed values for ``str`` (or ``int``) keys; empty means any.
        minimum: Inclusive lower bound for numbers; ``None`` means unbounded.
        maximum: Inclusive upper bound for numbers; ``None`` means unbounded.
    """

    name: str
    type: str
    default: Any
    description: str
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None

    def check(self, value: Any) -> Any:
        """Validate and normalise one value.

        Args:
            value: The caller's value for this key.

        Returns:
            The value, with integral floats turned into ``int`` for ``int`` keys and ints into ``float`` for
            ``float`` keys, and tuples into lists.

        Raises:
            InvalidArgumentError: Wrong type, not one of ``choices``, or outside ``[minimum, maximum]``; the
                message names the key, the value and the limit.
        """
        if value is None:
            return None
        if self.type == "int" and isinstance(value, float) and value.is_integer():
            value = int(value)
        allowed = _TYPES[self.type]
        if isinstance(value, bool) and self.type != "bool" or not isinstance(value, allowed):
            raise InvalidArgumentError(
                f"config key {self.name!r} must be of type {self.type}, got {type(value).__name__} {value!r}"
            )
        if self.type == "float":
            value = float(value)
        if self.type == "list":
            value = list(value)
        if self.choices and value not in self.choices:
            raise InvalidArgumentError(
                f"config key {self.name!r} must be one of {list(self.choices)}, got {value!r}"
            )
        if self.minimum is not None and value < self.minimum:
            raise InvalidArgumentError(f"config key {self.name!r} must be >= {self.minimum}, got {value!r}")
        if self.maximum is not None and value > self.maximum:
            raise InvalidArgumentError(f"config key {self.name!r} must be <= {self.maximum}, got {value!r}")
        return value


@dataclass(frozen=True)
class ConfigSchema:
    """The set of config keys an environment accepts.

    Args:
        fields: The keys, in documentation order.
    """

    fields: tuple[ConfigField, ...] = field(default_factory=tuple)

    def names(self) -> list[str]:
        """Return the key names in declaration order."""
        return [f.name for f in self.fields]

    def defaults(self) -> dict[str, Any]:
        """Return ``{key: default}`` for every key."""
        return {f.name: f.default for f in self.fields}

    def validate(self, config: Mapping[str, Any] | None) -> dict[str, Any]:
        """Check a caller's config and fill in defaults.

        Args:
            config: Keys and values from the caller; may be ``None`` or empty.

        Returns:
            A new dict holding every key of the schema; a key given as ``None`` gets its default (``max_turns=None``
            is ``max_turns=12``, as if it were left out).

        Raises:
            UnknownConfigKeyError: A key the schema does not know (an ``InvalidArgumentError``; the message names
                it and lists the known keys, ``metadata["config_key"]`` is the key).
            InvalidArgumentError: A value that fails :meth:`ConfigField.check`.
        """
        config = dict(config or {})
        by_name = {f.name: f for f in self.fields}
        unknown = sorted(k for k in config if k not in by_name)
        if unknown:
            raise UnknownConfigKeyError(
                f"unknown config key {unknown[0]!r} (known keys: {', '.join(sorted(by_name))})",
                key=unknown[0],
            )
        out = self.defaults()
        for key, value in config.items():
            if value is not None:
                out[key] = by_name[key].check(value)
        return out

    def extend(self, extra: Sequence[ConfigField]) -> ConfigSchema:
        """Return a schema with ``extra`` fields appended (same-named fields are replaced)."""
        names = {f.name for f in extra}
        return ConfigSchema(tuple(f for f in self.fields if f.name not in names) + tuple(extra))
