"""The episode and group ids of an HTTP call, from its path prefix or its headers, checked so that no id is ever
garbled or merged with another (see :mod:`services.gateway.http`, "Episode context")."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from fastapi import Request

from services.gateway.http.common.errors import request_error

#: Header naming the episode a call belongs to (a call without it is served but not recorded).
EPISODE_HEADER = "X-Marti-Episode"
#: Header naming the group of the episode (optional).
GROUP_HEADER = "X-Marti-Group"
#: A client's key of one call within its episode: a retry with the same key gets the first answer, recorded once.
IDEMPOTENCY_HEADER = "Idempotency-Key"


def read_header(request: Request, name: str) -> str:
    """The value of header ``name`` (``""`` when absent).

    Raises:
        InvalidArgumentError: The header is present but empty, or its value is not printable ASCII (bytes 0x20-0x7E): HTTP gives other bytes no
            character set (Starlette would read them as Latin-1), so an id sent that way is refused rather than
            garbled; non-ASCII ids go in the path, percent-encoded UTF-8.
    """
    value = request.headers.get(name)  # Latin-1: one character per byte
    if value is None:
        return ""
    if not value:  # sent but empty: never read as "no id" (an untraced call would silently train nothing)
        raise request_error(
            f"header {name} is empty; send an id, or leave the header out (a call without {EPISODE_HEADER} is "
            "served but not recorded for training)",
            name,
        )
    if not (value.isascii() and value.isprintable()):
        bad = next(c for c in value if not (c.isascii() and c.isprintable()))
        raise request_error(
            f"header {name} holds byte 0x{ord(bad):02x}; its value must be printable ASCII (0x20-0x7E): send "
            "ids with other characters in the path (/episodes/{episode_id}/..., percent-encoded UTF-8)",
            name,
        )
    return value


def check_path(request: Request) -> None:
    """Raise InvalidArgumentError (naming the path parameter) when a segment of the request's path is not valid
    UTF-8 once percent-decoded: the server would decode it with U+FFFD replacements, so two different ids
    would become one."""
    raw = request.scope.get("raw_path")
    if not isinstance(raw, bytes):
        return
    for segment in raw.split(b"/"):
        data = unquote_to_bytes(segment)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            text = data.decode("utf-8", "replace")
            param = next((k for k, v in request.path_params.items() if v == text), None)
            raise request_error(
                f"{param or 'the path'} is not valid UTF-8 once percent-decoded (byte {exc.start} is "
                f"0x{data[exc.start]:02x}); ids in the path must be percent-encoded UTF-8",
                param,
            ) from None


def episode_context(request: Request) -> tuple[str, str]:
    """(episode id, group id) of a call, from the path prefix or the headers; empty = untraced. Their length and
    characters are checked by the gateway core (its error names the field); the path must be valid UTF-8 and the
    headers printable ASCII (:func:`check_path`, :func:`read_header`).

    Raises:
        InvalidArgumentError: A bad path segment or header (as those functions), the path and a header naming
            different ids, or a group (``X-Marti-Group``) without an episode (naming the field).
    """
    check_path(request)
    out = []
    for key, header in (("episode_id", EPISODE_HEADER), ("group_id", GROUP_HEADER)):
        path, head = request.path_params.get(key, ""), read_header(request, header)
        if path and head and path != head:
            raise request_error(f"the path names {key} {path!r} but header {header} names {head!r}", key)
        out.append(path or head)
    if out[1] and not out[0]:  # only a header can name a group without an episode (the path nests them)
        raise request_error(
            f"header {GROUP_HEADER} names group {out[1]!r} but the call names no episode: a group is a set of "
            f"episodes, so send {EPISODE_HEADER} too (or use the base URL /episodes/{{episode_id}}/groups/"
            "{group_id}/v1); without an episode the call would be served but not recorded for training",
            GROUP_HEADER,
        )
    return out[0], out[1]
