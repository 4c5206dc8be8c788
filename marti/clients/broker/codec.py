"""Payload codec of the broker SDK: JSON values and bytes <-> payload bytes with a content type.

Nothing is ever pickled or evaluated. (Frame compression is :mod:`marti.clients.broker_codec`.)
"""

from __future__ import annotations

import json
from typing import Any

try:  # orjson: about 7x faster than the stdlib json on 1 KB agent messages, same compact output
    import orjson
except ImportError:  # pragma: no cover - orjson is a declared dependency; stdlib fallback
    orjson = None

from marti.errors import InvalidArgumentError

JSON = "application/json"
OCTET_STREAM = "application/octet-stream"


def encode_payload(message: Any, content_type: str | None = None) -> tuple[bytes, str]:
    """Turns a message into payload bytes and a content type.

    Args:
        message: ``bytes``/``bytearray``/``memoryview`` (sent as is) or any JSON-serializable value.
        content_type: Overrides the type (defaults: ``application/octet-stream`` for bytes,
            ``application/json`` otherwise).

    Returns:
        ``(payload, content_type)``.

    Raises:
        InvalidArgumentError: The value is not JSON-serializable (never pickled).

    JSON is written compactly in UTF-8 by orjson (non-string dict keys become strings, as with the stdlib);
    NaN and infinities, which JSON cannot represent, become ``null``.
    """
    if isinstance(message, bytes | bytearray | memoryview):
        return bytes(message), content_type or OCTET_STREAM
    if orjson is not None:
        try:
            return orjson.dumps(message, option=orjson.OPT_NON_STR_KEYS), content_type or JSON
        except TypeError:  # e.g. an int beyond 64 bits: the stdlib handles it, or names the problem
            pass
    try:
        data = _JSON_ENCODE(message).encode()
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"message of type {type(message).__name__} is not JSON-serializable: {exc}"
        ) from None
    return data, content_type or JSON


_JSON_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_JSON_LOADS = orjson.loads if orjson is not None else json.loads


def decode_payload(payload: bytes, content_type: str) -> Any:
    """Inverse of :func:`encode_payload`: JSON types are parsed, anything else stays bytes.

    Raises:
        InvalidArgumentError: A payload declared as JSON does not parse.
    """
    if content_type == JSON or content_type.split(";")[0].strip() == JSON:
        if not payload:
            return None
        try:
            return _JSON_LOADS(payload)
        except ValueError as exc:
            raise InvalidArgumentError(f"payload declared {JSON} does not parse: {exc}") from None
    return payload
