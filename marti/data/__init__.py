"""Problems from data: a job's tasks read from a dataset through the ``datasets`` library (docs/datasets.md).

One module per job:

- :mod:`marti.data.spec`: source specs (``json:PATH``, ``data/x.parquet``, a ``save_to_disk`` folder,
  ``org/name@split``);
- :mod:`marti.data.load`: reading a source into rows (``load_dataset`` / ``load_from_disk``), typed errors;
- :mod:`marti.data.json_text`: a JSON file's values as written (columns mixing numbers and text);
- :mod:`marti.data.checks`: the row checks (columns, prompts, labels, JSON-able values);
- :mod:`marti.data.problems`: :class:`ProblemSet`, the checked rows with their prompt and label columns;
- :mod:`marti.data.split`: the seeded held-out fraction;
- :mod:`marti.data.order`: the row of global problem ``k`` (seeded per epoch), so resuming continues in place;
- :mod:`marti.data.build`: :func:`load_problems`, all of it for a ``dataset:`` config section.
- :mod:`marti.data.fingerprint`: what a run folder records of a ``dataset:`` section (each source's spec and the
  sha256 of its bytes), so that ``--resume`` warns when the data changed.

Typical use::

    problems = load_problems(cfg.dataset)          # cfg from marti.config.load_config
    row = problems.problem(k)                      # the row of the job's k-th problem, every column
    problems.train.prompt(0), problems.train.label(0)
"""

from __future__ import annotations

from marti.data.build import Problems, load_problems
from marti.data.order import permutation, row_of
from marti.data.problems import ProblemSet
from marti.data.spec import SourceSpec, parse_source
from marti.data.split import split_indices

__all__ = [
    "ProblemSet",
    "Problems",
    "SourceSpec",
    "load_problems",
    "parse_source",
    "permutation",
    "row_of",
    "split_indices",
]
