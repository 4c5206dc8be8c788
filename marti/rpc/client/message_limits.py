"""The message-size limits of a client channel, and how a client tells a server the largest response it can take.

gRPC refuses a message over the receiving side's ``grpc.max_receive_message_length``; on a stream that refusal
ends the stream. A server that knows the client's limit can refuse a larger result in-band instead (the env
server does): the client sends its limit as the :data:`RECEIVE_LIMIT_KEY` metadata of a call
(:func:`receive_limit_metadata`), and the server reads it (:func:`client_receive_limit`).

:func:`marti.rpc.client.channel.make_channel` records the limits of every channel it makes (:func:`record_limits`);
:func:`send_limit` and :func:`receive_limit` read them back (``None`` for a channel made otherwise).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from marti.errors import InvalidArgumentError
from marti.rpc.client.guard import ClientChannel

#: The call metadata a client tells a server the largest response it can receive in, bytes (its channel's
#: ``grpc.max_receive_message_length``); ``-1`` means no limit. A call without it tells nothing.
RECEIVE_LIMIT_KEY = "marti-max-receive-bytes"

#: ``(send, receive)`` limits in bytes of each channel :func:`record_limits` saw; ``-1``: no limit, ``None``: unknown.
_LIMITS: weakref.WeakKeyDictionary[Any, tuple[int | None, int | None]] = weakref.WeakKeyDictionary()


def _limit(options: dict[str, Any], key: str) -> int | None:
    """``options[key]`` when it is a limit gRPC accepts (an int >= -1), else ``None``."""
    value = options.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        return None
    return value


def record_limits(channel: Any, options: Sequence[tuple[str, Any]]) -> Any:
    """Remember the send and receive limits of ``channel`` (its ``grpc.max_send_message_length`` and
    ``grpc.max_receive_message_length`` in ``options``, the channel arguments it was made with). Returns it.

    Each limit is recorded on its own: one that ``options`` lack (or hold as a value gRPC does not take: not an
    int >= -1) is unknown, and the other is still known.
    """
    opts = dict(options)
    send = _limit(opts, "grpc.max_send_message_length")
    receive = _limit(opts, "grpc.max_receive_message_length")
    if send is not None or receive is not None:
        _LIMITS[channel] = (send, receive)
    return channel


def _limits(channel: Any) -> tuple[int | None, int | None]:
    if isinstance(channel, ClientChannel):
        channel = channel.inner
    try:
        return _LIMITS.get(channel, (None, None))
    except TypeError:  # an object that cannot be weakly referenced was never recorded
        return (None, None)


def send_limit(channel: Any) -> int | None:
    """The largest message ``channel`` may send, bytes; ``None`` when unknown (a channel
    :func:`~marti.rpc.client.channel.make_channel` did not make, or one whose send limit option it could not
    read) or unlimited."""
    send = _limits(channel)[0]
    return None if send is None or send < 0 else send


def receive_limit(channel: Any) -> int | None:
    """The largest message ``channel`` may receive, bytes (``-1``: no limit); ``None`` when unknown (a channel
    :func:`~marti.rpc.client.channel.make_channel` did not make, or one whose receive limit option it could not
    read)."""
    return _limits(channel)[1]


def receive_limit_metadata(limit: int | None) -> tuple[tuple[str, str], ...]:
    """The call metadata telling a server ``limit``, the largest response the caller can receive in bytes:
    ``((RECEIVE_LIMIT_KEY, "N"),)``, or ``()`` when ``limit`` is ``None`` (unknown) or ``-1`` (no limit:
    the same as telling nothing)."""
    if limit is None or limit < 0:
        return ()
    return ((RECEIVE_LIMIT_KEY, str(limit)),)


def client_receive_limit(metadata: Iterable[tuple[str, Any]] | None) -> int | None:
    """The receive limit a caller told in its call ``metadata`` (:data:`RECEIVE_LIMIT_KEY`), bytes; ``None``
    when it told none or ``-1`` (no limit).

    Raises:
        InvalidArgumentError: The value is not an integer, or is negative other than ``-1``; the message names
            the key and the value.
    """
    for key, value in metadata or ():
        if key != RECEIVE_LIMIT_KEY:
            continue
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
        if not re.fullmatch(r"-1|[0-9]+", text):
            raise InvalidArgumentError(
                f"metadata {RECEIVE_LIMIT_KEY}={text!r:.80} is not a byte count: it must be an integer >= 0 "
                "(the largest response the client can receive, bytes) or -1 (no limit)"
            )
        limit = int(text)
        return None if limit == -1 else limit
    return None
