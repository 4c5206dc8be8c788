"""A JSON or JSON lines file's values as written: the per-column fix-up of what ``datasets`` reads.

``datasets`` stores a column that mixes numbers and text as JSON text, losing which values were strings (the
string ``"007"`` is stored as ``007`` and decoded as the number 7). This module reads the file's records itself
with :mod:`json` (numbers kept as the text written) so that :func:`keep_as_written` can put back, column by
column, the values the user wrote.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from marti.errors import InvalidArgumentError


class _Number(str):
    """A JSON number, as the text written (the decoder's ``parse_int`` / ``parse_float`` hook)."""


_DECODER = json.JSONDecoder(parse_int=_Number, parse_float=_Number)
_SPACE = re.compile(r"[ \t\n\r]*")


def read_records(text: str, source: str) -> list[dict[str, Any]]:
    """The records of a JSON file's text, in file order, numbers as the text written.

    Args:
        text: The file's text (no byte-order mark): a JSON array (of objects; any other element ``x`` is the
            record ``{"text": x}``, as ``datasets`` reads it), or JSON lines (objects one after another,
            usually one per line; blank lines and an object spread over several lines are read too).
        source: The file's description, quoted in errors.

    Returns:
        One dict per record; numbers are ``str`` holding the number's text as written.

    Raises:
        InvalidArgumentError: A JSON syntax error, or a value of a JSON lines file that is not an object; the
            message names the line and column (1-based).
    """
    if text.lstrip().startswith("["):
        try:
            values = _DECODER.decode(text)
        except json.JSONDecodeError as exc:
            raise _syntax(source, exc.lineno, exc.colno, f"not valid JSON: {exc.msg}") from None
        return [v if isinstance(v, dict) else {"text": v} for v in values]
    records = []
    pos = _SPACE.match(text).end()
    while pos < len(text):
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise _syntax(source, exc.lineno, exc.colno, f"not valid JSON: {exc.msg}") from None
        if not isinstance(value, dict):
            line, column = _line_column(text, pos)
            raise _syntax(
                source, line, column, f"a JSON lines file holds objects, got {text[pos:end][:80]!r}"
            )
        records.append(value)
        pos = _SPACE.match(text, end).end()
    return records


def _line_column(text: str, pos: int) -> tuple[int, int]:
    """The 1-based line and column of offset ``pos`` in ``text``."""
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _syntax(source: str, line: int, column: int, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{source}, line {line}, column {column}: {why}")


def _plain(value: Any) -> Any:
    """``value`` with every number as :mod:`json` reads it (an int of any size, or a float)."""
    if isinstance(value, _Number):
        return json.loads(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def as_text(value: Any) -> Any:
    """A value of a column that mixes numbers and text: a string as written, a number as the text written
    (``1`` is ``"1"``, ``1.50`` is ``"1.50"``); any other value (null, true/false, a list, an object) as
    :mod:`json` reads it."""
    return str(value) if isinstance(value, str) else _plain(value)


def keep_as_written(
    rows: list[dict[str, Any]], text_columns: Sequence[str], text: str, source: str
) -> list[dict[str, Any]]:
    """Replace the values of ``text_columns`` in ``rows`` (as ``datasets`` read them) by the file's own, as
    :func:`as_text` gives them.

    Args:
        rows: The rows ``datasets`` read from the file, in file order; changed in place.
        text_columns: The columns that mix numbers and text.
        text: The file's text.
        source: The file's description, quoted in errors.

    Returns:
        ``rows``.

    Raises:
        InvalidArgumentError: The file is not JSON lines or a JSON array (the form its records can be read
            from here), or it holds a different number of records than ``datasets`` read.
    """
    if not text_columns:
        return rows
    records = read_records(text, source)
    if len(records) != len(rows):
        raise InvalidArgumentError(
            f"{source}: column(s) {list(text_columns)} mix numbers and text, which are kept as written only "
            f"from JSON lines or a JSON array of objects; the file's {len(records)} record(s) are not the "
            f"{len(rows)} row(s) read"
        )
    for row, record in zip(rows, records, strict=True):
        for column in text_columns:
            row[column] = as_text(record.get(column))
    return rows
