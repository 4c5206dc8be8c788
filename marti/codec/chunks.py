"""Payload codec: serialized trajectories, chunked and zstd-compressed.

A payload is the serialized trajectory (protobuf ``marti.api.experience.v1.Trajectory`` on the gRPC path, JSON
in :class:`JsonTrajectoryCodec` for in-process use), cut into chunks of at most ``chunk_bytes`` uncompressed
bytes, each compressed as an independent zstd frame. Stored layout: for each chunk a 4-byte little-endian length
followed by the frame. Chunking bounds the memory of a single decompression and lets a large trajectory cross
gRPC as several frames under the message-size limit.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Sequence
from typing import Protocol

import zstandard

from marti.errors import InvalidArgumentError
from marti.types.trajectory import Trajectory, Turn

DEFAULT_CHUNK_BYTES = 256 * 1024
_LEN = struct.Struct("<I")
_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = getattr(_local, "c", None)
    if cache is None:
        cache = _local.c = {}
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level)
    return cache[level]


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "d", None)
    if d is None:
        d = _local.d = zstandard.ZstdDecompressor()
    return d


def compress_chunks(raw: bytes, chunk_bytes: int = DEFAULT_CHUNK_BYTES, level: int = 1) -> list[bytes]:
    """Cut ``raw`` into chunks of at most ``chunk_bytes`` and zstd-compress each.

    Args:
        raw: Serialized trajectory.
        chunk_bytes: Largest uncompressed chunk in bytes (>= 1).
        level: zstd level (1 = fastest).

    Returns:
        Compressed frames (at least one, even for empty input).

    Raises:
        InvalidArgumentError: when ``chunk_bytes`` < 1.
    """
    if chunk_bytes < 1:
        raise InvalidArgumentError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    c = _compressor(level)
    view = memoryview(raw)
    return [c.compress(view[i : i + chunk_bytes]) for i in range(0, max(len(raw), 1), chunk_bytes)]


def decompress_chunks(chunks: Sequence[bytes], max_bytes: int = 1 << 31, limit: str = "max_bytes") -> bytes:
    """Inverse of :func:`compress_chunks`.

    Args:
        chunks: zstd frames.
        max_bytes: Largest accepted uncompressed total in bytes.
        limit: How a refusal names the cap, e.g. ``"max_item_bytes"`` (it is followed by ``=max_bytes``).

    Raises:
        InvalidArgumentError: when a frame is not valid zstd or the output would exceed ``max_bytes`` (a frame
            that declares more, or one that declares no size and inflates past it: named as over the cap).
    """
    d = _decompressor()
    out, total = [], 0
    for i, ch in enumerate(chunks):
        try:
            # zstandard ignores max_output_size when the frame header declares a content size, so a small
            # frame claiming gigabytes would be inflated in full: refuse it from the header first.
            declared = zstandard.frame_content_size(ch) if ch else 0
            if declared > max_bytes - total:
                raise InvalidArgumentError(
                    f"payload chunk {i} declares {declared} uncompressed bytes; the payload would exceed "
                    f"{limit}={max_bytes}"
                )
            part = d.decompress(ch, max_output_size=max_bytes - total) if ch else b""
        except zstandard.ZstdError as e:
            if _inflates_past(d, ch, max_bytes - total):  # zstd's error at max_output_size: over the cap
                raise InvalidArgumentError(
                    f"payload chunk {i} decompresses to more than the {max_bytes - total} bytes left under "
                    f"{limit}={max_bytes}"
                ) from None
            raise InvalidArgumentError(f"payload chunk {i} is not a valid zstd frame: {e}") from None
        total += len(part)
        check_payload_bytes(total, max_bytes, limit)
        out.append(part)
    return b"".join(out)


def _inflates_past(d: zstandard.ZstdDecompressor, chunk: bytes, room: int) -> bool:
    """Whether zstd frame ``chunk`` decompresses to more than ``room`` bytes, reading at most ``room + 1`` of
    them, a MiB at a time (a frame whose header declares no size fails ``max_output_size`` with zstd's "did not
    decompress full frame", as a damaged one does). False for a frame that fails or ends before then."""
    reader, seen = d.stream_reader(chunk), 0
    try:
        while seen <= room:
            piece = reader.read(min(1 << 20, room + 1 - seen))
            if not piece:
                return False
            seen += len(piece)
    except zstandard.ZstdError:
        return False
    return True


def check_payload_bytes(size: int, max_bytes: int, limit: str = "max_bytes") -> None:
    """Refuse an uncompressed payload of ``size`` bytes over ``max_bytes`` (what :func:`decompress_chunks` checks
    as it decompresses, and what a payload that travels uncompressed is checked against).

    Args:
        size: The payload's uncompressed size (so far), bytes.
        max_bytes: Largest accepted uncompressed size, bytes.
        limit: How the refusal names the cap (followed by ``=max_bytes``).

    Raises:
        InvalidArgumentError: ``size > max_bytes``, naming ``size`` and ``limit=max_bytes``.
    """
    if size > max_bytes:
        raise InvalidArgumentError(f"payload of {size} bytes uncompressed is over {limit}={max_bytes}")


def pack_chunks(chunks: Sequence[bytes]) -> bytes:
    """Join compressed frames into the stored layout (length-prefixed frames)."""
    return b"".join(_LEN.pack(len(c)) + c for c in chunks)


def unpack_chunks(payload: bytes) -> list[bytes]:
    """Split a stored payload back into its compressed frames.

    Raises:
        InvalidArgumentError: when the layout is truncated.
    """
    out, i, n = [], 0, len(payload)
    view = memoryview(payload)
    while i < n:
        if i + 4 > n:
            raise InvalidArgumentError("stored payload is truncated (length prefix)")
        (length,) = _LEN.unpack_from(payload, i)
        i += 4
        if i + length > n:
            raise InvalidArgumentError("stored payload is truncated (frame)")
        out.append(bytes(view[i : i + length]))
        i += length
    return out


class TrajectoryCodec(Protocol):
    """Serializes trajectories to bytes and back (before compression)."""

    def encode(self, trajectory: Trajectory) -> bytes:
        """Return the serialized trajectory."""
        ...

    def decode(self, raw: bytes) -> Trajectory:
        """Return the trajectory (raises InvalidArgumentError on malformed input)."""
        ...


class JsonTrajectoryCodec:
    """JSON serialization of :class:`Trajectory`; used by the in-process store and core tests."""

    def encode(self, trajectory: Trajectory) -> bytes:
        """Return UTF-8 JSON of every field."""
        d = {
            "episode_id": trajectory.episode_id, "session": trajectory.session, "agent_id": trajectory.agent_id,
            "role": trajectory.role, "policy_version": trajectory.policy_version, "metadata": trajectory.metadata,
            "created_at": trajectory.created_at,
            "turns": [
                [t.step, t.prompt_token_ids, t.response_token_ids, t.response_logprobs, t.reward, t.terminated,
                 t.truncated, t.info, t.prompt_text, t.response_text]
                for t in trajectory.turns
            ],
        }  # fmt: skip
        return json.dumps(d, separators=(",", ":")).encode()

    def decode(self, raw: bytes) -> Trajectory:
        """Parse bytes produced by :meth:`encode`."""
        try:
            d = json.loads(raw)
            turns = [Turn(*t) for t in d.pop("turns")]
            return Trajectory(turns=turns, **d)
        except (ValueError, TypeError, KeyError) as e:
            raise InvalidArgumentError(f"payload is not a JSON trajectory: {e}") from None


def encode_payload(
    trajectory: Trajectory, codec: TrajectoryCodec, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> bytes:
    """Serialize, chunk, compress and pack a trajectory into the stored layout."""
    return pack_chunks(compress_chunks(codec.encode(trajectory), chunk_bytes))


def decode_payload(payload: bytes, codec: TrajectoryCodec) -> Trajectory:
    """Inverse of :func:`encode_payload`."""
    return codec.decode(decompress_chunks(unpack_chunks(payload)))
