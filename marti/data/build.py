"""The problems of a job's ``dataset:`` section: the training set, the held-out set (a file or a seeded fraction)
and the order the training rows are played in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marti.config.sections.dataset import DatasetConfig
from marti.data.order import row_of
from marti.data.problems import ProblemSet
from marti.data.split import split_indices
from marti.errors import InvalidArgumentError


@dataclass(frozen=True)
class Problems:
    """A job's problems: the training set, the held-out set (or None), and their order.

    Attributes:
        train: The training problems.
        eval: The held-out problems; None when the section gives neither ``eval_path`` nor ``eval_fraction``.
        seed: The seed of the per-epoch order.
        shuffle: False: training rows in source order every epoch.
    """

    train: ProblemSet
    eval: ProblemSet | None
    seed: int
    shuffle: bool = True

    def row_index(self, k: int) -> int:
        """The training row played as global problem ``k`` (0-based, counted across epochs and resumes):
        :func:`marti.data.order.row_of` over ``len(train)`` rows.

        Raises:
            InvalidArgumentError: ``k < 0`` or not an int.
        """
        return row_of(k, len(self.train), seed=self.seed, shuffle=self.shuffle)

    def problem(self, k: int) -> dict[str, Any]:
        """The row (every column, a copy) played as global problem ``k``."""
        return self.train.row(self.row_index(k))


def load_problems(
    config: DatasetConfig, *, seed: int | None = None, labels_required: bool = False
) -> Problems:
    """Load and check the problems a ``dataset:`` section describes.

    ``max_samples`` keeps the first rows of each source; ``eval_fraction`` then holds out a seeded part of the
    training source (:func:`marti.data.split.split_indices`), keeping every row's source position for errors.

    Args:
        config: The section (from a validated :class:`~marti.config.TrainConfig`, its seed filled in).
        seed: The seed to use when ``config.seed`` is null (a section built on its own); else ignored.
        labels_required: The job cannot do without labels (its verifier reads them): a missing ``label_key``
            column's error then suggests no ``label_key: null`` (:func:`marti.data.checks.check_columns`).

    Returns:
        The training and held-out problems and their order.

    Raises:
        InvalidArgumentError: No seed at all, a bad source or row (see :class:`~marti.data.ProblemSet`), or an
            ``eval_fraction`` that leaves a part empty.
        NotFoundError: A missing file, folder, split or hub dataset.
        UnavailableError: The hub cannot be reached, or ``datasets`` is not installed.
    """
    resolved = config.seed if config.seed is not None else seed
    if resolved is None:
        raise InvalidArgumentError("dataset.seed is null and no job seed was given")
    keys = {
        "input_key": config.input_key,
        "label_key": config.label_key,
        "max_samples": config.max_samples,
        "labels_required": labels_required,
    }
    train = ProblemSet.from_source(config.path, split=config.split, **keys)
    held: ProblemSet | None = None
    if config.eval_path is not None:
        held = ProblemSet.from_source(config.eval_path, **keys)
    elif config.eval_fraction is not None:
        rows, out = split_indices(len(train), config.eval_fraction, seed=resolved, source=train.source)
        described = f"{train.source}, eval_fraction {config.eval_fraction} seed {resolved}"
        train, held = (
            train.subset(rows, source=f"{described} (training part)"),
            train.subset(out, source=f"{described} (held-out part)"),
        )
    return Problems(train=train, eval=held, seed=resolved, shuffle=config.shuffle)
