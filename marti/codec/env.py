"""Protocol codec of the env API: Python values and gymnasium spaces <-> ``marti.api.env.v1`` protos.

Values: ``None``, ``bool``, ``int`` (and numpy integer scalars), ``float`` (and numpy floating scalars),
``str``, numpy arrays (as ``Tensor``: dtype, shape, little-endian C-order bytes), lists and tuples (as
lists) and dicts with string keys. Spaces: Text, Discrete, Box, MultiBinary, MultiDiscrete, Dict, Tuple. Client
and server both use this module, so both ends decode the same way. Nothing here pickles or evals.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
from google.protobuf import struct_pb2

from marti.api.env.v1 import env_pb2 as pb
from marti.errors import InvalidArgumentError

#: Deepest nesting of values decoded from the network (lists and maps).
MAX_VALUE_DEPTH = 32


#: ``dtype.kind`` letters a ``Tensor`` may carry: bool, signed and unsigned integers, floats, complex numbers,
#: timedeltas and datetimes (with a unit: a unitless datetime holds only NaT). Text goes as ``text`` values
#: or lists; object, byte-string, unicode, void and structured dtypes are refused both ways with
#: ``INVALID_ARGUMENT``.
TENSOR_KINDS = "biufcmM"
#: Most dimensions of a tensor (numpy's own limit is 64 in numpy 2, 32 before).
MAX_TENSOR_DIMS = 32
#: Longest dtype text quoted in an error message, characters.
_MAX_DTYPE_QUOTE = 64
_KIND_NAMES = {
    "O": "object",
    "S": "byte-string",
    "U": "unicode",
    "V": "void or structured",
    "T": "variable-width string",
}


def _dtype_problem(dtype: np.dtype) -> str | None:
    """Why ``dtype`` cannot travel as a tensor, or None when it can."""
    if dtype.kind not in TENSOR_KINDS:
        what = _KIND_NAMES.get(dtype.kind, f"kind {dtype.kind!r}")
        return (
            f"{what} dtypes are not accepted (tensors carry bool, int, uint, float, complex, timedelta or "
            "datetime items; send text as text values or lists)"
        )
    if dtype.fields is not None or dtype.subdtype is not None or dtype.hasobject:
        return "structured and sub-array dtypes are not accepted"
    if dtype.itemsize == 0:
        return "the dtype has no item size"
    if dtype.kind == "M" and np.datetime_data(dtype)[0] == "generic":
        return "datetime tensors need a unit, e.g. 'datetime64[s]'"
    return None


def tensor_to_proto(arr: np.ndarray) -> pb.Tensor:
    """Encode a numpy array as a ``Tensor`` (dtype name, shape, little-endian C-order bytes).

    Args:
        arr: The array (or anything ``np.asarray`` takes); its dtype kind must be in :data:`TENSOR_KINDS`.

    Returns:
        The ``Tensor`` message.

    Raises:
        InvalidArgumentError: An object, byte-string, unicode, void or structured array (send lists or text
            values instead), a datetime without a unit, or more than :data:`MAX_TENSOR_DIMS` dimensions.
    """
    arr = np.asarray(arr)
    problem = _dtype_problem(arr.dtype)
    if problem is not None:
        raise InvalidArgumentError(f"cannot send an array of dtype {arr.dtype.str!r}: {problem}")
    if arr.ndim > MAX_TENSOR_DIMS:
        raise InvalidArgumentError(f"cannot send an array of {arr.ndim} dimensions (most {MAX_TENSOR_DIMS})")
    le = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    return pb.Tensor(dtype=arr.dtype.name, shape=list(arr.shape), data=np.ascontiguousarray(le).tobytes())


def tensor_from_proto(t: pb.Tensor) -> np.ndarray:
    """Decode a ``Tensor`` into a new, writable numpy array.

    Every malformed tensor is refused, whatever its dtype: a dtype numpy does not know, one outside
    :data:`TENSOR_KINDS` (object, byte-string, unicode, void, structured, sub-array), one without an item size
    (``"str"``, ``"U"``, ``"S"``, ``"V"``), a datetime without a unit, a negative dimension, more than
    :data:`MAX_TENSOR_DIMS` dimensions, or data whose byte count is not ``prod(shape) * itemsize``. Bool bytes
    other than 0 decode as True.

    Args:
        t: The message.

    Returns:
        The array, of ``t.dtype`` and ``t.shape``.

    Raises:
        InvalidArgumentError: The tensor is malformed; the message quotes the dtype as sent and says why.
    """
    quoted = repr(t.dtype[:_MAX_DTYPE_QUOTE])
    try:
        dtype = np.dtype(t.dtype)
    except Exception:  # noqa: BLE001 - numpy refuses names with TypeError, ValueError or SyntaxError
        raise InvalidArgumentError(f"unknown tensor dtype {quoted}") from None
    problem = _dtype_problem(dtype)
    if problem is not None:
        raise InvalidArgumentError(f"tensor dtype {quoted}: {problem}")
    shape = tuple(int(s) for s in t.shape)
    if len(shape) > MAX_TENSOR_DIMS:
        raise InvalidArgumentError(
            f"tensor of dtype {quoted} has {len(shape)} dimensions (most {MAX_TENSOR_DIMS})"
        )
    if any(s < 0 for s in shape):
        raise InvalidArgumentError(f"tensor of dtype {quoted} has a negative dimension in shape {shape}")
    expected = math.prod(shape) * dtype.itemsize
    if len(t.data) != expected:
        raise InvalidArgumentError(
            f"tensor of shape {shape} and dtype {quoted} needs {expected} bytes, got {len(t.data)}"
        )
    try:
        if dtype.kind == "b":
            return (np.frombuffer(t.data, dtype=np.uint8) != 0).reshape(shape)
        return np.frombuffer(t.data, dtype=dtype.newbyteorder("<")).astype(dtype, copy=True).reshape(shape)
    except (ValueError, OverflowError) as exc:  # e.g. a zero-size shape whose other dimensions are huge
        raise InvalidArgumentError(
            f"tensor of shape {shape} and dtype {quoted} cannot be built: {exc}"
        ) from None


def _put(msg: pb.Value, v: Any) -> None:
    """Write ``v`` into ``msg`` in place (no intermediate messages; plain scalars take the fast path)."""
    t = type(v)
    if t is str:
        msg.text = v
    elif t is bool:
        msg.bool_value = v
    elif t is int:
        msg.int_value = v
    elif t is float:
        msg.float_value = v
    elif v is None:
        msg.null_value = struct_pb2.NULL_VALUE
    elif isinstance(v, np.bool_):
        msg.bool_value = bool(v)
    elif isinstance(v, int | np.integer):
        msg.int_value = int(v)
    elif isinstance(v, float | np.floating):
        msg.float_value = float(v)
    elif isinstance(v, str):
        msg.text = str(v)
    elif isinstance(v, np.ndarray):
        msg.tensor.CopyFrom(tensor_to_proto(v))
    elif isinstance(v, list | tuple):
        values = msg.list.values
        if not v:
            msg.list.SetInParent()
        for x in v:
            _put(values.add(), x)
    elif isinstance(v, Mapping):
        msg.map.SetInParent()
        _put_map(msg.map, v)
    else:
        raise InvalidArgumentError(f"cannot send a value of type {type(v).__name__}: {v!r:.80}")


def _put_map(out: pb.ValueMap, m: Mapping[str, Any]) -> None:
    fields = out.fields
    for k, v in m.items():
        if type(k) is not str:
            raise InvalidArgumentError(f"map keys must be strings, got {k!r}")
        _put(fields[k], v)


def value_to_proto(v: Any) -> pb.Value:
    """Encode a Python value (see module docstring).

    Raises:
        InvalidArgumentError: A type that cannot be sent (named).
    """
    msg = pb.Value()
    _put(msg, v)
    return msg


def map_to_proto(m: Mapping[str, Any] | None) -> pb.ValueMap:
    """Encode a dict with string keys.

    Raises:
        InvalidArgumentError: A non-string key or a value that cannot be sent.
    """
    out = pb.ValueMap()
    _put_map(out, m or {})
    return out


def fill_map(out: pb.ValueMap, m: Mapping[str, Any]) -> None:
    """Encode a dict with string keys into an existing ``ValueMap`` field (avoids a copy)."""
    _put_map(out, m)


def infos_json(infos: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Return every agent's info dict as one compact JSON object, or ``None`` when one is not JSON-encodable.

    JSON keeps str, int, float, bool, None, lists and string-keyed objects exactly (tuples become lists, as in
    the ``Value`` codec). Values JSON cannot hold (numpy arrays and numpy ints or bools) make this return
    ``None``, and the caller falls back to typed ``ValueMap`` infos. Agent ids and the top-level info keys must
    be strings.
    """
    key_types = set(map(type, infos))
    for info in infos.values():
        key_types.update(map(type, info))
    if key_types - {str}:
        return None
    try:
        return json.dumps(infos, separators=(",", ":"))
    except (TypeError, ValueError):
        return None


def fill_value(out: pb.Value, v: Any) -> None:
    """Encode a value into an existing ``Value`` field (avoids a copy)."""
    _put(out, v)


_SCALARS = frozenset({"text", "bool_value", "int_value", "float_value"})


def value_from_proto(v: pb.Value, depth: int = 0) -> Any:
    """Decode a :class:`Value`.

    Raises:
        InvalidArgumentError: Nesting deeper than :data:`MAX_VALUE_DEPTH` or a bad tensor.
    """
    if depth > MAX_VALUE_DEPTH:
        raise InvalidArgumentError(f"value nesting deeper than MAX_VALUE_DEPTH={MAX_VALUE_DEPTH}")
    kind = v.WhichOneof("kind")
    if kind in _SCALARS:
        return getattr(v, kind)
    if kind is None or kind == "null_value":
        return None
    if kind == "tensor":
        return tensor_from_proto(v.tensor)
    if kind == "list":
        return [value_from_proto(x, depth + 1) for x in v.list.values]
    if kind == "map":
        return map_from_proto(v.map, depth + 1)
    return getattr(v, kind)


def map_from_proto(m: pb.ValueMap, depth: int = 0) -> dict[str, Any]:
    """Decode a :class:`ValueMap` (keys sorted, for deterministic order)."""
    return {k: value_from_proto(m.fields[k], depth) for k in sorted(m.fields)}


def space_to_proto(space: gymnasium.Space) -> pb.Space:
    """Encode a gymnasium space.

    Raises:
        InvalidArgumentError: A space type not listed in the module docstring.
    """
    s = gymnasium.spaces
    desc = f"Text({space.min_length}..{space.max_length} chars)" if isinstance(space, s.Text) else str(space)
    if isinstance(space, s.Text):
        return pb.Space(
            description=desc,
            text=pb.TextSpace(
                min_length=space.min_length,
                max_length=space.max_length,
                charset="".join(sorted(space.character_set)),
            ),
        )
    if isinstance(space, s.Discrete):
        return pb.Space(description=desc, discrete=pb.DiscreteSpace(n=int(space.n), start=int(space.start)))
    if isinstance(space, s.Box):
        return pb.Space(
            description=desc,
            box=pb.BoxSpace(low=tensor_to_proto(space.low), high=tensor_to_proto(space.high)),
        )
    if isinstance(space, s.MultiBinary):
        return pb.Space(description=desc, multi_binary=pb.MultiBinarySpace(shape=list(space.shape)))
    if isinstance(space, s.MultiDiscrete):
        return pb.Space(
            description=desc,
            multi_discrete=pb.MultiDiscreteSpace(
                nvec=tensor_to_proto(space.nvec), start=tensor_to_proto(space.start)
            ),
        )
    if isinstance(space, s.Dict):
        return pb.Space(
            description=desc,
            dict=pb.DictSpace(
                entries=[pb.NamedSpace(key=k, space=space_to_proto(v)) for k, v in space.spaces.items()]
            ),
        )
    if isinstance(space, s.Tuple):
        return pb.Space(
            description=desc, tuple=pb.TupleSpace(spaces=[space_to_proto(x) for x in space.spaces])
        )
    raise InvalidArgumentError(f"space {space} of type {type(space).__name__} cannot be described over gRPC")


def space_from_proto(p: pb.Space) -> gymnasium.Space:
    """Decode a :class:`Space` into a gymnasium space.

    Raises:
        InvalidArgumentError: No kind set.
    """
    s = gymnasium.spaces
    kind = p.WhichOneof("kind")
    if kind == "text":
        return s.Text(p.text.max_length, min_length=p.text.min_length, charset=p.text.charset)
    if kind == "discrete":
        return s.Discrete(p.discrete.n, start=p.discrete.start)
    if kind == "box":
        low, high = tensor_from_proto(p.box.low), tensor_from_proto(p.box.high)
        return s.Box(low=low, high=high, shape=low.shape, dtype=low.dtype)
    if kind == "multi_binary":
        return s.MultiBinary(list(p.multi_binary.shape))
    if kind == "multi_discrete":
        nvec = tensor_from_proto(p.multi_discrete.nvec)
        return s.MultiDiscrete(nvec, dtype=nvec.dtype, start=tensor_from_proto(p.multi_discrete.start))
    if kind == "dict":
        return s.Dict({e.key: space_from_proto(e.space) for e in p.dict.entries})
    if kind == "tuple":
        return s.Tuple([space_from_proto(x) for x in p.tuple.spaces])
    raise InvalidArgumentError("space has no kind set")


# ---- delta results: text edits of observations and per-key info deltas (StepRequest.delta_base) ----

#: Shortest unchanged part (prefix + suffix, characters) for which an observation is sent as a ``TextEdit``;
#: below it the text goes in full (an edit would save too little to pay for itself).
MIN_EDIT_KEEP = 32
#: Resolution of the common prefix and suffix :func:`text_edit` finds, characters: it stops searching when
#: the longest common part is known to within this many characters (the few extra travel in the edit's text),
#: which keeps the search to a handful of C-level comparisons; a common suffix shorter than this is not used.
EDIT_GRAIN = 64
#: Info value types a delta may leave out when unchanged: immutable scalars, compared by type and value (a
#: list or dict value is always sent, since the env may change it in place).
DELTA_SCALARS = frozenset({str, int, float, bool, type(None)})


def text_edit(base: str, new: str) -> tuple[int, int, str] | None:
    """An edit turning ``base`` into ``new``: a common prefix and suffix (not overlapping), each within
    :data:`EDIT_GRAIN` characters of the longest, and the text between them.

    Args:
        base: The text the receiver holds.
        new: The text to send.

    Returns:
        ``(prefix, suffix, text)`` with ``new == base[:prefix] + text + base[len(base) - suffix:]``, or ``None``
        when fewer than :data:`MIN_EDIT_KEEP` characters would be kept (send ``new`` in full).
    """
    limit = min(len(base), len(new))
    if limit < MIN_EDIT_KEEP:
        return None
    lo, hi = 0, limit  # base[:lo] is a common prefix; base[:hi + 1] is not (or hi == limit)
    if new.startswith(base[:limit]):
        lo = limit
    while hi - lo > EDIT_GRAIN:
        mid = (lo + hi) // 2
        if new.startswith(base[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    prefix = lo
    suffix = 0
    room = limit - prefix
    if room >= EDIT_GRAIN and new.endswith(base[len(base) - EDIT_GRAIN :]):
        lo, hi, nb, nn = EDIT_GRAIN, room, len(base), len(new)
        if new.endswith(base[nb - room :]):
            lo = room
        while hi - lo > EDIT_GRAIN:
            mid = (lo + hi) // 2
            if new.endswith(base[nb - mid : nb - lo], 0, nn - lo):
                lo = mid
            else:
                hi = mid
        suffix = lo
    if prefix + suffix < MIN_EDIT_KEEP:
        return None
    return prefix, suffix, new[prefix : len(new) - suffix]


def apply_text_edit(base: str, edit: pb.TextEdit) -> str:
    """Apply a ``TextEdit`` to the base text.

    Raises:
        InvalidArgumentError: ``prefix + suffix`` exceeds the base's length (both named): the edit was made
            against another text.
    """
    prefix, suffix = edit.prefix, edit.suffix
    if prefix + suffix > len(base):
        raise InvalidArgumentError(
            f"text edit keeps prefix={prefix} and suffix={suffix} characters of a base text of {len(base)}"
        )
    return base[:prefix] + edit.text + base[len(base) - suffix :]


def info_delta(base: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any] | None:
    """The entries of ``new`` a receiver holding ``base`` lacks, or ``None`` when ``new`` must go in full.

    A delta exists only when both have the same keys in the same order; it holds every key whose value is not
    an unchanged scalar (exactly ``str``, ``int``, ``float``, ``bool`` or ``None``, same type and ``==``; NaN
    never counts as unchanged, nor 0.0 against -0.0; lists, dicts and subclasses such as numpy scalars are always sent). Merging it into a copy of ``base`` (``dict.update``) gives ``new``, key order included.
    """
    if len(base) != len(new) or list(base) != list(new):
        return None
    scalars = DELTA_SCALARS
    return {
        k: v
        for k, v in new.items()
        if (old := base[k]) != v
        or type(v) is not type(old)
        or type(v) not in scalars
        or (type(v) is float and math.copysign(1.0, v) != math.copysign(1.0, old))  # 0.0 vs -0.0
    }
