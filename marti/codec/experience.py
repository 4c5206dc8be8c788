"""The only bridge between ``marti.api.experience.v1`` protos and the store's domain types."""

from __future__ import annotations

import json
import math
import numbers
import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

from marti.api.experience.v1 import experience_pb2 as pb
from marti.codec.chunks import (
    check_payload_bytes,
    compress_chunks,
    decompress_chunks,
    pack_chunks,
    unpack_chunks,
)
from marti.errors import InvalidArgumentError
from marti.types.experience import SampleFilter, TableConfig, parse_table_config
from marti.types.trajectory import Trajectory, TrajectorySummary, Turn, check_identity, check_token_ids

#: Deepest nesting of dicts and lists a ``metadata`` or ``info`` may have: far more than any real one, and far
#: within Python's recursion limit wherever it is written, checked or read (a deeper one was a RecursionError: in
#: the SDK, or INTERNAL for a whole Insert stream in the store).
MAX_JSON_DEPTH = 254


def _too_deep(where: str) -> InvalidArgumentError:
    """The error for a ``metadata``/``info`` (named by ``where``) nested deeper than :data:`MAX_JSON_DEPTH`."""
    return InvalidArgumentError(f"{where} nests deeper than {MAX_JSON_DEPTH} levels of dicts and lists")


def _check_depth(value: Any, where: str) -> None:
    """Refuse ``value`` (acyclic) when its dicts and lists nest deeper than :data:`MAX_JSON_DEPTH` (walked
    without recursion).

    Raises:
        InvalidArgumentError: naming ``where`` and the limit.
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else None
        )
        if children is None:
            continue
        if depth > MAX_JSON_DEPTH:
            raise _too_deep(where)
        stack.extend((child, depth + 1) for child in children)


def _json_obj(text: str, where: str) -> dict[str, Any]:
    """The JSON object ``text`` holds ({} when empty).

    Raises:
        InvalidArgumentError: naming ``where`` when ``text`` is not JSON, not an object, or nests deeper than
            :data:`MAX_JSON_DEPTH`.
    """
    if not text:
        return {}
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(where) from None
    except ValueError as e:
        raise InvalidArgumentError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{where} must be a JSON object, got {type(value).__name__}")
    _check_depth(value, where)
    return value


def _json_text(value: Any, where: str) -> str:
    """A ``metadata``/``info`` dict as JSON object text ("" when empty).

    Raises:
        InvalidArgumentError: naming ``where`` (and the key path of the first bad value) when ``value`` is not a
            dict, or holds something JSON cannot carry (a set, bytes, an object, a non-text key, a cycle, a NaN or
            infinite float, two keys of one dict that JSON writes as one, such as ``1`` and ``"1"``), or nests
            deeper than :data:`MAX_JSON_DEPTH`.
    """
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"{where} must be a dict (a JSON object), got {type(value).__name__}")
    if not value:
        return ""
    try:
        # NaN and Infinity are not JSON: other languages' parsers refuse them
        text = json.dumps(value, allow_nan=False)
    except RecursionError:
        raise _too_deep(where) from None
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{where}{_bad_json_path(value)} is not JSON: {e}") from None
    _check_depth(value, where)  # before the recursive walk below
    clash = _key_clash(value, where)
    if clash:
        raise InvalidArgumentError(f"{clash}: a reader would keep only one of them")
    return text


def _key_clash(value: Any, path: str) -> str:
    """Where a dict below ``value`` has two keys JSON writes as one (``{1: "a", "1": "b"}``: both ``"1"``), ""
    if none does (``value`` is known to be JSON-serializable and acyclic)."""
    if isinstance(value, dict):
        names: dict[str, Any] = {}
        for k in value:
            name = k if isinstance(k, str) else json.dumps(k)  # how json.dumps writes a non-text key
            if name in names:
                return f"{path} has the keys {names[name]!r} and {k!r}, which JSON writes as the same key {name!r}"
            names[name] = k
        children: Any = value.items()
    elif isinstance(value, (list, tuple)):
        children = enumerate(value)
    else:
        return ""
    for k, v in children:
        clash = _key_clash(v, f"{path}[{k!r}]")
        if clash:
            return clash
    return ""


_JSON_LEAVES = (str, int, float, bool, type(None))


def _bad_json_path(value: Any, seen: frozenset[int] = frozenset()) -> str:
    """Key path (``["a"][0]``) of the first value below ``value`` that JSON cannot carry, "" if none found."""
    if id(value) in seen:
        return " (a reference to itself)"
    if isinstance(value, dict):
        items = list(value.items())
        bad_key = next((k for k, _ in items if not isinstance(k, _JSON_LEAVES)), _UNSET)
        if bad_key is not _UNSET:
            return f" key {bad_key!r}"
    elif isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    else:
        if isinstance(value, float) and not math.isfinite(value):
            return f" value {value!r} (JSON has no NaN or Infinity: write None or a string)"
        return "" if isinstance(value, _JSON_LEAVES) else f" value {type(value).__name__}"
    for k, v in items:
        inner = _bad_json_path(v, seen | {id(value)})
        if inner:
            return f"[{k!r}]{inner}"
    return ""


_UNSET = object()
#: (proto field, dataclass attribute) of the scalars copied from a Trajectory / a Turn.
_TRAJECTORY_SCALARS = (
    ("episode_id", "episode_id"), ("session", "session"), ("agent_id", "agent_id"), ("role", "role"),
    ("policy_version", "policy_version"), ("created_at_s", "created_at"), ("group_id", "group_id"),
    ("group_size", "group_size"),
)  # fmt: skip
_TURN_SCALARS = (
    ("step", "step"), ("terminated", "terminated"), ("truncated", "truncated"), ("prompt_text", "prompt_text"),
    ("response_text", "response_text"),
)  # fmt: skip


def _set(msg: Any, name: str, value: Any, where: str) -> None:
    """``msg.name = value``; None leaves an optional field unset.

    Raises:
        InvalidArgumentError: naming ``where`` and the value when the proto field refuses it (wrong type, out of
            its integer range).
    """
    if value is None and msg.DESCRIPTOR.fields_by_name[name].has_presence:
        return
    try:
        setattr(msg, name, value)
    except (TypeError, ValueError) as e:
        raise InvalidArgumentError(f"{where} cannot be {value!r} ({type(value).__name__}): {e}") from None


def _copy_scalars(msg: Any, obj: Any, fields: tuple[tuple[str, str], ...], where: str) -> None:
    """Set ``msg``'s fields from ``obj``'s attributes, each checked by :func:`_set` (named ``where.attr``)."""
    for name, attr in fields:
        _set(msg, name, getattr(obj, attr), f"{where}.{attr}")


_SWAP = sys.byteorder != "little"


def _pack(typecode: str, values) -> bytes:
    arr = array(typecode, values)
    if _SWAP:
        arr.byteswap()
    return arr.tobytes()


def _pack_ids(values, where: str) -> bytes:
    """Token ids as packed int32 bytes.

    A bool is an int to Python and to ``array``: ``True`` packs as 1 (checking every id's type would double the
    cost of packing, the client's CPU being what bounds insert throughput).

    Raises:
        InvalidArgumentError: naming ``where`` and the first id that is not an integer in int32.
    """
    values = list(values) if isinstance(values, Iterator) else values
    try:
        return _pack("i", values)
    except (OverflowError, TypeError):
        raise _bad_ids(values, where) from None


def _extend_ids(field: Any, values, where: str) -> None:
    """Append token ids to a repeated int32 field (protobuf refuses a bool there).

    Raises:
        InvalidArgumentError: naming ``where`` and the first id that is not an integer in int32, a bool included
            (protobuf's own TypeError or ValueError names no field).
    """
    try:
        field.extend(values)
    except (TypeError, ValueError):
        raise _bad_ids(values, where) from None


def _bad_ids(values, where: str) -> InvalidArgumentError:
    """The error naming ``where`` and the first of ``values`` that is not an integer in int32."""
    seen = () if isinstance(values, Iterator) else values  # a spent iterator cannot be looked at again
    bad = next(
        (
            x
            for x in seen
            if isinstance(x, bool) or not isinstance(x, numbers.Integral) or not -(2**31) <= int(x) < 2**31
        ),
        _NONE_FOUND,
    )
    what = f"holds {bad!r}," if bad is not _NONE_FOUND else "holds a value that is"
    return InvalidArgumentError(f"{where} {what} not an integer in int32")


_NONE_FOUND = object()


def _unpack(typecode: str, raw: bytes, where: str) -> list:
    if len(raw) % 4:
        raise InvalidArgumentError(f"{where} has {len(raw)} bytes, not a multiple of 4")
    arr = array(typecode)
    arr.frombytes(raw)
    if _SWAP:
        arr.byteswap()
    return arr.tolist()


def _ids(m: pb.Turn, name: str, i: int) -> list[int]:
    packed = getattr(m, f"{name}_i32le")
    return _unpack("i", packed, f"trajectory.turns[{i}].{name}_i32le") if packed else list(getattr(m, name))


def _id_view(m: pb.Turn, name: str, i: int) -> Sequence[int]:
    """The token ids of field ``name`` of turn ``i`` without a copy where the machine is little-endian (a view of
    the packed bytes, or the repeated field itself)."""
    packed = getattr(m, f"{name}_i32le")
    if not packed:
        return getattr(m, name)
    if _SWAP or len(packed) % 4:
        return _ids(m, name, i)
    return memoryview(packed).cast("i")


def _logprobs(m: pb.Turn, i: int) -> list[float]:
    packed = m.response_logprobs_f32le
    if packed:
        return _unpack("f", packed, f"trajectory.turns[{i}].response_logprobs_f32le")
    return list(m.response_logprobs)


def trajectory_to_proto(t: Trajectory, packed: bool = True) -> pb.Trajectory:
    """Dataclass -> proto (``info``/``metadata`` become JSON text).

    Args:
        t: The trajectory.
        packed: Write token ids and logprobs to the packed ``*_i32le``/``*_f32le`` fields (fast) instead of the
            repeated fields.

    Raises:
        InvalidArgumentError: naming the field: a token id that does not fit in int32 (packed form), a field of
            the wrong type or out of its proto range, a turn that is not a :class:`Turn`, a ``metadata`` or
            ``info`` that is not a dict JSON can carry (with the key path of the bad value).
    """
    msg = pb.Trajectory(metadata_json=_json_text(t.metadata, "trajectory.metadata"))
    _copy_scalars(msg, t, _TRAJECTORY_SCALARS, "trajectory")
    _set(msg, "episode_return", t.episode_return, "trajectory.episode_return")
    if not isinstance(t.turns, (list, tuple)):
        raise InvalidArgumentError(f"trajectory.turns must be a list of Turn, got {type(t.turns).__name__}")
    for i, turn in enumerate(t.turns):
        if not isinstance(turn, Turn):
            raise InvalidArgumentError(f"trajectory.turns[{i}] must be a Turn, got {type(turn).__name__}")
        m = msg.turns.add(info_json=_json_text(turn.info, f"trajectory.turns[{i}].info"))
        _copy_scalars(m, turn, _TURN_SCALARS, f"trajectory.turns[{i}]")
        if packed:
            m.prompt_token_ids_i32le = _pack_ids(
                turn.prompt_token_ids, f"trajectory.turns[{i}].prompt_token_ids"
            )
            m.response_token_ids_i32le = _pack_ids(
                turn.response_token_ids, f"trajectory.turns[{i}].response_token_ids"
            )
            try:
                m.response_logprobs_f32le = _pack("f", turn.response_logprobs)
            except TypeError:
                bad = next((x for x in turn.response_logprobs if not isinstance(x, numbers.Real)), None)
                raise InvalidArgumentError(
                    f"trajectory.turns[{i}].response_logprobs holds {bad!r}, not a number"
                ) from None
        else:
            _extend_ids(m.prompt_token_ids, turn.prompt_token_ids, f"trajectory.turns[{i}].prompt_token_ids")
            _extend_ids(
                m.response_token_ids, turn.response_token_ids, f"trajectory.turns[{i}].response_token_ids"
            )
            m.response_logprobs.extend(turn.response_logprobs)
        _set(m, "reward", turn.reward, f"trajectory.turns[{i}].reward")
        _set(m, "policy_version", turn.policy_version, f"trajectory.turns[{i}].policy_version")
        if turn.response_mask:
            if any(x not in (0, 1) for x in turn.response_mask):
                raise InvalidArgumentError(
                    f"trajectory.turns[{i}].response_mask holds values other than 0 and 1"
                )
            m.response_mask = bytes(turn.response_mask)
    return msg


def trajectory_from_proto(msg: pb.Trajectory) -> Trajectory:
    """Proto -> dataclass.

    Raises:
        InvalidArgumentError: when ``info_json`` or ``metadata_json`` is not a JSON object.
    """
    turns = [
        Turn(
            step=m.step,
            prompt_token_ids=_ids(m, "prompt_token_ids", i),
            response_token_ids=_ids(m, "response_token_ids", i),
            response_logprobs=_logprobs(m, i),
            reward=m.reward if m.HasField("reward") else None,
            terminated=m.terminated,
            truncated=m.truncated,
            info=_json_obj(m.info_json, f"trajectory.turns[{i}].info_json"),
            prompt_text=m.prompt_text,
            response_text=m.response_text,
            policy_version=m.policy_version if m.HasField("policy_version") else None,
            response_mask=list(m.response_mask),
        )
        for i, m in enumerate(msg.turns)
    ]
    return Trajectory(
        episode_id=msg.episode_id, session=msg.session, agent_id=msg.agent_id, role=msg.role,
        policy_version=msg.policy_version, turns=turns,
        metadata=_json_obj(msg.metadata_json, "trajectory.metadata_json"), created_at=msg.created_at_s,
        group_id=msg.group_id, episode_return=msg.episode_return if msg.HasField("episode_return") else None,
        group_size=msg.group_size,
    )  # fmt: skip


def summarize_proto(msg: pb.Trajectory) -> TrajectorySummary:
    """Validate a proto trajectory and return its summary, without copying token arrays (on a little-endian
    machine).

    Raises:
        InvalidArgumentError: naming the field: empty ``episode_id``/``agent_id``, negative
            ``policy_version`` or ``created_at_s``, decreasing or negative ``step``, a negative token id, logprobs
            whose count is neither 0 nor the response length, non-finite ``reward`` or logprobs, ``metadata_json`` or
            ``info_json`` that is not a JSON object.
    """
    check_identity(msg.episode_id, msg.agent_id, msg.policy_version)
    _json_obj(msg.metadata_json, "trajectory.metadata_json")  # a sampler must be able to read it back
    if not (math.isfinite(msg.created_at_s) and msg.created_at_s >= 0):
        raise InvalidArgumentError(f"trajectory.created_at_s must be finite and >= 0, got {msg.created_at_s}")
    if msg.HasField("episode_return") and not math.isfinite(msg.episode_return):
        raise InvalidArgumentError(f"trajectory.episode_return must be finite, got {msg.episode_return}")
    prompt, resp, lps, rewards = [], [], [], []
    last = -1
    for i, t in enumerate(msg.turns):
        if t.step < 0 or t.step < last:
            raise InvalidArgumentError(
                f"trajectory.turns[{i}].step must be >= 0 and non-decreasing, got {t.step}"
            )
        last = t.step
        _json_obj(t.info_json, f"trajectory.turns[{i}].info_json")
        for name in ("prompt_token_ids_i32le", "response_token_ids_i32le", "response_logprobs_f32le"):
            packed = getattr(t, name)
            if len(packed) % 4:
                raise InvalidArgumentError(
                    f"trajectory.turns[{i}].{name} has {len(packed)} bytes, not a multiple of 4"
                )
            if packed and len(getattr(t, name.rsplit("_", 1)[0])):
                raise InvalidArgumentError(f"trajectory.turns[{i}] sets both {name} and its repeated field")
        for name in ("prompt_token_ids", "response_token_ids"):
            check_token_ids(f"trajectory.turns[{i}].{name}", _id_view(t, name, i))
        n_prompt = len(t.prompt_token_ids) or len(t.prompt_token_ids_i32le) // 4
        n_resp = len(t.response_token_ids) or len(t.response_token_ids_i32le) // 4
        n_lp = len(t.response_logprobs) or len(t.response_logprobs_f32le) // 4
        if n_lp not in (0, n_resp):
            raise InvalidArgumentError(
                f"trajectory.turns[{i}].response_logprobs has {n_lp} values but response_token_ids has {n_resp}"
            )
        if n_lp and not math.isfinite(sum(_logprobs(t, i))):
            raise InvalidArgumentError(f"trajectory.turns[{i}].response_logprobs contains a non-finite value")
        has_reward = t.HasField("reward")
        if has_reward and not math.isfinite(t.reward):
            raise InvalidArgumentError(f"trajectory.turns[{i}].reward must be finite, got {t.reward}")
        if t.HasField("policy_version") and t.policy_version < msg.policy_version:
            raise InvalidArgumentError(
                f"trajectory.turns[{i}].policy_version ({t.policy_version}) is below the trajectory's "
                f"policy_version ({msg.policy_version}), which must be the oldest version of its turns"
            )
        if t.response_mask and len(t.response_mask) != n_resp:
            raise InvalidArgumentError(
                f"trajectory.turns[{i}].response_mask has {len(t.response_mask)} values but "
                f"response_token_ids has {n_resp}"
            )
        if t.response_mask and set(t.response_mask) - {0, 1}:
            raise InvalidArgumentError(f"trajectory.turns[{i}].response_mask holds values other than 0 and 1")
        prompt.append(n_prompt)
        resp.append(n_resp)
        lps.append(n_lp)
        rewards.append(has_reward)
    return TrajectorySummary(
        episode_id=msg.episode_id, session=msg.session, agent_id=msg.agent_id, role=msg.role,
        policy_version=msg.policy_version, created_at=msg.created_at_s, num_turns=len(msg.turns),
        prompt_lengths=tuple(prompt), response_lengths=tuple(resp), logprob_lengths=tuple(lps),
        rewards_present=tuple(rewards), group_id=msg.group_id, group_size=msg.group_size,
    )  # fmt: skip


def encode_proto(msg: pb.Trajectory, chunk_bytes: int) -> pb.EncodedTrajectory:
    """Serialize and compress a proto trajectory into chunks (client side, or server side for typed inserts)."""
    return pb.EncodedTrajectory(
        chunks=compress_chunks(msg.SerializeToString(), chunk_bytes), encoding=pb.ENCODING_PROTO_ZSTD
    )


def decode_encoded(enc: pb.EncodedTrajectory, max_bytes: int, limit: str = "max_item_bytes") -> pb.Trajectory:
    """Decompress and parse an encoded trajectory; ``limit`` names ``max_bytes`` in a refusal (with its setting,
    e.g. ``"max_item_bytes (MARTI_STORE_MAX_ITEM_BYTES)"``).

    Raises:
        InvalidArgumentError: for an unknown encoding, a bad zstd frame, more than ``max_bytes`` of output (naming
            ``limit``) or bytes that are not a Trajectory.
    """
    if enc.encoding not in (pb.ENCODING_UNSPECIFIED, pb.ENCODING_PROTO_ZSTD):
        raise InvalidArgumentError(f"unknown trajectory encoding {enc.encoding}")
    raw = decompress_chunks(enc.chunks, max_bytes, limit)
    msg = pb.Trajectory()
    try:
        msg.ParseFromString(raw)
    except Exception as e:  # protobuf raises DecodeError (a plain Exception subclass)
        raise InvalidArgumentError(f"payload is not a serialized Trajectory: {e}") from None
    return msg


def read_item(
    item: pb.SampledItem | pb.StoredItem, max_bytes: int, limit: str = "max_item_bytes"
) -> pb.Trajectory:
    """The trajectory of a sampled or stored item, in either form it may come in: encoded (decompressed, at most
    ``max_bytes``: :func:`decode_encoded`) or typed (its serialized size at most ``max_bytes``, checked as a
    decompressed payload is: :func:`~marti.codec.chunks.check_payload_bytes`).

    Args:
        item: A ``SampledItem`` or ``StoredItem`` of a response.
        max_bytes: Largest trajectory accepted, bytes (uncompressed, serialized).
        limit: How a refusal names ``max_bytes``.

    Raises:
        InvalidArgumentError: The trajectory is over ``max_bytes``, its encoding is bad, or the item holds none;
            the message names the item (key and table) and, for the size, ``limit=max_bytes``.
    """
    which = item.WhichOneof("data")
    try:
        if which == "encoded":
            return decode_encoded(item.encoded, max_bytes, limit)
        if which == "trajectory":
            check_payload_bytes(item.trajectory.ByteSize(), max_bytes, limit)
            return item.trajectory
        raise InvalidArgumentError("it holds neither a trajectory nor an encoded trajectory")
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"item {item.key} of table {item.table!r}: {e.message}") from None


def item_payload(
    item: pb.InsertItem, max_bytes: int, chunk_bytes: int, limit: str = "max_item_bytes"
) -> tuple[bytes, TrajectorySummary]:
    """Return the stored payload and the validated summary of an InsertItem; ``limit`` names ``max_bytes`` (the
    largest uncompressed trajectory) in a refusal.

    Raises:
        InvalidArgumentError: when the item has no trajectory, the trajectory is invalid or larger than
            ``max_bytes`` uncompressed.
    """
    which = item.WhichOneof("data")
    if which == "encoded":
        msg = decode_encoded(item.encoded, max_bytes, limit)
        return pack_chunks(item.encoded.chunks), summarize_proto(msg)
    if which == "trajectory":
        summary = summarize_proto(item.trajectory)
        raw = item.trajectory.SerializeToString()
        check_payload_bytes(len(raw), max_bytes, limit)
        return pack_chunks(compress_chunks(raw, chunk_bytes)), summary
    raise InvalidArgumentError("insert item has neither a trajectory nor an encoded trajectory")


def payload_into(payload: bytes, fmt: int, target: Any, max_bytes: int) -> None:
    """Put a stored payload into ``target`` (SampledItem or StoredItem) in the requested PayloadFormat."""
    if fmt == pb.PAYLOAD_FORMAT_TYPED:
        target.trajectory.CopyFrom(
            decode_encoded(pb.EncodedTrajectory(chunks=unpack_chunks(payload)), max_bytes)
        )
    else:
        target.encoded.chunks.extend(unpack_chunks(payload))
        target.encoded.encoding = pb.ENCODING_PROTO_ZSTD


def filter_from_proto(f: pb.SampleFilter) -> SampleFilter:
    """Proto filter -> domain filter (raises InvalidArgumentError for a negative max_age_s)."""
    if f.max_age_s < 0 or not math.isfinite(f.max_age_s):
        raise InvalidArgumentError(f"filter.max_age_s must be finite and >= 0, got {f.max_age_s}")
    return SampleFilter(frozenset(f.agent_ids), frozenset(f.roles), f.min_policy_version, f.max_age_s)


def filter_to_proto(f: SampleFilter) -> pb.SampleFilter:
    """Domain filter -> proto."""
    return pb.SampleFilter(
        agent_ids=sorted(f.agent_ids), roles=sorted(f.roles), min_policy_version=f.min_policy_version,
        max_age_s=f.max_age_s,
    )  # fmt: skip


_OPTIONAL_TABLE = (
    "priority_exponent", "importance_beta", "max_size", "max_bytes", "max_times_sampled", "max_policy_lag",
)  # fmt: skip


def table_config_from_proto(msg: pb.TableConfig) -> TableConfig:
    """Proto table config -> validated domain config (unset fields take defaults).

    Raises:
        InvalidArgumentError: naming the bad field.
    """
    d: dict[str, Any] = {"name": msg.name}
    for f in ("preset", "sampler", "remover", "full_policy"):
        if getattr(msg, f):
            d[f] = getattr(msg, f)
    for f in _OPTIONAL_TABLE:
        if msg.HasField(f):
            d[f] = getattr(msg, f)
    if msg.HasField("rate_limiter"):
        r = msg.rate_limiter
        rl: dict[str, Any] = {"kind": r.kind or "min_size"}
        if r.min_size_to_sample:
            rl["min_size_to_sample"] = r.min_size_to_sample
        if r.samples_per_insert:
            rl["samples_per_insert"] = r.samples_per_insert
        rl["error_buffer"] = r.error_buffer
        rl["size"] = r.size or d.get("max_size", 1000)
        if r.HasField("min_diff"):
            rl["min_diff"] = r.min_diff
        if r.HasField("max_diff"):
            rl["max_diff"] = r.max_diff
        d["rate_limiter"] = rl
    if msg.HasField("signature"):
        s = msg.signature
        sig: dict[str, Any] = {
            "agent_ids": list(s.agent_ids), "roles": list(s.roles), "min_policy_version": s.min_policy_version,
            "require_rewards": s.require_rewards, "require_logprobs": s.require_logprobs,
        }  # fmt: skip
        for f in ("max_turns", "max_prompt_tokens", "max_response_tokens"):
            if s.HasField(f):
                sig[f] = getattr(s, f)
        d["signature"] = sig
    return parse_table_config(d)


def table_config_to_proto(c: TableConfig) -> pb.TableConfig:
    """Domain table config -> proto (every field set)."""
    r, s = c.rate_limiter, c.signature
    rl = pb.RateLimiterConfig(
        kind=r.kind, min_size_to_sample=r.min_size_to_sample, samples_per_insert=r.samples_per_insert,
        error_buffer=r.error_buffer, size=r.size,
    )  # fmt: skip
    if math.isfinite(r.min_diff):
        rl.min_diff = r.min_diff
    if math.isfinite(r.max_diff):
        rl.max_diff = r.max_diff
    sig = pb.Signature(
        agent_ids=s.agent_ids, roles=s.roles, min_policy_version=s.min_policy_version,
        require_rewards=s.require_rewards, require_logprobs=s.require_logprobs,
    )  # fmt: skip
    for f in ("max_turns", "max_prompt_tokens", "max_response_tokens"):
        if getattr(s, f) is not None:
            setattr(sig, f, getattr(s, f))
    out = pb.TableConfig(
        name=c.name, preset=c.preset or "", sampler=c.sampler, remover=c.remover,
        priority_exponent=c.priority_exponent, importance_beta=c.importance_beta, max_size=c.max_size,
        max_bytes=c.max_bytes, max_times_sampled=c.max_times_sampled, full_policy=c.full_policy,
        rate_limiter=rl, signature=sig,
    )  # fmt: skip
    if c.max_policy_lag is not None:
        out.max_policy_lag = c.max_policy_lag
    return out


def table_info_to_proto(info: dict[str, Any], config: TableConfig) -> pb.TableInfo:
    """``Table.info()`` dict -> proto."""
    c = info["counters"]
    return pb.TableInfo(
        name=info["name"], size=info["size"], num_bytes=info["num_bytes"], inserts=c["inserts"],
        samples=c["samples"], deletes=c["deletes"], evictions=c["evictions"],
        priority_updates=c["priority_updates"], priority_updates_missing=c["priority_updates_missing"],
        waiting_inserts=info["waiting_inserts"], waiting_samples=info["waiting_samples"],
        rate_limiter_diff=info["rate_limiter"]["diff"], config=table_config_to_proto(config),
        stale_removed=c["stale_removed"],
    )  # fmt: skip
