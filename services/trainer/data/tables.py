"""The trainable agents' store tables of one job: their names and how a job claims them.

Layout (Reverb's, and OpenRLHF's actors -> buffer -> learner): every trainable agent has a queue table in
experience_store, ``<training_name>/<agent>`` (FIFO, each item sampled once, inserts wait when it is full, items
older than the agent's staleness bound removed instead of returned). A job claims its tables when it starts:
each is created (idempotent for an identical config) and reset (the store's ``Reset``), which drops the items an
earlier, interrupted attempt of the job left and starts the scope of the store's idempotent insert anew, so a
job whose external clients reuse an earlier job's episode ids gets every episode in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from marti.errors import AlreadyExistsError

_LOG = logging.getLogger("marti.trainer.tables")

#: ``reconnecting(fn, what)`` runs ``fn`` again while the services restart (TrainingLoop._reconnecting).
Reconnecting = Callable[[Callable[[], Any], str], Any]


def table_name(training_name: str, agent: str) -> str:
    """The store table of ``agent`` in job ``training_name``: ``<training_name>/<agent>``."""
    return f"{training_name}/{agent}"


def table_settings(cfg: Any) -> tuple[dict[str, int], int]:
    """A job's table settings from its config (a :class:`marti.config.TrainConfig`): per trainable agent its
    staleness bound (the table's ``max_policy_lag``), and the queue size, 4 steps' items and at least 1000."""
    return {a: cfg.max_staleness_for(a) for a in cfg.tuning_agents}, max(1000, 4 * cfg.items_per_step)


def create_tables(
    store: Any, training_name: str, bounds: dict[str, int], max_size: int, reconnecting: Reconnecting
) -> dict[str, str]:
    """Create every trainable agent's queue table (idempotent for an identical config; nothing is reset): the
    first part of :func:`claim_tables`, which ``marti train`` also runs against a given store before the run
    folder, so a table of another config is refused before ``--overwrite`` clears the old run.

    Args:
        store, training_name, bounds, max_size, reconnecting: as :func:`claim_tables`.

    Returns:
        Per agent its table name.

    Raises:
        AlreadyExistsError: as :func:`claim_tables`.
    """
    tables = {a: table_name(training_name, a) for a in bounds}
    for agent, table in tables.items():
        try:
            reconnecting(
                lambda t=table, a=agent: store.create_table(
                    t, preset="queue", max_size=max_size, max_policy_lag=bounds[a]
                ),
                f"creating table {table!r}",
            )
        except AlreadyExistsError as exc:
            raise AlreadyExistsError(
                f"{exc}. For agent {agent!r} this job asks for a queue table of max_size {max_size} (4 steps' "
                f"items, at least 1000) with max_policy_lag {bounds[agent]} (the agent's staleness bound: "
                "agents[i].max_staleness or rollout.max_staleness): keep the earlier settings of the fields "
                "named, or set another training_name (new, empty tables)"
            ) from None
    return tables


def claim_tables(
    store: Any, training_name: str, bounds: dict[str, int], max_size: int, reconnecting: Reconnecting
) -> tuple[dict[str, str], int]:
    """Create and reset every trainable agent's queue table for a new job.

    Args:
        store: An :class:`marti.ExperienceSharingClient`.
        training_name: Prefix of the table names.
        bounds: Per trainable agent, its staleness bound (the table's ``max_policy_lag``).
        max_size: Items a table holds before inserts wait (the queue rate limiter's size).
        reconnecting: Runs a call again while the store restarts.

    Returns:
        ``(tables, dropped)``: per agent its table name, and how many items earlier attempts left in them.

    Raises:
        AlreadyExistsError: a table of that name exists with another config (a job of the same
            ``training_name`` with other staleness settings on this store): the store's message (the differing
            fields, both values) and which job settings make the table and what to do.
    """
    tables = create_tables(store, training_name, bounds, max_size, reconnecting)
    dropped = 0
    for table in tables.values():
        dropped += reconnecting(lambda t=table: store.reset(t), f"resetting table {table!r}")
    if dropped:
        _LOG.warning("dropped %d items an earlier attempt of this job left in its tables", dropped)
    return tables, dropped
