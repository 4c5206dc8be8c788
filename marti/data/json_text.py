"""A JSON or JSON lines file's values as written: the per-column fix-up of what ``datasets`` reads.

``datasets`` stores a column that mixes numbers and text as JSON text, losing which values were strings (the
string ``"007"`` is stored as ``007`` and decoded as the number 7), and a column of numbers with one float or
one integer beyond 64 bits as floats (``1`` is ``1.0``, ``12345678901234567890`` is
``1.2345678901234567e+19``), and does the same to the values inside a column of lists or objects.
This module reads the file's records itself with :mod:`json` (numbers kept as the text written, a key written
twice in one object refused where :mod:`json` and ``datasets`` keep the last) so that :func:`keep_as_written`
can put back, column by column (:func:`fixes`), the values the user wrote.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from marti.errors import InvalidArgumentError


class _Number(str):
    """A JSON number, as the text written (the decoder's ``parse_int`` hook; :func:`_finite` for floats)."""


class _Refused(ValueError):
    """A value the decoder refuses inside a record (``args[0]``: why, naming the value)."""


def _finite(text: str) -> _Number:
    """A JSON number with a fraction or an exponent (the decoder's ``parse_float`` hook).

    Raises:
        _Refused: The number is beyond a double (``1e400``): ``datasets`` cannot store it.
    """
    if math.isinf(float(text)):
        raise _Refused(
            f"the number {text[:40]} is beyond the range of a double (about 1.8e308); write it as text"
        )
    return _Number(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's dict (the decoder's ``object_pairs_hook``).

    Raises:
        _Refused: A key is written twice (:mod:`json` alone would keep the last value silently).
    """
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Refused(
                f"key {key!r} is written twice in one object; JSON would keep only the last value, silently: "
                "remove one or rename it"
            )
        out[key] = value
    return out


_DECODER = json.JSONDecoder(parse_int=_Number, parse_float=_finite, object_pairs_hook=_unique_keys)
_SPACE = re.compile(r"[ \t\n\r]*")
_COMMA = re.compile(r"[ \t\n\r]*,?[ \t\n\r]*")


def read_records(text: str, source: str) -> tuple[list[dict[str, Any]], list[int]]:
    """The records of a JSON file's text, in file order, numbers as the text written, with the line each starts on.

    Args:
        text: The file's text (no byte-order mark): a JSON array (of objects; in an array of no objects, each
            element ``x`` is the record ``{"text": x}``, as ``datasets`` reads it), or JSON lines (objects one after another,
            usually one per line; blank lines and an object spread over several lines are read too).
        source: The file's description, quoted in errors.

    Returns:
        ``(records, lines)``: one dict per record, numbers as ``str`` holding the number's text as written; and
        the 1-based line of the file where each record starts (its ``{`` or, in an array, its first character),
        counting blank lines, as an editor, ``jq`` and :mod:`json`'s errors do.

    Raises:
        InvalidArgumentError: A JSON syntax error, a value of a JSON lines file that is not an object, an
            array mixing objects and other values (the first other value's line and column), or, inside a
            record (at any depth; the line and column where the record starts), a key written twice in one
            object (the key named) or a number beyond a double (``1e400``); the message names the line and
            column (1-based).
    """
    if text.lstrip().startswith("["):
        try:
            values = _DECODER.decode(text)
        except json.JSONDecodeError as exc:
            raise _syntax(source, exc.lineno, exc.colno, exc.msg) from None
        except _Refused as exc:
            raise _refused(text, _element_at_fault(text), exc, source) from None
        if any(isinstance(v, dict) for v in values) and not all(isinstance(v, dict) for v in values):
            raise _not_object(text, source)
        starts = [pos for pos, _, _ in itertools.islice(_array_elements(text), len(values))]
        return [v if isinstance(v, dict) else {"text": v} for v in values], _lines_of(text, starts)
    records, starts = [], []
    pos = _SPACE.match(text).end()
    while pos < len(text):
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise _bad_line(text, source) or _syntax(source, exc.lineno, exc.colno, exc.msg) from None
        except _Refused as exc:
            raise _refused(text, pos, exc, source) from None
        if not isinstance(value, dict):
            line, column = _line_column(text, pos)
            raise _syntax(
                source, line, column, f"a JSON lines file holds objects, got {text[pos:end][:80]!r}"
            )
        records.append(value)
        starts.append(pos)
        pos = _SPACE.match(text, end).end()
    return records, _lines_of(text, starts)


def _lines_of(text: str, starts: list[int]) -> list[int]:
    """The 1-based line of each offset of ``starts`` (ascending) in ``text``, in one pass over the text."""
    lines, line, last = [], 1, 0
    for pos in starts:
        line += text.count("\n", last, pos)
        lines.append(line)
        last = pos
    return lines


def _array_elements(text: str) -> Iterator[tuple[int, Any, int]]:
    """Each element of the JSON array ``text``, in order: ``(start offset, value, end offset)``. Used once the
    whole array is known to be at fault, so the scan reaches the element to name.

    Raises:
        _Refused: The element the decoder refuses; its start offset is the exception's ``pos``.
    """
    pos = text.index("[") + 1
    while True:
        pos = _SPACE.match(text, pos).end()
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except _Refused as exc:
            exc.pos = pos
            raise
        yield pos, value, end
        pos = _COMMA.match(text, end).end()


def _element_at_fault(text: str) -> int:
    """The offset where the element of the JSON array ``text`` that the decoder refuses (:class:`_Refused`)
    starts (the elements before it decode, so the scan reaches it)."""
    try:
        for _ in _array_elements(text):
            pass
    except _Refused as exc:
        return exc.pos
    raise AssertionError("unreachable: the array's end ']' is not a value, so the scan stops before it")


def _not_object(text: str, source: str) -> InvalidArgumentError:
    """The error naming the first element of the JSON array ``text`` (it decodes) that is not an object."""
    for pos, value, end in _array_elements(text):
        if not isinstance(value, dict):
            line, column = _line_column(text, pos)
            why = f"a JSON array of records holds objects, got {text[pos:end][:80]!r} beside objects"
            return _syntax(source, line, column, why)
    raise AssertionError("unreachable: the array's end ']' is not a value, so the scan stops before it")


def _refused(text: str, pos: int, exc: _Refused, source: str) -> InvalidArgumentError:
    line, column = _line_column(text, pos)
    return _syntax(source, line, column, f"in the record starting here, {exc.args[0]}")


def _bad_line(text: str, source: str) -> InvalidArgumentError | None:
    """The error of the first line that is not JSON on its own, when ``text`` looks like JSON lines (its first
    line is whole JSON, ends an object, or is the only line), else None (objects spread over lines). In JSON
    lines the line to fix is the incomplete one, not the next one, where a parser reading on stops."""
    lines = [(n, line) for n, line in enumerate(text.split("\n"), start=1) if line.strip()]
    for number, line in lines:
        try:
            _DECODER.decode(line)
        except json.JSONDecodeError as exc:
            spread = number == lines[0][0] and len(lines) > 1 and not line.rstrip().endswith("}")
            return None if spread else _syntax(source, number, exc.colno, exc.msg)
    return None


def _line_column(text: str, pos: int) -> tuple[int, int]:
    """The 1-based line and column of offset ``pos`` in ``text``."""
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _syntax(source: str, line: int, column: int, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{source} could not be read as JSON: line {line}, column {column}: {why}")


INT64 = (-(2**63), 2**63 - 1)
"""The smallest and largest integer a row can hold: an env server receives rows over its wire format, whose
integers are 64-bit."""


def _plain(value: Any) -> Any:
    """``value`` with every number as :mod:`json` reads it (a float, or an int), except that an integer beyond
    64 bits (:data:`INT64`) is its text as written (the digits: what a verifier reads from it)."""
    if isinstance(value, _Number):
        number = json.loads(value)
        return str(value) if type(number) is int and not INT64[0] <= number <= INT64[1] else number
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


def as_number(value: Any) -> Any:
    """A value of a column of numbers as :mod:`json` reads it: an integer the int written (any size, ``1``
    beside ``1.5`` stays ``1``), a number with a fraction or exponent a float; null stays None."""
    return _plain(value)


def fixes(features: Mapping[str, Any]) -> dict[str, Callable[[Any], Any]]:
    """The columns of a JSON file whose values ``datasets`` does not keep as written, each with the function
    giving the written value: a column that mixes types (a ``Json`` feature), read as text (:func:`as_text`); a
    column of lists or objects (a ``List`` or struct feature, or a ``Json`` one), whose nested values
    ``datasets`` may change (the string ``"007"`` beside the number 7 became 7, ``1`` beside ``1.5`` became
    ``1.0``, an integer beyond 64 bits a rounded float), each list or object as :mod:`json` reads it
    (:func:`as_text`); and a column of numbers read as floats (``1`` became ``1.0`` beside ``1.5``, an integer
    beyond 64 bits a rounded float), read as :func:`as_number` gives them.

    Args:
        features: The loaded dataset's features, column -> ``datasets`` feature.
    """
    out: dict[str, Callable[[Any], Any]] = {}
    for column, feature in features.items():
        if type(feature).__name__ != "Value":  # Json, List, Sequence, a struct (dict): nested values
            out[column] = as_text
        elif str(getattr(feature, "dtype", "")).startswith("float"):
            out[column] = as_number
    return out


def keep_as_written(
    rows: list[dict[str, Any]],
    columns: Mapping[str, Callable[[Any], Any]],
    records: list[dict[str, Any]],
    source: str,
) -> list[dict[str, Any]]:
    """Replace the values of ``columns`` in ``rows`` (as ``datasets`` read them) by the file's own.

    Args:
        rows: The rows ``datasets`` read from the file, in file order; changed in place.
        columns: Column -> the function giving its value from the file's record (:func:`fixes`).
        records: The file's records (:func:`read_records`).
        source: The file's description, quoted in errors.

    Returns:
        ``rows``.

    Raises:
        InvalidArgumentError: The records are not as many as the rows ``datasets`` read.
    """
    if not columns:
        return rows
    if len(records) != len(rows):
        raise InvalidArgumentError(
            f"{source}: column(s) {list(columns)} are kept as written only from JSON lines or a JSON array "
            f"of objects; the file's {len(records)} record(s) are not the {len(rows)} row(s) read"
        )
    for row, record in zip(rows, records, strict=True):
        for column, value_of in columns.items():
            row[column] = value_of(record.get(column))
    return rows
