"""A dataset job's problems as the trainer plays them (the ``dataset:`` section, docs/datasets.md).

Seeds name rows: training row ``i`` (of the loaded training set, after ``max_samples`` and the held-out split) is
played under problem seed ``i``, held-out row ``j`` under seed ``n_train + j``. Global training problem ``k``
(``k = step * problems_per_step + p``, counted across epochs and resumes) plays row
:meth:`marti.data.Problems.row_index` ``(k)``: a fresh seeded order each epoch, every row once per epoch, so a
resumed job continues at the right row. Each episode's env config carries its row (``row``, every column), so a
remote env server needs no access to the user's files and plays the same problems as an in-process env.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from marti.config import TrainConfig
from marti.config.sections.dataset import DATASET_ENV
from marti.data import Problems, load_problems
from marti.data.split import shared_prompts
from marti.errors import InvalidArgumentError

_LOG = logging.getLogger("marti.trainer")


class DatasetTasks:
    """The loaded problems of a job's ``dataset`` section, and how seeds, rows and env configs map.

    Args:
        cfg: A training config with a ``dataset`` section.

    Raises:
        InvalidArgumentError / NotFoundError / UnavailableError: The data cannot be loaded or checked (see
            :func:`marti.data.load_problems`; file, row and column named), before the job starts.
    """

    def __init__(self, cfg: TrainConfig) -> None:
        if cfg.dataset is None:
            raise InvalidArgumentError("DatasetTasks needs a config with a dataset section")
        self.section = cfg.dataset
        self.problems: Problems = load_problems(
            cfg.dataset, seed=cfg.seed, labels_required=cfg.environment.env_name == DATASET_ENV
        )
        self.n_train = len(self.problems.train)
        self.n_eval = len(self.problems.eval) if self.problems.eval is not None else 0

    def check_evaluation(self, cfg: TrainConfig) -> None:
        """Refuse evaluations without a held-out set (what :meth:`fit` checks first; ``marti train``'s pre-checks
        call it alone, before the run folder, and the job's loop fits once).

        Raises:
            InvalidArgumentError: ``rollout.eval_every > 0`` and the section has no held-out set.
        """
        if cfg.rollout.eval_every > 0 and self.n_eval == 0:
            raise InvalidArgumentError(
                f"rollout.eval_every is {cfg.rollout.eval_every} but dataset {self.section.path!r} has no "
                "held-out set: set dataset.eval_path or dataset.eval_fraction, or rollout.eval_every: 0"
            )

    def fit(self, cfg: TrainConfig) -> TrainConfig:
        """``cfg`` with the rollout's seed schedule sized to the data: ``num_train_seeds`` is the training row
        count (an epoch of ``max_epochs`` is one pass over the rows), training seeds start at 0 and the held-out
        seeds are the held-out rows' (``eval_episodes`` capped at their count; when it is below their count, a
        warning says how many of them each evaluation plays).

        Raises:
            InvalidArgumentError: As :meth:`check_evaluation`.
        """
        self.check_evaluation(cfg)
        r = cfg.rollout
        if self.n_eval:
            if (
                r.eval_every > 0 and r.eval_episodes < self.n_eval
            ):  # said, not silent: the rest is never played
                _LOG.warning(
                    "each evaluation plays the first %d of the %d held-out rows (rollout.eval_episodes=%d); "
                    "set rollout.eval_episodes: %d to evaluate them all", r.eval_episodes, self.n_eval,
                    r.eval_episodes, self.n_eval,
                )  # fmt: skip
            self._warn_shared_prompts(seen_columns(cfg))
        return self.sized(cfg)

    def sized(self, cfg: TrainConfig) -> TrainConfig:
        """``cfg`` with the seed schedule :meth:`fit` gives it, without its checks and warnings: what the run
        folder's ``--resume`` check reads the job's last step from (:attr:`~marti.config.TrainConfig.total_steps`,
        ``max_epochs`` passes over the training rows) before the job fits its config."""
        r = cfg.rollout
        update: dict[str, Any] = {"num_train_seeds": self.n_train, "train_seed_start": 0}
        if self.n_eval:
            update["eval_seeds"] = [self.n_train + j for j in range(self.n_eval)]
            update["eval_episodes"] = min(r.eval_episodes, self.n_eval)
        return cfg.model_copy(update={"rollout": r.model_copy(update=update)})

    def _warn_shared_prompts(self, columns: list[str]) -> None:
        """Say (a warning) how many held-out rows repeat a training row in every column of ``columns`` (what the
        agents see, :func:`seen_columns`), naming the first pair."""
        train, held = self.problems.train, self.problems.eval
        seen = (
            (lambda ps, i: ps.prompt(i)) if len(columns) == 1 else (lambda ps, i: _seen(ps.row(i), columns))
        )
        shared = shared_prompts(
            [seen(train, i) for i in range(len(train))], [seen(held, j) for j in range(len(held))]
        )
        if shared:
            j, i = shared[0]
            what = (
                "the prompt of a training row"
                if len(columns) == 1
                else f"the inputs of a training row (columns {columns}, what the agents see)"
            )
            _LOG.warning(
                "%d of the %d held-out rows have %s (%s of dataset %s is %s of "
                "dataset %s): the held-out accuracy counts them as unseen; remove the duplicate rows from the "
                "data", len(shared), len(held), what, held.where(j), held.source, train.where(i), train.source,
            )  # fmt: skip

    def train_seeds(self, step: int, problems_per_step: int, group_size: int) -> list[int]:
        """Problem seeds of training step ``step`` (0-based): ``problems_per_step`` rows in the per-epoch order,
        each repeated ``group_size`` times (consecutive equal seeds form a group).

        Raises:
            InvalidArgumentError: ``step`` is negative.
        """
        if step < 0:
            raise InvalidArgumentError(f"step must be >= 0, got {step}")
        first = step * problems_per_step
        rows = [self.problems.row_index(first + p) for p in range(problems_per_step)]
        return [row for row in rows for _ in range(group_size)]

    def row(self, seed: int) -> dict[str, Any]:
        """The row (every column, a copy) played under problem ``seed``.

        Raises:
            InvalidArgumentError: ``seed`` names no row (negative, or past the held-out rows).
        """
        if 0 <= seed < self.n_train:
            return self.problems.train.row(seed)
        if self.problems.eval is not None and 0 <= seed - self.n_train < self.n_eval:
            return self.problems.eval.row(seed - self.n_train)
        raise InvalidArgumentError(
            f"problem seed {seed} names no row: {self.n_train} training rows (seeds 0..{self.n_train - 1}) "
            f"and {self.n_eval} held-out rows after them"
        )

    def describe(self, seed: int) -> str:
        """How errors name the row played under ``seed``: ``row 7 (x.jsonl:9) of dataset JSON file 'x.jsonl'``
        (:meth:`marti.data.ProblemSet.where`: its 0-based position in its source and, for a JSON, JSON lines or
        CSV file, its 1-based line, as every dataset error names rows).

        Raises:
            InvalidArgumentError: ``seed`` names no row.
        """
        self.row(seed)
        ps, i = (
            (self.problems.train, seed) if seed < self.n_train else (self.problems.eval, seed - self.n_train)
        )
        return f"{ps.where(i)} of dataset {ps.source}"

    def env_config(self, cfg: TrainConfig, seed: int) -> dict[str, Any]:
        """The env config of the episode played under ``seed``: its ``row``, the section's column keys, the
        team, ``environment.max_turns`` and ``environment.options`` (which win). A custom env by import path
        gets the same keys."""
        out: dict[str, Any] = {
            "row": self.row(seed),
            "input_key": self.section.input_key,
            "agents": [a.name for a in cfg.agents],
            "max_turns": cfg.environment.max_turns,
        }
        if self.section.label_key is not None:
            out["label_key"] = self.section.label_key
        out.update(cfg.environment.options)
        return out


def seen_columns(cfg: TrainConfig) -> list[str]:
    """The columns a dataset job's agents see: ``dataset.input_key`` and, in a ``dataset_task`` job, each column
    of ``environment.options.agent_inputs`` (agent -> the column it sees instead), in that order, each once."""
    columns = [cfg.dataset.input_key] if cfg.dataset is not None else []
    if cfg.environment.env_name == DATASET_ENV:
        for column in (cfg.environment.options.get("agent_inputs") or {}).values():
            if isinstance(column, str) and column not in columns:
                columns.append(column)
    return columns


def _seen(row: dict[str, Any], columns: list[str]) -> str:
    """``row``'s values in ``columns``, as one comparable text (JSON of the list)."""
    return json.dumps([row.get(c) for c in columns], sort_keys=True, ensure_ascii=False)
