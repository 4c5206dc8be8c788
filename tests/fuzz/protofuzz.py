"""Hypothesis strategies that build any protobuf message from its descriptor, with hostile values.

Scalars lean on edge cases: empty and huge strings and bytes, unicode (combining marks, right-to-left,
NUL, emoji), NaN, infinities, -0.0, negative and extreme integers, enum numbers that the schema does not
define. String fields whose name is in ``known`` draw, half of the time, a value that the server knows
(a real session id, table or env id), so the fuzzer reaches code behind the first lookup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from google.protobuf import descriptor as _d
from google.protobuf import message_factory
from hypothesis import strategies as st

#: Largest string or bytes value drawn, in characters or bytes (the "huge" edge case).
HUGE = 1 << 17
_T = _d.FieldDescriptor

_INT32 = st.one_of(st.sampled_from([0, -1, 1, 2**31 - 1, -(2**31)]), st.integers(-(2**31), 2**31 - 1))
_INT64 = st.one_of(st.sampled_from([0, -1, 1, 2**63 - 1, -(2**63)]), st.integers(-(2**63), 2**63 - 1))
_UINT32 = st.one_of(st.sampled_from([0, 1, 2**32 - 1, 2**31]), st.integers(0, 2**32 - 1))
_UINT64 = st.one_of(st.sampled_from([0, 1, 2**64 - 1, 2**63]), st.integers(0, 2**64 - 1))
_DOUBLE = st.one_of(
    st.sampled_from([0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e308, -1e308, 5e-324, -1.0]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_FLOAT = st.one_of(
    st.sampled_from([0.0, float("nan"), float("inf"), float("-inf"), 3.4e38, -1.0]),
    st.floats(width=32, allow_nan=True, allow_infinity=True),
)
_TEXT = st.one_of(
    st.sampled_from(
        ["", " ", "\x00", "a\x00b", "\u202e\u0301\U0001f600", "../../etc/passwd", "%s%n{0}", "\ufeff"]
    ),
    st.text(max_size=40),
    st.builds(
        lambda c, n: c * n, st.sampled_from(["a", "\u00e9", "\U0001f600"]), st.sampled_from([1024, HUGE])
    ),
)
_BYTES = st.one_of(
    st.sampled_from([b"", b"\x00", b"\xff" * 16, b"(\xb5/\xfd"]),  # last: a zstd magic number alone
    st.binary(max_size=64),
    st.builds(lambda n: b"\x00" * n, st.sampled_from([1024, HUGE])),
)

_SCALARS = {
    _T.TYPE_INT32: _INT32, _T.TYPE_SINT32: _INT32, _T.TYPE_SFIXED32: _INT32,
    _T.TYPE_INT64: _INT64, _T.TYPE_SINT64: _INT64, _T.TYPE_SFIXED64: _INT64,
    _T.TYPE_UINT32: _UINT32, _T.TYPE_FIXED32: _UINT32,
    _T.TYPE_UINT64: _UINT64, _T.TYPE_FIXED64: _UINT64,
    _T.TYPE_DOUBLE: _DOUBLE, _T.TYPE_FLOAT: _FLOAT, _T.TYPE_BOOL: st.booleans(),
    _T.TYPE_BYTES: _BYTES,
}  # fmt: skip


def _enum(field: _d.FieldDescriptor) -> st.SearchStrategy[int]:
    known = [v.number for v in field.enum_type.values]
    return st.one_of(st.sampled_from(known), st.sampled_from([-1, max(known) + 1, 2**31 - 1, -(2**31)]))


def _string(field: _d.FieldDescriptor, known: Mapping[str, Sequence[str]]) -> st.SearchStrategy[str]:
    values = known.get(field.name)
    return st.one_of(st.sampled_from(list(values)), _TEXT) if values else _TEXT


def _value(field: _d.FieldDescriptor, depth: int, known: Mapping[str, Sequence[str]]) -> st.SearchStrategy:
    if field.type == _T.TYPE_MESSAGE:
        return message_strategy(field.message_type, depth + 1, known)
    if field.type == _T.TYPE_ENUM:
        return _enum(field)
    if field.type == _T.TYPE_STRING:
        return _string(field, known)
    return _SCALARS[field.type]


def message_strategy(
    desc: _d.Descriptor, depth: int = 0, known: Mapping[str, Sequence[str]] | None = None, max_depth: int = 4
) -> st.SearchStrategy:
    """A strategy of messages of type ``desc`` (every field optional, repeated fields up to 3 elements).

    Args:
        desc: The message descriptor.
        depth: Current nesting depth; deeper messages are left empty past ``max_depth``.
        known: Field name -> values the server knows, mixed into string fields of that name.
        max_depth: Nesting limit (recursive types such as ``google.protobuf.Value``).

    Returns:
        A strategy of message instances.
    """
    known = known or {}
    cls = message_factory.GetMessageClass(desc)
    if depth >= max_depth:
        return st.just(cls())
    parts = {}
    for field in desc.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_f, val_f = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            parts[field.name] = st.dictionaries(
                _value(key_f, depth, known), _value(val_f, depth, known), max_size=3
            )
        elif field.is_repeated:
            parts[field.name] = st.lists(_value(field, depth, known), max_size=3)
        else:
            parts[field.name] = _value(field, depth, known)

    @st.composite
    def build(draw):
        msg = cls()
        names = draw(st.lists(st.sampled_from(sorted(parts)), unique=True)) if parts else []
        for name in names:
            _assign(msg, desc.fields_by_name[name], draw(parts[name]))
        return msg

    return build()


def _assign(msg, field: _d.FieldDescriptor, value) -> None:
    target = getattr(msg, field.name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        val_f = field.message_type.fields_by_name["value"]
        for k, v in value.items():
            if val_f.type == _T.TYPE_MESSAGE:
                target[k].CopyFrom(v)
            else:
                target[k] = v
    elif field.is_repeated:
        if field.type == _T.TYPE_MESSAGE:
            target.extend(value)
        else:
            target.extend(value)
    elif field.type == _T.TYPE_MESSAGE:
        target.CopyFrom(value)
    else:
        setattr(msg, field.name, value)
