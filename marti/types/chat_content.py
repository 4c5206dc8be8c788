"""Chat message content as one text: a string, or a list of text parts joined with newlines (as vLLM joins
them), for the SDK's gRPC ``InferenceClient.generate`` and the gateway's HTTP chat routes alike.

Every refusal is an :class:`~marti.errors.InvalidArgumentError` whose ``param`` attribute is the exact request
field at fault (``messages[2].content[1].text``), and whose message starts with that field or the part holding it.
"""

from __future__ import annotations

from collections.abc import Mapping

from marti.errors import InvalidArgumentError

__all__ = ["TEXT_PART", "content_text", "utf8_text"]

#: The chat ``{"type": "text", "text": str}`` part: part type -> the key that holds its text.
TEXT_PART: Mapping[str, str] = {"text": "text"}


def _refuse(param: str, message: str, field: str | None = None) -> InvalidArgumentError:
    """An InvalidArgumentError ``"{param} {message}"`` whose ``param`` attribute is ``field`` (default ``param``)."""
    err = InvalidArgumentError(f"{param} {message}")
    param = field or param
    err.param = param  # type: ignore[attr-defined]
    return err


def utf8_text(value: str, param: str) -> str:
    """``value`` unchanged when UTF-8 (and so protobuf and JSON) can encode it.

    Raises:
        InvalidArgumentError: ``value`` holds a lone surrogate (JSON's ``\\ud800`` escape); the message names
            ``param`` and the character's index, ``param`` is set to ``param``.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _refuse(
            param,
            f"is not valid Unicode text: character {exc.start} is {value[exc.start]!r}, a lone surrogate that "
            "UTF-8 cannot encode",
        ) from None
    return value


def _part_text(part: object, param: str, kinds: Mapping[str, str]) -> str:
    """The text of the content part at ``param`` (``messages[0].content[1]``), read from the key ``kinds``
    maps its type to; InvalidArgumentError naming ``param.type`` or ``param.KEY``."""
    kind = part.get("type") if isinstance(part, Mapping) else None
    if kind not in kinds:
        shapes = ", ".join(f"{{'type': {k!r}, {key!r}: str}}" for k, key in kinds.items())
        raise _refuse(
            param,
            f"must be a text part, one of {shapes}; got type {kind!r} ({part!r:.100}): this engine reads text only",
            f"{param}.type",
        )
    key = kinds[kind]
    text = part.get(key)  # type: ignore[union-attr]
    if not isinstance(text, str):
        got = f"has no {key}" if text is None else f"has {key} {text!r:.100}, of type {type(text).__name__}"
        raise _refuse(
            f"{param}.{key}", f"is refused: the part {got}; a {kind!r} part's {key} must be a string"
        )
    return text


def content_text(content: object, param: str, kinds: Mapping[str, str] = TEXT_PART) -> str:
    """Chat content as one text: ``content`` itself when a string, else its parts' texts joined with ``"\\n"``.

    Args:
        content: A string or a list of parts (dicts whose ``type`` is a key of ``kinds``). None is the
            caller's to handle (only an assistant message may have it).
        param: The request field ``content`` came from, e.g. ``messages[2].content``.
        kinds: Part type -> the key holding its text (chat: ``{"text": "text"}``).

    Raises:
        InvalidArgumentError: ``content`` is neither a string nor a list (``param``); a part of a type not in
            ``kinds`` (``param[j].type``) or whose text is not a string (``param[j].text``); a lone surrogate in
            the joined text (``param``). The ``param`` attribute is the field named.
    """
    if isinstance(content, list):
        content = "\n".join(_part_text(part, f"{param}[{j}]", kinds) for j, part in enumerate(content))
    elif not isinstance(content, str):
        raise _refuse(
            param,
            f"must be a string or a list of content parts, got {type(content).__name__} {content!r:.100}",
        )
    return utf8_text(content, param)
