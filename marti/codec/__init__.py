"""Conversions between the wire (protobuf messages, compressed bytes) and the SDK's domain types, per area.

The SDK clients (:mod:`marti.clients`) and, where the logic is the same, the services import these modules,
so each conversion is written once:

* :mod:`marti.codec.broker`: broker payloads (JSON/bytes) and zstd frames.
* :mod:`marti.codec.chunks`: trajectories <-> zstd-compressed, chunked payloads.
* :mod:`marti.codec.env`: env values, tensors and spaces <-> ``marti.api.env.v1`` messages.
* :mod:`marti.codec.experience`: ``marti.api.experience.v1`` messages <-> store domain types.
* :mod:`marti.codec.inference`: ``marti.api.inference.v1`` requests and responses <-> inference types.
"""
