"""Parsing a dataset source spec (``json:data/x.json``, ``data/x.parquet``, ``org/name@test``) into a
:class:`SourceSpec`; nothing is read here except whether a local path exists.

Accepted forms (docs/datasets.md):

- ``json:PATH``, ``jsonl:PATH``, ``parquet:PATH``, ``csv:PATH``: a local file of that format;
- a bare ``PATH`` ending in ``.json``, ``.jsonl``, ``.parquet`` or ``.csv``: the format from the extension;
- ``disk:PATH``, or a bare path to an existing folder: a folder written by ``Dataset.save_to_disk`` (or
  ``DatasetDict.save_to_disk``, of which one split is taken);
- ``hf:ID``, or a bare ``org/name`` that is not a local folder and has no file extension: a Hugging Face hub
  dataset, optionally ``ID:config`` and ``ID@split`` (``openai/gsm8k:main@test``); an id with a dot in its name
  needs the ``hf:`` prefix.

Relative paths are relative to the working directory of the process that loads the config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from marti.errors import InvalidArgumentError

SourceKind = Literal["json", "csv", "parquet", "disk", "hub"]
#: Prefix or extension -> the ``datasets`` builder that reads it (JSON lines are read by the ``json`` builder).
FILE_FORMATS: dict[str, SourceKind] = {"json": "json", "jsonl": "json", "parquet": "parquet", "csv": "csv"}
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_BARE_HUB_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(:[\w.-]+)?(@[\w.\[\]:%+-]+)?$")


@dataclass(frozen=True)
class SourceSpec:
    """Where a dataset comes from, parsed from its spec text.

    Attributes:
        text: The spec as written (error messages quote it).
        kind: ``json`` (JSON or JSON lines), ``csv``, ``parquet``, ``disk`` (a ``save_to_disk`` folder) or
            ``hub`` (a Hugging Face dataset id).
        location: The local path (files, folders) or the hub id.
        split: The split to take: of a hub dataset or a ``DatasetDict`` folder (files have one, ``train``).
        config: The hub dataset's configuration (``load_dataset``'s ``name``); None for every other kind.
    """

    text: str
    kind: SourceKind
    location: str
    split: str = "train"
    config: str | None = None

    @property
    def is_local(self) -> bool:
        """True for a file or folder on this machine (everything but a hub id)."""
        return self.kind != "hub"

    def describe(self) -> str:
        """One line naming the source, e.g. ``JSON file 'data/x.jsonl'`` or ``hub dataset 'org/name' (split test)``."""
        if self.kind == "hub":
            extra = f", config {self.config}" if self.config else ""
            return f"hub dataset {self.location!r} (split {self.split}{extra})"
        if self.kind == "disk":
            return f"saved dataset folder {self.location!r}"
        return f"{self.kind.upper()} file {self.location!r}"


def parse_source(text: str, *, split: str | None = None) -> SourceSpec:
    """Parse a dataset source spec.

    Args:
        text: The spec (see the module docstring for the forms).
        split: The split to take when the spec names none (``@split``); None: ``train``. A spec's ``@split``
            that differs from a given ``split`` is an error.

    Returns:
        The parsed :class:`SourceSpec`.

    Raises:
        InvalidArgumentError: Empty text, an empty path after a prefix, a bare path of no known format that is
            neither an existing folder nor an ``org/name`` hub id, or two different splits.
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgumentError(f"dataset source must be a non-empty string, got {text!r}")
    text = text.strip()
    prefix, sep, rest = text.partition(":")
    prefix = prefix.lower()
    if sep and prefix in FILE_FORMATS:
        return SourceSpec(text, FILE_FORMATS[prefix], _nonempty(text, rest), _file_split(text, split))
    if sep and prefix == "disk":
        return SourceSpec(text, "disk", _nonempty(text, rest), _one_split(text, None, split))
    if sep and prefix == "hf":
        return _hub(text, _nonempty(text, rest), split)
    suffix = Path(text).suffix.lower().lstrip(".")
    if suffix in FILE_FORMATS:
        return SourceSpec(text, FILE_FORMATS[suffix], text, _file_split(text, split))
    if Path(text).is_dir():
        return SourceSpec(text, "disk", text, _one_split(text, None, split))
    if _BARE_HUB_RE.match(text) and not suffix:
        return _hub(text, text, split)
    raise InvalidArgumentError(
        f"dataset source {text!r}: not a file of a known format (.json, .jsonl, .parquet, .csv), not an "
        "existing folder and not a hub id 'org/name'; write json:PATH, jsonl:PATH, parquet:PATH, csv:PATH, "
        "disk:FOLDER or hf:ID"
    )


def _nonempty(text: str, rest: str) -> str:
    if not rest.strip():
        raise InvalidArgumentError(f"dataset source {text!r} names no path or id after its prefix")
    return rest.strip()


def _one_split(text: str, own: str | None, given: str | None) -> str:
    """The split a spec takes: its own ``@split``, the given one, or ``train``; two different ones are an error."""
    if given is not None and not (isinstance(given, str) and given.strip()):
        raise InvalidArgumentError(
            f"dataset source {text!r}: split must be a non-empty string, got {given!r}"
        )
    if own is not None and given is not None and own != given:
        raise InvalidArgumentError(
            f"dataset source {text!r} names split {own!r} but the split given is {given!r}; keep one"
        )
    return own or given or "train"


def _file_split(text: str, given: str | None) -> str:
    """A file's split: ``train``, its one split of rows; another given split would be ignored, so it is refused.

    Raises:
        InvalidArgumentError: ``given`` is neither None nor ``train`` (the file and the split named).
    """
    split = _one_split(text, None, given)
    if split != "train":
        raise InvalidArgumentError(
            f"dataset source {text!r} is a file: its rows are one split, so split {split!r} would be ignored; "
            "hold rows out with dataset.eval_path (a file) or eval_fraction, or name a hub dataset or a saved "
            "DatasetDict folder for named splits"
        )
    return split


def _hub(text: str, body: str, split: str | None) -> SourceSpec:
    """A hub spec ``ID[:config][@split]``."""
    body, at, own_split = body.partition("@")
    ident, colon, config = body.partition(":")
    if not _HUB_ID_RE.match(ident) or (colon and not config) or (at and not own_split):
        raise InvalidArgumentError(
            f"dataset source {text!r}: a hub dataset is written ID, ID:config, ID@split or ID:config@split "
            "(e.g. openai/gsm8k:main@test)"
        )
    return SourceSpec(text, "hub", ident, _one_split(text, own_split or None, split), config or None)
