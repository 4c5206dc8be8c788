"""Argument checks of the broker SDK: every public argument of both clients is checked here, before any rpc,
and a bad one raises :class:`~marti.errors.InvalidArgumentError` naming it (never a raw ``TypeError`` or
``ValueError`` from deeper down).

:func:`check_client_args` checks a constructor's arguments; the ``*_arg`` helpers check one argument of a
method and return it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from marti.codec import broker as broker_codec
from marti.errors import InvalidArgumentError
from marti.plumbing.arguments import check_text
from marti.rpc.client.channel import MAX_TIMEOUT_S

#: Largest count a request field holds (``uint32``: ``max_messages``, ``max_unacked``...).
UINT32_MAX = 2**32 - 1
#: Longest ``ttl_s`` of a message (10 years; its ``ttl_ms`` must fit the field), seconds.
MAX_TTL_S = 10 * 365 * 24 * 3600.0


def _shown(value: Any) -> str:
    """``value`` as an error message shows it: its type and a short repr."""
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def text_arg(name: str, value: Any) -> str:
    """A non-empty string argument (an agent id, a session, a topic) that UTF-8 can carry (no lone surrogate)."""
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"{name} must be a non-empty string, got {_shown(value)}")
    return check_text(value, name)


def count_arg(name: str, value: Any, minimum: int = 0, maximum: int | None = UINT32_MAX) -> int:
    """An integer argument in ``[minimum, maximum]`` (a bool is not a count; ``maximum`` None: no bound)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise InvalidArgumentError(f"{name} must be an integer {bound}, got {_shown(value)}")
    return value


def batch_count_arg(name: str, value: Any) -> int:
    """A per-call message count (``max_messages``, ``max_batch_messages``) in ``[1, UINT32_MAX]``, or None: the
    broker's default (sent as 0: its ``default_batch_messages``, 256, at most its own ``max_batch_messages``), so
    a call with the default count works on any broker. An explicit count over the broker's
    ``max_batch_messages`` is refused by the broker (``InvalidArgumentError`` naming both)."""
    return 0 if value is None else count_arg(name, value, 1)


def seconds_arg(name: str, value: Any, maximum: float = MAX_TIMEOUT_S) -> float:
    """A number of seconds in ``[0, maximum]``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= maximum:
        raise InvalidArgumentError(
            f"{name} must be a number of seconds in [0, {maximum:.0f}], got {_shown(value)}"
        )
    return float(value)


def flag_arg(name: str, value: Any) -> bool:
    """A bool argument."""
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be True or False, got {_shown(value)}")
    return value


def texts_arg(name: str, value: Any) -> list[str]:
    """A list (or tuple) of non-empty strings; one string alone is refused (it would be read letter by
    letter)."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence | set | frozenset):
        raise InvalidArgumentError(f"{name} must be a list of non-empty strings, got {_shown(value)}")
    return [text_arg(f"{name}[{i}]", v) for i, v in enumerate(value)]


def content_type_arg(value: Any) -> str | None:
    """``content_type``: None (the default for the payload) or a non-empty string."""
    return None if value is None else text_arg("content_type", value)


def version_arg(value: Any) -> int | None:
    """``expected_version``: None (no compare-and-set) or an integer >= 0."""
    return None if value is None else count_arg("expected_version", value, 0, 2**63 - 1)


def _optional(name: str, value: Any, ok: bool, want: str) -> None:
    if value is not None and not ok:
        raise InvalidArgumentError(f"{name} must be {want} or None, got {_shown(value)}")


def check_client_args(args: dict[str, Any]) -> None:
    """Checks the arguments of a client's constructor (``MartiCommClient`` and its asyncio twin).

    Args:
        args: The constructor's arguments by name (``address``, ``timeout_s`` and the token's printable form
            are checked by :func:`marti.rpc.client.channel.make_channel`).

    Raises:
        InvalidArgumentError: The first bad argument, named with the value it got.
    """
    text_arg("agent_id", args["agent_id"])
    text_arg("session", args["session"])
    texts_arg("topics", args["topics"])
    count_arg("batching_size", args["batching_size"], 1, None)
    count_arg("max_batch_bytes", args["max_batch_bytes"], 1, None)
    seconds_arg("update_frequency_s", args["update_frequency_s"])
    count_arg("compression_level", args["compression_level"], broker_codec.MIN_LEVEL, broker_codec.MAX_LEVEL)
    count_arg("max_frame_bytes", args["max_frame_bytes"], 1, None)
    count_arg("dedup_memory", args["dedup_memory"], 0, None)
    for flag in ("auto_ack", "use_dictionary", "send_when_idle"):
        flag_arg(flag, args[flag])
    _optional("token", args["token"], isinstance(args["token"], str), "a string")
    tls = args["tls_ca_file"]
    _optional("tls_ca_file", tls, isinstance(tls, str | os.PathLike), "a path")
    _optional("on_error", args["on_error"], callable(args["on_error"]), "a callable")
    channel = args["channel"]
    _optional("channel", channel, callable(getattr(channel, "unary_unary", None)), "a grpc channel")
