"""Broker payload encoding (issue 29, item 9): any JSON-like value round-trips, integers exactly whatever their
size, non-finite floats as ``null`` whatever their neighbours; a value JSON cannot hold is named by its path."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marti.codec.broker import decode_payload, encode_payload
from marti.errors import InvalidArgumentError

LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63, max_value=2**200),
    st.integers(max_value=-(2**63), min_value=-(2**200)), st.floats(), st.text(max_size=8),
)  # fmt: skip
JSON_LIKE = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)


def _arrives(value: Any) -> Any:
    """What a receiver gets for ``value``: non-finite floats as None, everything else equal."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_arrives(v) for v in value]
    if isinstance(value, dict):
        return {k: _arrives(v) for k, v in value.items()}
    return value


def _same(a: Any, b: Any) -> bool:
    """Equal, with ints and floats kept apart (2**70 must not come back as 1.18e21)."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(JSON_LIKE)
def test_json_like_values_round_trip_exactly(value):
    payload, ctype = encode_payload(value)
    assert _same(decode_payload(payload, ctype), _arrives(value))


@pytest.mark.parametrize("neighbour", [None, 1, 2**70, -(2**90), "x"])
def test_nan_is_null_whatever_its_neighbours(neighbour):
    payload, _ = encode_payload([math.nan, neighbour, {"inf": -math.inf}])
    assert decode_payload(payload, "application/json") == [None, neighbour, {"inf": None}]


def test_big_integer_keys_become_their_exact_decimal_strings():
    payload, _ = encode_payload({2**70: 1, 3: 2})
    assert decode_payload(payload, "application/json") == {str(2**70): 1, "3": 2}


def test_a_value_json_cannot_hold_is_named_by_its_path():
    with pytest.raises(InvalidArgumentError, match=r"state\['a'\]\[1\] \(of type object\)"):
        encode_payload({"a": [2**70, object()]}, name="state")
    looped: list = []
    looped.append(looped)
    with pytest.raises(InvalidArgumentError, match="contains itself"):
        encode_payload([2**70, looped])


@pytest.mark.parametrize(
    "value, words",
    [
        ({1: "a", "1": "b"}, "message has the keys 1 and '1'"),
        ({"a": [{None: 0, "null": 1}]}, "message['a'][0] has the keys None and 'null'"),
        ({True: 0, "true": 1}, "message has the keys True and 'true'"),
        ({2**70: 0, str(2**70): 1}, f"message has the keys {2**70} and '{2**70}'"),
    ],
)
def test_two_keys_json_writes_as_one_are_refused_naming_them(value, words):
    """Non-string keys become strings; two keys of one dict that become the same string were both written and
    the receiver kept the last value ({"1": "b"}), with no error; now the sender's call names them."""
    with pytest.raises(InvalidArgumentError, match="a reader would keep only one") as err:
        encode_payload(value)
    assert words in str(err.value)
    payload, ctype = encode_payload({1: "a", "2": "b"})  # keys that stay apart still go
    assert decode_payload(payload, ctype) == {"1": "a", "2": "b"}
