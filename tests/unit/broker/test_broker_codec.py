"""The frame codec: round trips, dictionaries, and refusal of bombs, truncation and corruption."""

from __future__ import annotations

import json

import pytest
import zstandard

from marti.codec import broker as codec
from marti.errors import InvalidArgumentError, ResourceExhaustedError


def test_roundtrip_zstd_and_none():
    data = b"hello agents " * 100
    frame = codec.encode(data, "zstd", 3)
    assert len(frame) < len(data)
    assert codec.decode(frame, "zstd", len(data), len(data)) == data
    assert codec.decode(data, "none", len(data), len(data)) == data
    assert codec.decode(b"", "zstd", 0, 10) == b""
    assert codec.decode(codec.encode(b"", "zstd"), "zstd", 0, 10) == b""


def test_size_limit_edge_and_bomb_refused_before_decompressing():
    data = b"a" * 1000
    frame = codec.encode(data)
    assert codec.decode(frame, "zstd", 1000, 1000) == data  # exactly at the limit
    with pytest.raises(ResourceExhaustedError, match="max_frame_bytes=999"):
        codec.decode(frame, "zstd", 1000, 999)
    bomb = zstandard.ZstdCompressor().compress(b"\0" * 50_000_000)  # 50 MB in a few KB
    with pytest.raises(ResourceExhaustedError, match="max_frame_bytes"):
        codec.decode(bomb, "zstd", 100, 1_000_000)  # lies about its size: the header betrays it
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * 5_000_000)
    with pytest.raises(InvalidArgumentError):
        codec.decode(no_size, "zstd", 100, 1_000_000)  # output bounded by the declared size


def test_truncated_corrupt_and_mismatched_frames():
    data = json.dumps({"text": "x" * 500}).encode()
    frame = codec.encode(data)
    with pytest.raises(InvalidArgumentError, match="truncated"):
        codec.decode(frame[:-4], "zstd", len(data), 10_000)
    with pytest.raises(InvalidArgumentError):
        codec.decode(b"not a zstd frame at all", "zstd", 10, 10_000)
    with pytest.raises(InvalidArgumentError, match="declares"):
        codec.decode(frame, "zstd", len(data) - 1, 10_000)
    with pytest.raises(InvalidArgumentError, match="raw frame"):
        codec.decode(b"abc", "none", 4, 10)
    with pytest.raises(InvalidArgumentError, match="unknown codec"):
        codec.decode(b"abc", "lz4", 3, 10)
    with pytest.raises(InvalidArgumentError, match="level 23"):
        codec.encode(b"abc", "zstd", 23)


def test_dictionary_improves_small_messages():
    samples = [
        json.dumps(
            {"agent": f"agent_{i % 3}", "step": i, "text": f"I propose we allocate {i} units to task {i % 7}"}
        ).encode()
        for i in range(400)
    ]
    raw = codec.train_dictionary(samples, 4096)
    d = codec.load_dictionary(raw)
    assert codec.dictionary_id(raw) == d.dict_id() != 0
    msg = samples[5]
    with_dict = codec.encode(msg, "zstd", 3, d)
    assert len(with_dict) < len(codec.encode(msg, "zstd", 3))
    assert codec.decode(with_dict, "zstd", len(msg), 10_000, d) == msg
    with pytest.raises(InvalidArgumentError, match="at least 8"):
        codec.train_dictionary(samples[:3])
