"""The base of every config section (:class:`Section`): unknown keys are errors, values are frozen, and a section
built directly from keywords raises :class:`~marti.errors.InvalidArgumentError` naming each bad key and value.

:mod:`marti.config.schema` and the sections kept in modules of their own (:mod:`marti.config.sections.dataset`) derive
from it.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator
from pydantic._internal._model_construction import ModelMetaclass

from marti.errors import InvalidArgumentError

#: Bounded numbers shared by the sections.
PositiveInt = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
NonNegInt = Annotated[int, Field(ge=0)]
#: An int >= 0 that must be written as an int: ``true`` or ``1.0`` are refused (a bound that switches a mode on).
StrictNonNegInt = Annotated[int, Field(ge=0, strict=True)]
UnitFloat = Annotated[float, Field(ge=0, le=1)]
#: Names of agents, tasks and jobs: letters, digits, ``_ . -``, at most 64 characters.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
#: Difficulty levels of the built-in text envs, easiest first (``pick``, ``pair``: ``private_allocation`` only; the
#: env server says which levels each scenario has).
Difficulty = Literal["pick", "pair", "easy", "medium", "hard"]


def scalar_kinds(annotation: Any) -> frozenset[type]:
    """The scalar types a field's annotation admits at its top level: ``PositiveInt | None`` is ``{int,
    NoneType}``, ``Literal["a", 1]`` is ``{str, int}``; a container or a model adds its own type
    (``list[int]`` is ``{list}``), ``Any`` adds ``object``."""
    if annotation is Any:
        return frozenset({object})
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return scalar_kinds(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return frozenset().union(*(scalar_kinds(a) for a in typing.get_args(annotation)))
    if origin is Literal:
        return frozenset(type(v) for v in typing.get_args(annotation))
    if annotation is None:
        return frozenset({type(None)})
    return (
        frozenset({origin or annotation}) if isinstance(origin or annotation, type) else frozenset({object})
    )


def check_scalar_type(value: Any, kinds: frozenset[type]) -> None:
    """Refuse the lax conversions between booleans and numbers that pydantic makes: ``true`` for a number (it
    would be 1), and a number or text for a field that is only ``true`` or ``false`` (``1``, ``"yes"``).

    Raises:
        ValueError: The value is a boolean where a number is needed, or not a boolean where only one fits.
    """
    if object in kinds:
        return
    if isinstance(value, bool):
        if bool not in kinds and kinds & {int, float}:
            raise ValueError("must be a number, not a boolean")
    elif value is not None and kinds <= {bool, type(None)} and bool in kinds:
        raise ValueError("must be true or false")


class SectionMeta(ModelMetaclass):
    """Metaclass of the sections: a section built directly from keywords (``AlgorithmConfig(gamma=0.9)``) raises
    :class:`~marti.errors.InvalidArgumentError` naming each bad key and value instead of pydantic's error.

    Only the call ``Section(...)`` is wrapped: a whole config validates its sections without calling them, and
    :mod:`marti.config.load` names the dotted key path of each problem.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: "
                f"{str(err['msg']).removeprefix('Value error, ')} (got {err.get('input')!r})"
                for err in exc.errors(include_url=False)
            )
            raise InvalidArgumentError(f"{cls.__name__}: {problems}") from None


class Section(BaseModel, metaclass=SectionMeta):
    """Base of every config section: unknown keys are errors, values are immutable after validation; built
    directly, a bad value raises :class:`~marti.errors.InvalidArgumentError` (see :class:`SectionMeta`)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, validate_default=True
    )

    @field_validator("*", mode="before")
    @classmethod
    def _strict_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        """Every field: no boolean where a number is needed, only a boolean where only one fits
        (:func:`check_scalar_type`)."""
        if info.field_name is not None:
            check_scalar_type(value, scalar_kinds(cls.model_fields[info.field_name].annotation))
        return value
