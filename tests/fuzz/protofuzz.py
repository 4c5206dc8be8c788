"""Hypothesis strategies that build any protobuf message from its descriptor, with hostile values.

Scalars lean on edge cases: empty and huge strings and bytes, unicode (combining marks, right-to-left,
NUL, emoji), NaN, infinities, -0.0, negative and extreme integers, enum numbers that the schema does not
define. String fields whose name is in ``known`` draw, half of the time, a value that the server knows
(a real session id, table or env id), so the fuzzer reaches code behind the first lookup. ``Tensor``
messages (``marti.api.env.v1.Tensor``) draw, half of the time, from :func:`tensor_strategy`: a dtype of
every numpy kind (zero-size, object, structured and unknown ones included) with a shape and matching or
mismatched bytes, so the fuzzer gets past the first dtype check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from google.protobuf import descriptor as _d
from google.protobuf import message_factory
from hypothesis import strategies as st

from marti.api.env.v1 import env_pb2

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


#: Tensor dtype strings per numpy kind letter: every kind numpy knows (b i u f c m M O S U V), with sized,
#: zero-size, byte-swapped, structured and sub-array forms; the "?" entry holds names numpy refuses and numpy
#: 2's variable-width string dtype (kind ``T``).
DTYPES_BY_KIND: dict[str, tuple[str, ...]] = {
    "b": ("bool", "?", "b1"),
    "i": ("int8", "<i2", ">i4", "int64", "p"),
    "u": ("uint8", ">u2", "u4", "uint64", "P"),
    "f": ("float16", "e", ">f4", "float64", "g"),
    "c": ("complex64", ">c8", "complex128", "G"),
    "m": ("m8", "timedelta64[s]", ">m8[ns]"),
    "M": ("M8", "datetime64[D]", ">M8[us]", "M8[3s]"),
    "O": ("O", "object"),
    "S": ("S", "S0", "S3", "bytes8"),
    "U": ("str", "U", "U0", "<U2", ">U1", "str96"),
    "V": ("V", "V0", "V4", "i4,i4", "(2,)i4", "i4,O", "void16"),
    "?": ("T", "int128", "", "float8", "U99999999999999", "M8[bogus]", "i4,(", "\x00", "float32 "),
}
_DTYPE_NAMES = [name for names in DTYPES_BY_KIND.values() for name in names]
_DIMS = st.one_of(
    st.integers(0, 4),
    st.sampled_from([-1, -(2**63), 2**31, 2**62, 2**63 - 1]),
    st.integers(-(2**63), 2**63 - 1),
)


def _nominal_bytes(dtype: str, shape: Sequence[int]) -> int | None:
    """Bytes a well-formed tensor of ``dtype`` and ``shape`` has, or None when there is no such size."""
    try:
        itemsize = np.dtype(dtype).itemsize
    except Exception:  # noqa: BLE001 - every way numpy refuses a name
        return None
    if any(d < 0 for d in shape):
        return None
    size = math.prod(shape) * itemsize
    return size if size <= 4096 else None


@st.composite
def tensor_strategy(draw) -> env_pb2.Tensor:
    """A strategy of ``Tensor`` messages with a dtype of every numpy kind and well- or ill-formed data.

    The dtype comes from :data:`DTYPES_BY_KIND` or is arbitrary text; the shape has up to 4 dimensions with
    edge values (negative, huge), and one time in ten 33 or 65 (past the codec's and numpy's limits); the
    data, half of the time, has exactly the bytes the dtype and shape call for (so the value reaches whatever
    decodes it), else random bytes.

    Returns:
        A strategy of :class:`marti.api.env.v1.env_pb2.Tensor`.
    """
    dtype = draw(st.one_of(st.sampled_from(_DTYPE_NAMES), st.text(max_size=12)))
    many_dims = draw(st.integers(0, 9)) == 0
    shape = draw(st.sampled_from([[1] * 33, [1] * 65])) if many_dims else draw(st.lists(_DIMS, max_size=4))
    nominal = _nominal_bytes(dtype, shape)
    if nominal is not None and draw(st.booleans()):
        data = draw(st.binary(min_size=nominal, max_size=nominal))
    else:
        data = draw(st.binary(max_size=64))
    return env_pb2.Tensor(dtype=dtype, shape=shape, data=data)


#: Message types drawn, half of the time, from a strategy of their own instead of field by field.
_SPECIAL: dict[str, st.SearchStrategy] = {env_pb2.Tensor.DESCRIPTOR.full_name: tensor_strategy()}


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
    special = _SPECIAL.get(desc.full_name)
    if special is not None:
        return st.one_of(special, _generic(desc, cls, depth, known))
    return _generic(desc, cls, depth, known)


def _generic(desc: _d.Descriptor, cls, depth: int, known: Mapping[str, Sequence[str]]) -> st.SearchStrategy:
    """Field-by-field strategy of ``desc`` messages (see :func:`message_strategy`)."""
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
