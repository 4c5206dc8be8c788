"""Conversions between the wire (protobuf messages, compressed chunks) and the SDK's domain types.

* :mod:`marti.codec.chunks`: trajectories <-> zstd-compressed, chunked payloads.
* :mod:`marti.codec.experience`: ``marti.api.experience.v1`` messages <-> store domain types.
"""
