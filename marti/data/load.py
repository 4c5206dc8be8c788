"""Reading a dataset source into rows (one dict per row, every column kept) through the ``datasets`` library.

Files go through ``datasets.load_dataset(builder, data_files=PATH, split="train")`` (CSV cells read as
the text written: string columns, no NA guessing), a ``save_to_disk`` folder through
``datasets.load_from_disk`` (one split of a ``DatasetDict``), a hub id through
``datasets.load_dataset(ID, name=config, split=split)``. A JSON file's columns that mix numbers and text, its
columns of lists or objects, and its columns of numbers that ``datasets`` reads as floats, are then put back as
written
(:mod:`marti.data.json_text`). Every failure becomes a typed error of :mod:`marti.errors`
that names the source and the cause. ``datasets`` is imported on first use (the trainer extra installs it).
"""

from __future__ import annotations

import codecs
import csv
import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from marti.data.json_text import fixes, keep_as_written, read_records
from marti.data.spec import SourceSpec
from marti.errors import InvalidArgumentError, NotFoundError, UnavailableError


def _datasets() -> Any:
    """The ``datasets`` module, its progress bars off.

    Raises:
        UnavailableError: ``datasets`` is not installed.
    """
    try:
        import datasets
    except ImportError:
        raise UnavailableError(
            "loading a dataset needs the 'datasets' package: pip install 'marti-agent[trainer]'"
        ) from None
    datasets.disable_progress_bars()
    return datasets


def check_local(spec: SourceSpec) -> None:
    """Check that a local source exists and is not an empty file (hub ids are not checked).

    Raises:
        NotFoundError: The file or folder does not exist, or a file source is a folder (named).
        InvalidArgumentError: The file is empty (0 bytes).
    """
    if not spec.is_local:
        return
    path = Path(spec.location)
    if not path.exists():
        where = "" if path.is_absolute() else f" (relative to the working directory {Path.cwd()})"
        raise NotFoundError(f"dataset {spec.describe()} does not exist{where}")
    if spec.kind == "disk" and not path.is_dir():
        raise NotFoundError(f"dataset {spec.describe()} is not a folder written by save_to_disk")
    if spec.kind != "disk":
        if not path.is_file():
            raise NotFoundError(f"dataset {spec.describe()} is not a file")
        if path.stat().st_size == 0:
            raise InvalidArgumentError(f"dataset {spec.describe()} is empty (0 bytes)")


def load_rows(spec: SourceSpec) -> tuple[list[dict[str, Any]], list[int] | None]:
    """Read every row of a source, in the source's order, with the line of the file each row starts on.

    Args:
        spec: The parsed source (:func:`marti.data.spec.parse_source`).

    Returns:
        ``(rows, lines)``. ``lines``: for a JSON, JSON lines or CSV file, the 1-based line of the file where each
        row starts (blank lines counted; in a CSV file the header is line 1), what errors name so that a user can
        jump to it (:func:`marti.data.checks.row_name`); None for a Parquet file, a saved folder or a hub dataset,
        whose rows have no lines. ``rows``: one dict per row, column name -> value as ``datasets`` decodes it (``Dataset.to_list``), except a JSON
        file's columns that mix numbers and text (each value as the text written), its columns of lists or
        objects (each as :mod:`json` reads it) and its columns of numbers that ``datasets`` reads as floats
        (each number as :mod:`json` reads it):
        :func:`marti.data.json_text.fixes`.

    Raises:
        NotFoundError: A missing local file or folder, a missing split of a saved ``DatasetDict``, or a hub
            dataset the hub says does not exist.
        InvalidArgumentError: An empty or malformed file (the parser's message is included), or a JSON or
            CSV file that is not UTF-8 (the byte, its line and offset named).
        UnavailableError: ``datasets`` is not installed, or the hub cannot be reached (offline, no network).
    """
    check_local(spec)
    ds = _datasets()
    if spec.kind == "disk":
        return _from_disk(ds, spec).to_list(), None
    if spec.kind == "hub":
        return _from_hub(ds, spec).to_list(), None
    return _from_file(ds, spec)


def _cause(exc: BaseException) -> str:
    """The innermost message of an exception chain (``datasets`` wraps the parser's error)."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


#: The field-size limit of marti's own CSV reads (:func:`_any_field_size`): Python's ``csv`` refuses a cell over
#: 128 KiB by default (``_csv.Error: field larger than field limit (131072)``), while ``datasets`` (pandas) reads
#: it, so the row reaches the checks that name it (a prompt too long for the model, by row, agent and tokens).
CSV_FIELD_LIMIT = 2**31 - 1


@contextmanager
def _any_field_size() -> Iterator[None]:
    """Python's ``csv`` field-size limit raised to :data:`CSV_FIELD_LIMIT` inside, and restored after (it is a
    process-wide setting)."""
    before = csv.field_size_limit(CSV_FIELD_LIMIT)
    try:
        yield
    finally:
        csv.field_size_limit(before)


def _csv_text_columns(ds: Any, path: str) -> dict[str, Any]:
    """``load_dataset`` arguments that read every CSV cell as the text written (``"007"`` stays ``"007"``, an
    empty cell is ``""``): string features for the header's columns, no NA guessing."""
    # utf-8-sig: a byte-order mark (Excel) is not text
    with open(path, newline="", encoding="utf-8-sig") as f, _any_field_size():
        header = next(csv.reader(f), [])
    features = ds.Features({c: ds.Value("string") for c in header})
    return {"features": features, "na_filter": False, "encoding": "utf-8-sig"}


def _from_file(ds: Any, spec: SourceSpec) -> tuple[list[dict[str, Any]], list[int] | None]:
    """The rows of a JSON, CSV or Parquet file, and the line each row starts on (None for Parquet); a JSON
    file's columns that mix numbers and text, its columns of lists or objects, and its columns of numbers, as
    written (:func:`marti.data.json_text.fixes`).

    Raises:
        InvalidArgumentError: A JSON or CSV file that is not UTF-8, or that the parser cannot read; a JSON
            file's syntax error, or a key written twice in one of its objects, with its line and column
            (:func:`marti.data.json_text.read_records`, run before ``datasets``).
    """
    source = f"dataset {spec.describe()}"
    text = _read_text(spec) if spec.kind in ("json", "csv") else ""
    records: list[dict[str, Any]] = []
    lines: list[int] | None = None
    if spec.kind == "csv":
        lines = _check_csv_fields(text, source)
    if spec.kind == "json":
        records, lines = read_records(text, source)
    loaded = _load_file(ds, spec)
    rows = loaded.to_list()
    if lines is not None and len(lines) != len(rows):
        lines = None  # not reached by any file tested: rows are then named by position alone
    if spec.kind != "json":
        return rows, lines
    return keep_as_written(rows, fixes(loaded.features), records, source), lines


def _check_csv_fields(text: str, source: str) -> list[int]:
    """Check that a CSV file's header names each column, once, and every data row has as many fields as the
    header: ``datasets`` (pandas) would drop the values of a column named a second time, read a file whose first
    data row has one field more with its first column as the index, every value one column off, and fill a
    short row's missing cells. Blank lines are skipped, as pandas skips them. A cell of any size is read
    (:func:`_any_field_size`).

    Args:
        text: The file's text (no byte-order mark).
        source: The file's description, quoted in errors.

    Returns:
        The 1-based line of the file (the header is line 1) where each data row starts, one per row that
        ``datasets`` reads: a line that is empty or only whitespace is no row, as pandas skips it.

    Raises:
        InvalidArgumentError: A column without a name or named twice in the header (named), or a row with another number of
            fields than the header (its line, 1-based, and both counts named).
    """
    with _any_field_size():
        return _check_csv_rows(csv.reader(io.StringIO(text, newline="")), source)


def _check_csv_rows(reader: Any, source: str) -> list[int]:
    """The checks of :func:`_check_csv_fields` over a ``csv.reader`` of the file (same errors, same return)."""
    header = next(reader, [])
    if "" in header:
        raise InvalidArgumentError(
            f"{source}: the header's column {header.index('') + 1} (1-based) has no name (a trailing comma "
            "adds an empty field); give each column a name"
        )
    twice = next((c for i, c in enumerate(header) if c in header[:i]), None)
    if twice is not None:
        raise InvalidArgumentError(
            f"{source}: the header names column {twice!r} twice; give each column its own name"
        )
    line = reader.line_num + 1
    starts = []
    for fields in reader:
        if len(fields) > 1 or (fields and fields[0].strip()):
            starts.append(line)
        if len(fields) != len(header) and any(f.strip() for f in fields):
            comma = " (a trailing comma adds an empty field)" if fields[-1] == "" else ""
            raise InvalidArgumentError(
                f"{source}: line {line} has {len(fields)} field(s), the header has {len(header)}{comma}; "
                "every row needs one field per column"
            )
        line = reader.line_num + 1
    return starts


def _read_text(spec: SourceSpec) -> str:
    """A JSON or CSV file's text, read as UTF-8 (a leading byte-order mark dropped).

    Raises:
        InvalidArgumentError: The file is not UTF-8; the message names the file, the first byte that is not
            UTF-8, its line (1-based) and its byte offset (0-based).
    """
    data = Path(spec.location).read_bytes()
    skip = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = skip + exc.start
        line = data.count(b"\n", 0, at) + 1
        raise InvalidArgumentError(
            f"dataset {spec.describe()} is not UTF-8: byte {data[at]:#04x} at line {line} (byte offset "
            f"{at}) cannot be decoded ({exc.reason}); the file must be UTF-8 (from Latin-1: "
            "iconv -f latin1 -t utf-8)"
        ) from None


def _load_file(ds: Any, spec: SourceSpec) -> Any:
    """``load_dataset`` of a file (CSV cells as text).

    Raises:
        InvalidArgumentError: The file has no rows, or the parser failed (:func:`_load_error`).
    """
    try:
        extra = _csv_text_columns(ds, spec.location) if spec.kind == "csv" else {}
        return ds.load_dataset(spec.kind, data_files=spec.location, split="train", **extra)
    except Exception as exc:  # every parser failure is reported with the file named
        raise _load_error(spec, exc) from None


def _load_error(spec: SourceSpec, exc: Exception) -> InvalidArgumentError:
    """The error for a file ``load_dataset`` could not read: no rows, else the parser's own message."""
    cause = _cause(exc)
    # datasets' answer to a file without rows; pyarrow's to a Parquet file of 0 rows (it asks for batches of 0)
    if "corresponds to no data" in cause or "BatchSize must be greater than 0" in cause:
        return InvalidArgumentError(f"dataset {spec.describe()} has no rows")
    return InvalidArgumentError(
        f"dataset {spec.describe()} could not be read as {spec.kind.upper()}: {_cause(exc)}"
    )


def _from_disk(ds: Any, spec: SourceSpec) -> Any:
    try:
        loaded = ds.load_from_disk(spec.location)
    except Exception as exc:  # a folder that is not a saved dataset
        raise InvalidArgumentError(
            f"dataset {spec.describe()} is not a folder written by Dataset.save_to_disk: {_cause(exc)}"
        ) from None
    if isinstance(loaded, ds.DatasetDict):
        if spec.split not in loaded:
            raise NotFoundError(
                f"dataset {spec.describe()} has no split {spec.split!r}; its splits are {sorted(loaded)}"
            )
        return loaded[spec.split]
    if spec.split != "train":  # one Dataset has no named splits: the split asked for would be ignored
        raise InvalidArgumentError(
            f"dataset {spec.describe()} is one saved Dataset (no named splits), so split {spec.split!r} would be "
            "ignored; save a DatasetDict, or hold rows out with dataset.eval_path or eval_fraction"
        )
    return loaded


def _from_hub(ds: Any, spec: SourceSpec) -> Any:
    try:
        return ds.load_dataset(spec.location, name=spec.config, split=spec.split)
    except FileNotFoundError as exc:  # datasets' DatasetNotFoundError, or a data file the repository lacks
        raise NotFoundError(f"{spec.describe()} not found on the hub: {_cause(exc)}") from None
    except OSError as exc:  # ConnectionError, HTTP errors: the hub could not be asked
        raise UnavailableError(
            f"{spec.describe()} could not be loaded: the Hugging Face hub is not reachable from here "
            f"({_cause(exc)}); download it where the hub is reachable, save it with save_to_disk and give "
            "that folder, or give a local file"
        ) from None
    except ValueError as exc:  # an unknown split or config
        raise InvalidArgumentError(f"{spec.describe()}: {_cause(exc)}") from None
