"""A :class:`ProblemSet`: the checked rows of one dataset source, with the column that holds the prompt and the
one that holds the label.

Rows keep every column (reward functions receive them) and their text exactly as read: full Unicode, nothing
sanitised, so LaTeX, non-English text and emoji reach the agents and the rewards unchanged, in-process or as
JSON inside a remote env server's config.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from marti.data.checks import check_columns, check_rows, row_name
from marti.data.load import load_rows
from marti.data.spec import parse_source
from marti.errors import InvalidArgumentError


class ProblemSet:
    """The rows of a dataset, checked, with the prompt column (``input_key``) and label column (``label_key``).

    Built directly from rows (``ProblemSet(rows, input_key="question")``) or from a source spec
    (:meth:`from_source`). Construction checks every row (:func:`marti.data.checks.check_rows`), so a bad row is
    found before a job starts, never hours in.

    Args:
        rows: One mapping per problem (column -> JSON-able value); copied.
        input_key: The column holding the prompt text (OpenRLHF's ``--input_key``).
        label_key: The column holding the reference answer (OpenRLHF's ``--label_key``); None when the reward
            needs no label.
        source: One line naming where the rows came from (quoted in every error and in :attr:`source`).
        positions: The source position (0-based) of each row, when the rows are a subset of the source (a
            held-out split); default ``0..len(rows)-1``. Errors name these positions.
        lines: The 1-based line of ``file`` where each row starts (parallel to ``rows``), or None: errors then
            name a row ``row 3 (data/x.jsonl:5)`` (:meth:`where`), so an editor opens it.
        file: The file the rows were read from, as the user gave it (given with ``lines``, or neither).
        labels_required: The caller cannot do without labels (a ``dataset_task`` job: its verifier reads every
            row's label): a missing ``label_key`` column's error then suggests no ``label_key: null``.

    Raises:
        InvalidArgumentError: No rows, a key that is not a column (the columns and the closest match named), a
            row with an empty or non-string prompt, without a label or with a label that is not text or a number
            (a list, an object, a boolean), or with a value that is not JSON-able
            (each naming the source, the row as :meth:`where` names it, the column and the value); ``lines``
            without ``file`` or the other way round, or not one line per row.
    """

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        *,
        input_key: str,
        label_key: str | None = None,
        source: str = "<rows>",
        positions: Sequence[int] | None = None,
        lines: Sequence[int] | None = None,
        file: str | None = None,
        labels_required: bool = False,
    ) -> None:
        for name, key in (("input_key", input_key), ("label_key", label_key)):
            if not (isinstance(key, str) and key.strip()) and not (name == "label_key" and key is None):
                raise InvalidArgumentError(
                    f"{source}: {name} must name a column (a non-empty string), got {key!r}"
                )
        if not rows:
            raise InvalidArgumentError(f"{source}: the dataset has no rows")
        if not all(isinstance(r, dict) for r in rows):
            bad = next(i for i, r in enumerate(rows) if not isinstance(r, dict))
            raise InvalidArgumentError(f"{source}: row {bad} is {type(rows[bad]).__name__}, not a mapping")
        check_columns(source, list(rows[0]), input_key, label_key, labels_required=labels_required)
        self._positions = tuple(range(len(rows)) if positions is None else positions)
        if len(self._positions) != len(rows):
            raise InvalidArgumentError(f"{source}: {len(self._positions)} positions for {len(rows)} rows")
        if (lines is None) != (file is None):
            raise InvalidArgumentError(
                f"{source}: lines and file go together, got lines={lines!r}, file={file!r}"
            )
        if lines is not None and len(lines) != len(rows):
            raise InvalidArgumentError(f"{source}: {len(lines)} lines for {len(rows)} rows")
        self._lines = None if lines is None else tuple(lines)
        self._file = file
        names = [self._name(n) for n in range(len(rows))]
        check_rows(source, rows, input_key, label_key, names=names)
        self._rows = tuple(copy.deepcopy(dict(r)) for r in rows)
        self.input_key = input_key
        self.label_key = label_key
        self.source = source

    @classmethod
    def from_source(
        cls,
        text: str,
        *,
        input_key: str,
        label_key: str | None = None,
        split: str | None = None,
        max_samples: int | None = None,
        labels_required: bool = False,
    ) -> ProblemSet:
        """Load a source spec (:func:`marti.data.spec.parse_source`) through ``datasets`` and check its rows.

        Args:
            text: The source spec, e.g. ``json:data/x.json``, ``data/x.parquet``, ``org/name@test``.
            input_key: The prompt column.
            label_key: The label column, or None.
            split: The split of a hub dataset or saved ``DatasetDict``; None: the spec's, else ``train``.
            max_samples: Keep only the first this many rows (OpenRLHF's ``--max_samples``); None: all.
            labels_required: As the class's.

        Returns:
            The checked problem set; :attr:`source` names the source.

        Raises:
            NotFoundError: A missing file, folder, split or hub dataset.
            InvalidArgumentError: A malformed or empty source, a JSON or CSV file that is not UTF-8, or a bad row
                (see the class).
            UnavailableError: The hub cannot be reached, or ``datasets`` is not installed.
        """
        if max_samples is not None and (type(max_samples) is not int or max_samples < 1):
            raise InvalidArgumentError(f"max_samples must be an int >= 1 or None, got {max_samples!r}")
        spec = parse_source(text, split=split)
        rows, lines = load_rows(spec)
        if max_samples is not None:
            rows, lines = rows[:max_samples], None if lines is None else lines[:max_samples]
        return cls(
            rows,
            input_key=input_key,
            label_key=label_key,
            source=spec.describe(),
            lines=lines,
            file=spec.location if lines is not None else None,
            labels_required=labels_required,
        )

    def __len__(self) -> int:
        """Number of problems."""
        return len(self._rows)

    def _index(self, i: int) -> int:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(self._rows):
            raise InvalidArgumentError(f"{self.source}: problem index {i!r} is not in [0, {len(self._rows)})")
        return i

    def row(self, i: int) -> dict[str, Any]:
        """A copy of problem ``i``'s row (every column).

        Raises:
            InvalidArgumentError: ``i`` is not an index in ``[0, len)``.
        """
        return copy.deepcopy(self._rows[self._index(i)])

    def prompt(self, i: int) -> str:
        """Problem ``i``'s prompt text (the ``input_key`` column), exactly as read.

        Raises:
            InvalidArgumentError: ``i`` is not an index in ``[0, len)``.
        """
        return self._rows[self._index(i)][self.input_key]

    def label(self, i: int) -> Any:
        """Problem ``i``'s label (the ``label_key`` column), exactly as read.

        Raises:
            InvalidArgumentError: ``i`` is not an index, or the set has no ``label_key``.
        """
        if self.label_key is None:
            raise InvalidArgumentError(f"{self.source}: no label_key was given, so problems have no label")
        return self._rows[self._index(i)][self.label_key]

    def position(self, i: int) -> int:
        """The source position (0-based row of the file) of problem ``i``; errors about it name this row.

        Raises:
            InvalidArgumentError: ``i`` is not an index in ``[0, len)``.
        """
        return self._positions[self._index(i)]

    def where(self, i: int) -> str:
        """How errors name problem ``i``: ``row 3 (data/x.jsonl:5)``, its source position and, for rows read from
        a JSON, JSON lines or CSV file, ``FILE:LINE`` (1-based, blank lines and a CSV header counted); ``row 3``
        for rows without lines (:func:`marti.data.checks.row_name`).

        Raises:
            InvalidArgumentError: ``i`` is not an index in ``[0, len)``.
        """
        return self._name(self._index(i))

    def _name(self, i: int) -> str:
        """:meth:`where` of index ``i``, known to be in range."""
        line = self._lines[i] if self._lines is not None else None
        return row_name(self._positions[i], self._file, line)

    @property
    def columns(self) -> list[str]:
        """The column names, in source order."""
        return list(self._rows[0])

    def subset(self, indices: Sequence[int], *, source: str | None = None) -> ProblemSet:
        """The problems at ``indices`` (in that order), keeping their source positions and lines.

        Raises:
            InvalidArgumentError: An index out of range, or no indices.
        """
        picked = [self._index(i) for i in indices]
        return ProblemSet(
            [self._rows[i] for i in picked],
            input_key=self.input_key,
            label_key=self.label_key,
            source=source or self.source,
            positions=[self._positions[i] for i in picked],
            lines=None if self._lines is None else [self._lines[i] for i in picked],
            file=self._file,
        )

    def __repr__(self) -> str:
        return f"ProblemSet({self.source}, {len(self)} rows, input_key={self.input_key!r}, label_key={self.label_key!r})"
