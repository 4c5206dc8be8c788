"""The ``dataset:`` section of the training config: the problems a job trains on come from a dataset (a local
JSON, JSONL, Parquet or CSV file, a ``save_to_disk`` folder or a Hugging Face hub id; docs/datasets.md).

Validated with the rest of the config: types, ``eval_path`` and ``eval_fraction`` not both set, and each source
spec parsed and, when local, checked to exist, so a missing file is named before the job starts. The rows
themselves are read and checked by :func:`marti.data.load_problems`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from marti.config.section import Section
from marti.errors import MartiError

#: The env that plays a ``dataset`` section's rows (services/env_server/envs/dataset_task.py).
DATASET_ENV = "dataset_task"

#: Numbers and switches must be written as such: ``max_samples: true`` or ``shuffle: 1`` is a mistake, not 1 / true.
_Fraction = Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False, strict=True)]


class DatasetConfig(Section):
    """Where the training problems come from, which columns hold the prompt and the label, the held-out split
    and the order (docs/datasets.md)."""

    path: str
    """The training source: ``json:PATH``, ``jsonl:PATH``, ``parquet:PATH``, ``csv:PATH``, a bare path ending in
    ``.json``/``.jsonl``/``.parquet``/``.csv``, ``disk:FOLDER`` or an existing folder written by
    ``save_to_disk``, or a hub dataset ``hf:ID`` / ``org/name`` (``ID:config@split``). Relative paths are
    relative to the working directory of ``marti train``; a missing local file is an error at config load."""
    split: str | None = None
    """Split of a hub dataset or of a saved ``DatasetDict`` folder; null: the spec's ``@split``, else ``train``."""
    input_key: str = "prompt"
    """Column holding each problem's prompt text (OpenRLHF's ``--input_key``)."""
    label_key: str | None = "answer"
    """Column holding each problem's reference answer (OpenRLHF's ``--label_key``). Every row must have one, text
    or a number (not null, not empty; a list, an object or a boolean is refused). Null (no label) only with a custom env by import path: the ``dataset_task`` env's verifier
    reads every row's label."""
    eval_path: str | None = None
    """Held-out source, in the same forms as ``path``; null: ``eval_fraction``, or no held-out set."""
    eval_fraction: _Fraction | None = None
    """Fraction of ``path``'s rows held out, in (0, 1): ``round(n * eval_fraction)`` rows drawn with ``seed``
    (the same rows for the same seed), disjoint from the training rows; both parts must be non-empty. Not with
    ``eval_path``."""
    max_samples: Annotated[int, Field(ge=1, strict=True)] | None = None
    """Use only the first this many rows of each source (OpenRLHF's ``--max_samples``), before any split;
    null: all rows."""
    shuffle: Annotated[bool, Field(strict=True)] = True
    """Play the training rows in a fresh seeded order each epoch (every row once per epoch); false: file
    order every epoch."""
    seed: Annotated[int, Field(strict=True)] | None = None
    """Seed of the per-epoch order and of the ``eval_fraction`` split; null: the job's ``seed``. Set with neither
    (``shuffle: false``, no ``eval_fraction``) it would do nothing and is refused."""

    @field_validator("input_key", "label_key")
    @classmethod
    def _nonempty_key(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must name a column")
        return value

    @field_validator("path", "eval_path")
    @classmethod
    def _check_source(cls, value: str | None) -> str | None:
        """Parse the spec and check that a local source exists (a hub id is checked when it is loaded)."""
        from marti.data.load import check_local
        from marti.data.spec import parse_source

        if value is not None:
            try:
                check_local(parse_source(value))
            except MartiError as exc:
                raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _check_together(self) -> DatasetConfig:
        from marti.data.spec import parse_source

        if self.eval_path is not None and self.eval_fraction is not None:
            raise ValueError(
                "dataset.eval_path and dataset.eval_fraction are both set; give one held-out split"
            )
        if self.label_key is not None and self.label_key == self.input_key:
            raise ValueError(
                f"dataset.input_key and dataset.label_key are the same column {self.input_key!r}"
            )
        if self.seed is not None and not self.shuffle and self.eval_fraction is None:
            raise ValueError(
                "dataset.seed is set but nothing reads it: it seeds the per-epoch order (dataset.shuffle, false "
                "here) and the eval_fraction split (none here); remove dataset.seed or set one of those"
            )
        try:
            parse_source(self.path, split=self.split)
        except MartiError as exc:
            raise ValueError(f"dataset.split: {exc}") from None
        return self
