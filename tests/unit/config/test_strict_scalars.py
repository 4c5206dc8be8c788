"""Every config key that takes a number refuses ``true`` (pydantic would read it as 1), and every key that takes
only ``true`` or ``false`` refuses ``1`` (pydantic would read it as true): the error names the key
(:func:`marti.config.section.check_scalar_type`, run on every field of every section)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from marti.config import load_config
from marti.config.section import scalar_kinds
from marti.errors import InvalidArgumentError

TINY = Path(__file__).resolve().parents[3] / "examples" / "tiny.yaml"


def _keys(section: BaseModel, prefix: str = "") -> Iterator[tuple[str, frozenset[type]]]:
    """(dotted key, the scalar types it admits) of every leaf key of a loaded config's sections."""
    for name, field in type(section).model_fields.items():
        value, key = getattr(section, name), f"{prefix}{name}"
        if isinstance(value, BaseModel):
            yield from _keys(value, f"{key}.")
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            yield from _keys(value[0], f"{key}.0.")
        else:
            yield key, scalar_kinds(field.annotation)


KEYS = list(_keys(load_config(TINY)))
NUMBERS = [k for k, kinds in KEYS if kinds & {int, float} and not kinds & {bool, object}]
BOOLEANS = [k for k, kinds in KEYS if bool in kinds and kinds <= {bool, type(None)}]


def test_the_walk_finds_both_kinds_of_keys() -> None:
    assert {"max_steps", "learning_rate", "rollout.temperature", "services.reconnect_timeout_s"} <= set(
        NUMBERS
    )
    assert {"strategy.bf16", "agents.0.is_tuning", "ray.colocate_models"} <= set(BOOLEANS)


@pytest.mark.parametrize("key", NUMBERS)
def test_a_number_key_refuses_a_boolean(key: str) -> None:
    # a key with a parser of its own says it in its words (ray.object_store_memory: "byte size must be a number")
    said = re.escape(f"'{key}': ") + r"[^']*must be a number.*\(got True\)"
    with pytest.raises(InvalidArgumentError, match=said):
        load_config(TINY, [f"{key}=true"])


@pytest.mark.parametrize("key", BOOLEANS)
def test_a_boolean_key_refuses_a_number(key: str) -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape(f"'{key}': must be true or false (got 1)")):
        load_config(TINY, [f"{key}=1"])
