"""Protocol codec of the env API: Python values and gymnasium spaces <-> ``marti.api.env.v1`` protos.

Values: ``None``, ``bool``, ``int`` (and numpy integer scalars), ``float`` (and numpy floating scalars),
``str``, numpy arrays (as ``Tensor``: dtype, shape, little-endian C-order bytes), lists and tuples (as
lists) and dicts with string keys. Spaces: Text, Discrete, Box, MultiBinary, MultiDiscrete, Dict, Tuple. Client
and server both use this module, so both ends decode the same way. Nothing here pickles or evals.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
from google.protobuf import struct_pb2

from marti.api.env.v1 import env_pb2 as pb
from marti.errors import InvalidArgumentError

#: Deepest nesting of values decoded from the network (lists and maps).
MAX_VALUE_DEPTH = 32


def tensor_to_proto(arr: np.ndarray) -> pb.Tensor:
    """Encode a numpy array (object arrays are rejected)."""
    arr = np.asarray(arr)
    if arr.dtype.kind == "O":
        raise InvalidArgumentError("object arrays cannot be sent; use lists of values")
    le = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    return pb.Tensor(dtype=arr.dtype.name, shape=list(arr.shape), data=np.ascontiguousarray(le).tobytes())


def tensor_from_proto(t: pb.Tensor) -> np.ndarray:
    """Decode a :class:`Tensor`.

    Raises:
        InvalidArgumentError: Unknown dtype or a byte count that does not match the shape.
    """
    try:
        dtype = np.dtype(t.dtype)
    except TypeError:
        raise InvalidArgumentError(f"unknown tensor dtype {t.dtype!r}") from None
    if dtype.kind == "O":
        raise InvalidArgumentError("object tensors are not accepted")
    shape = tuple(int(s) for s in t.shape)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(t.data) != expected or any(s < 0 for s in shape):
        raise InvalidArgumentError(
            f"tensor of shape {shape} and dtype {dtype} needs {expected} bytes, got {len(t.data)}"
        )
    return np.frombuffer(t.data, dtype=dtype.newbyteorder("<")).astype(dtype, copy=True).reshape(shape)


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
