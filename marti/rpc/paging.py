"""Cutting a stream's items into messages bounded by count and by bytes, so that no message goes over the
channel's ``max_message_bytes`` (gRPC refuses such a message with a bare RESOURCE_EXHAUSTED; the store client's
insert stream and the store's Sample/GetAll responses use this)."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import Message

#: Bytes a message keeps free for what is not an item (its other fields), at most.
ENVELOPE_BYTES = 64 * 1024
#: Bytes a repeated message field adds around each item: its tag and its length (a varint of up to 10 bytes).
_FIELD_BYTES = 11


def message_budget(max_message_bytes: int) -> int:
    """The item bytes one message may carry under ``max_message_bytes``: the limit less room for the envelope
    (:data:`ENVELOPE_BYTES`, or half the limit when that is smaller)."""
    return max_message_bytes - min(ENVELOPE_BYTES, max_message_bytes // 2)


def item_bytes(item: Message) -> int:
    """Bytes ``item`` adds to a message as one element of a repeated field (its encoding, tag and length)."""
    return item.ByteSize() + _FIELD_BYTES


def pages(sizes: Sequence[int], max_items: int, max_bytes: int) -> list[range]:
    """Cut items of these ``sizes`` (bytes, in order) into consecutive pages of at most ``max_items`` items whose
    sizes add up to at most ``max_bytes``; an item alone over ``max_bytes`` gets a page of its own (the caller
    refuses it first: it cannot be sent). No items: no pages.

    Returns:
        The pages' index ranges, in order, covering every item once.
    """
    out: list[range] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= max_items or total + size > max_bytes):
            out.append(range(start, i))
            start, total = i, 0
        total += size
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out
