"""``marti.plumbing.arguments.checked``: one check per argument (``own``), and the generic checks' edges."""

from __future__ import annotations

import pytest

import marti
from marti.errors import InvalidArgumentError
from marti.plumbing.arguments import checked


def _own_check(count: int) -> int:
    if not isinstance(count, int) or count < 1:
        raise InvalidArgumentError(f"count must be an integer >= 1, got {count!r}")
    return count


@checked(own=("count",))
def _owned(count: int, name: str = "x") -> int:
    return _own_check(count)


@checked
def _generic(count: int, wait_s: float = 1.0) -> int:
    return count


@pytest.mark.parametrize("bad", [1.5, "4"])
def test_an_owned_argument_gets_only_its_own_check_and_message(bad):
    with pytest.raises(InvalidArgumentError, match=rf"^count must be an integer >= 1, got {bad!r}$"):
        _owned(bad)
    with pytest.raises(InvalidArgumentError, match=r"^_generic: count must be an integer within 64 bits"):
        _generic(bad)


def test_an_owned_argument_is_not_refused_for_what_its_own_check_accepts():
    assert _owned(2**70) == 2**70
    with pytest.raises(InvalidArgumentError, match=r"^_generic: count must be an integer within 64 bits"):
        _generic(2**70)


def test_the_other_arguments_are_still_checked_generically():
    with pytest.raises(InvalidArgumentError, match=r"^_owned: name must be a string, got 5 \(int\)$"):
        _owned(1, name=5)


def test_an_own_name_that_is_no_parameter_is_refused_at_decoration():
    with pytest.raises(TypeError, match=r"has no parameter \['cuont'\]"):
        checked(own=("cuont",))(_own_check)


@pytest.mark.parametrize("bad", [10**400, -(10**400), float("nan"), float("inf")])
def test_a_float_argument_refuses_what_no_float_holds_without_a_raw_error(bad):
    with pytest.raises(InvalidArgumentError, match="wait_s must be a finite number"):
        _generic(1, wait_s=bad)


@checked
def _texts(name: str, tags: list[str] = (), meta: dict[str, str] | None = None) -> str:
    return name


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"name": "a\udcff"}, "name"),
        ({"name": "a", "tags": ["\ud800"]}, "tags"),
        ({"name": "a", "meta": {"k": "\udcff"}}, "meta"),
    ],
)
def test_text_utf8_cannot_carry_is_refused_naming_the_argument(kwargs, named):
    """A lone surrogate would fail later as a raw UnicodeEncodeError from protobuf (issue 29 item 10)."""
    with pytest.raises(InvalidArgumentError, match=rf"^_texts: {named} must be .*no lone surrogate\)$"):
        _texts(**kwargs)
    assert _texts("a\x00b é 😀") == "a\x00b é 😀"


def test_a_refusal_words_any_as_anything():
    """An argument annotated with Any in it is worded plainly (it read 'a mapping of a string to a Any or None')."""
    from collections.abc import Mapping, Sequence
    from typing import Any

    from marti.plumbing.arguments import describe

    assert describe(Sequence[Mapping[str, Any | None]]) == "a sequence of a mapping of a string to anything"
    with marti.InferenceClient("127.0.0.1:1", token="t", timeout_s=1) as client:
        with pytest.raises(
            InvalidArgumentError,
            match="a sequence of a mapping of a string to anything or None, got .hi. \\(str\\)",
        ):
            client.generate("planner", messages="hi")
