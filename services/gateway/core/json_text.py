"""Strict JSON reading for the gateway: JSON has no NaN or Infinity, so a text holding one (``NaN``,
``Infinity``, ``-Infinity``, or a number beyond the float range such as ``1e999``, which Python reads as
infinity) is refused rather than read as a float that no JSON response could carry."""

from __future__ import annotations

import json
import math
from typing import Any


class NonFiniteNumberError(ValueError):
    """A JSON text holds a number that is not finite (``NaN``, ``Infinity``, ``-Infinity``, ``1e999``).

    Attributes:
        token: The offending text as written (``"NaN"``, ``"1e999"``).
    """

    def __init__(self, token: str) -> None:
        super().__init__(f"{token} is not a finite number (JSON has no NaN or Infinity)")
        self.token = token


def _refuse_constant(token: str) -> Any:
    """``parse_constant`` of :func:`loads_finite`: every constant the stdlib offers is non-finite."""
    raise NonFiniteNumberError(token)


def _finite_float(token: str) -> float:
    """``parse_float`` of :func:`loads_finite`: the float of ``token``, refused when it overflows to infinity."""
    value = float(token)
    if not math.isfinite(value):
        raise NonFiniteNumberError(token)
    return value


def loads_finite(text: str | bytes) -> Any:
    """``json.loads(text)``, refusing non-finite numbers.

    Raises:
        json.JSONDecodeError: ``text`` is not JSON.
        NonFiniteNumberError: ``text`` holds ``NaN``, ``Infinity``, ``-Infinity`` or a number beyond the
            float range (a ``ValueError``, as a malformed text's error is).
    """
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


def non_finite_path(value: Any, where: str = "") -> str | None:
    """Where the first non-finite float of a parsed JSON ``value`` is, as a request field path
    (``tools[0].parameters.x``; ``where`` is the path of ``value`` itself, ``""`` at the top); None when it has
    none."""
    if isinstance(value, float):
        return None if math.isfinite(value) else where
    if isinstance(value, dict):
        items: Any = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for path, item in items:
        found = non_finite_path(item, path)
        if found is not None:
            return found
    return None
