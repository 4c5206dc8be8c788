"""Checks of loaded rows: the columns named exist, every prompt is a non-empty string, every row has a label
that is text or a number, every value is JSON-able. Each failure is an
:class:`~marti.errors.InvalidArgumentError` that names the source, the row (:func:`row_name`: its 0-based
position in the source and, in a JSON, JSON lines or CSV file, ``FILE:LINE``), the column and the bad value.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from typing import Any

from marti.data.json_text import INT64
from marti.errors import InvalidArgumentError

_SHOWN = 80
"""Characters of a bad value quoted in an error message."""


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def row_name(position: int, file: str | None = None, line: int | None = None) -> str:
    """How every dataset error names a row: ``row 3 (data/x.jsonl:5)``, its 0-based position in the source and
    the file's 1-based line where it starts (blank lines and a CSV header counted), which an editor or a terminal
    opens at; ``row 3`` alone for rows without lines (Parquet, a saved folder, a hub dataset, rows given in
    code).

    Args:
        position: The row's 0-based position in the source.
        file: The file's path as the user gave it, or None.
        line: The 1-based line of ``file`` where the row starts, or None.
    """
    return f"row {position} ({file}:{line})" if file is not None and line is not None else f"row {position}"


def check_columns(
    source: str,
    columns: Sequence[str],
    input_key: str,
    label_key: str | None,
    *,
    labels_required: bool = False,
) -> None:
    """Check that the input column (and the label column, when one is named) exist.

    Args:
        source: The source's description, quoted in errors.
        columns: The source's column names.
        input_key: The prompt column.
        label_key: The label column, or None.
        labels_required: Whether the caller cannot do without a label (a job whose verifier reads every row's
            label): a missing label column's message then suggests no ``label_key: null``.

    Raises:
        InvalidArgumentError: A column is missing; the message names the columns that exist and the closest,
            and for the label column what to do: name it, or (only when ``labels_required`` is False)
            ``label_key: null``.
    """
    for role, key in (("input_key", input_key), ("label_key", label_key)):
        if key is None or key in columns:
            continue
        close = difflib.get_close_matches(key, list(columns), n=1, cutoff=0.4)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        extra = ""
        if role == "label_key":
            extra = (
                " (the job's verifier reads every row's label: name the label column)"
                if labels_required
                else " (or label_key: null when the reward needs no label)"
            )
        raise InvalidArgumentError(
            f"{source}: {role} {key!r} is not a column; the columns are {list(columns)}{hint}{extra}"
        )


def check_rows(
    source: str,
    rows: Sequence[dict[str, Any]],
    input_key: str,
    label_key: str | None,
    *,
    names: Sequence[str] | None = None,
) -> None:
    """Check every row: a non-empty string prompt, a label (text or a number, not empty), JSON-able values.

    Args:
        source: The source's description, quoted in errors.
        rows: The rows, in source order.
        input_key: The prompt column.
        label_key: The label column, or None when the reward needs none.
        names: How errors name each row (:func:`row_name`); default ``row 0``, ``row 1``, ...

    Raises:
        InvalidArgumentError: The first bad row, naming it, the column and the value.
    """
    for n, row in enumerate(rows):
        i = names[n] if names is not None else row_name(n)
        prompt = row.get(input_key)
        if prompt is None:
            raise InvalidArgumentError(
                f"{source}: {i} has no prompt in column {input_key!r} (got None){_misspelt(row, input_key)}"
            )
        if not isinstance(prompt, str) or not prompt.strip():
            what = "an empty prompt" if isinstance(prompt, str) else f"a non-string prompt {_show(prompt)}"
            raise InvalidArgumentError(f"{source}: {i} has {what} in column {input_key!r}")
        if label_key is not None:
            _check_label(source, i, label_key, row)
        for column, value in row.items():
            bad = _not_json(value)
            if bad is not None:
                raise InvalidArgumentError(
                    f"{source}: {i}, column {column!r}: {bad}; rows must be JSON-able (they travel to a "
                    "remote env server as JSON)"
                )


def _misspelt(row: dict[str, Any], key: str) -> str:
    """For a row with no value in column ``key``: ``"; the row has a value in 'questoin': a misspelt key?"``
    naming the row's closest other key that holds a value (a JSON row whose key is misspelt reads as null in the
    column it meant), or ``""`` when no key of the row is close."""
    held = [k for k, v in row.items() if k != key and v is not None]
    close = difflib.get_close_matches(key, held, n=1, cutoff=0.6)
    return f"; the row has a value in {close[0]!r}: a misspelt key?" if close else ""


def _check_label(source: str, i: str, label_key: str, row: dict[str, Any]) -> None:
    """Check the label of ``row``, named ``i`` (:func:`row_name`): text or a number (what a verifier reads), not
    null or empty; a row without one is searched for a misspelt key (:func:`_misspelt`) only then, so a good
    row costs no search.

    Raises:
        InvalidArgumentError: No label (null, or empty text), or a label that is a list, an object (mapping),
            a boolean or another non-number, naming the source, the row, the column and the value.
    """
    label = row.get(label_key)
    if label is None or (isinstance(label, str) and not label.strip()):
        raise InvalidArgumentError(
            f"{source}: {i} has no label in column {label_key!r} (got {_show(label)}){_misspelt(row, label_key)}"
        )
    if isinstance(label, bool) or not isinstance(label, str | int | float):
        kind = {list: "a list", tuple: "a list", dict: "an object", bool: "a boolean"}.get(type(label), "a")
        raise InvalidArgumentError(
            f"{source}: {i} has {kind} label {_show(label)} in column {label_key!r}; a label must be "
            "text or a number (put other data in another column: reward functions receive every column)"
        )


def _not_json(value: Any) -> str | None:
    """Why ``value`` is not plain JSON that an env server can receive (strings, finite numbers, integers
    within 64 bits, booleans, null, lists, string-keyed dicts), or None when it is."""
    if value is None or isinstance(value, str | bool):
        return None
    if isinstance(value, int):
        if INT64[0] <= value <= INT64[1]:
            return None
        return (
            f"the integer {_show(value)} is beyond 64 bits, which an env server's wire format does not carry; "
            f"give it as text ({_show(str(value))})"
        )
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{value!r} is not a finite number"
    if isinstance(value, list | tuple):
        return next((why for why in map(_not_json, value) if why is not None), None)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return f"a mapping with non-string keys {_show(list(value))}"
        return next((why for why in map(_not_json, value.values()) if why is not None), None)
    return f"value {_show(value)} of type {type(value).__name__} is not JSON-able"
