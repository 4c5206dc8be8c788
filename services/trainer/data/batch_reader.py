"""The learner's end of the trainable agents' tables: each update takes its batch from the agent's table.

Each update, the learner takes the next ``count`` items of the agent's table (``rollout.episodes_per_step``,
plus the external episodes of a step), stating its current policy version. The store keeps the exactly-once
rules: the table removes items older than its ``max_policy_lag`` (the agent's staleness bound) instead of
returning them, and takes whole groups only (``whole_groups``): items sharing a ``group_id`` with a
``group_size`` >= 2 come together once the whole group is in the table (a group still missing members is passed
over and stays in the table for a later update), and a group with a stale member is removed whole, so GRPO
never sees a group shrunk by staleness or split across two updates. Built-in items removed as stale still use a
slot, so updates stay aligned with rollout steps; an external episode (one the gateway inserted) removed as
stale takes none: external episodes are not aligned with steps, so the update waits for a fresh one. Items
inserted by any other process (:class:`marti.ExperienceSharingClient` ``share_experience`` with behaviour
log-probs and a policy version) are trained on the same way. The reader runs on the driver and keeps the slot
rule, the waits and the reconnects; the sample calls run on the learner's side
(:class:`~services.trainer.data.table_sampler.TableSampler` in the agent's policy actor), which keeps the
trajectories and answers with episode ids.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from marti.errors import CancelledError, DeadlineExceededError, FailedPreconditionError

from .external import ExternalEpisodes
from .table_sampler import SampledIds
from .tables import Reconnecting

#: One sample call on the learner's side (:meth:`~services.trainer.data.table_sampler.TableSampler.sample` in
#: the agent's policy actor): ``(agent, table, count, current_version)`` -> ids taken, or None when the table
#: stayed empty for its poll.
Sample = Callable[[str, str, int, int], "SampledIds | None"]


@dataclass
class Taken:
    """One update's batch of an agent, as taken from its table (the trajectories stay with the sampler).

    Attributes:
        item_ids: Episode ids of the items to train on, in table order (whole groups).
        stale: Items the table removed as older than the agent's bound.
        dropped: Fresh items the table removed with their group because a member was stale.
    """

    item_ids: list[str] = field(default_factory=list)
    stale: int = 0
    dropped: int = 0


class BatchReader:
    """Takes each update's batch of the trainable agents from their tables.

    Args:
        sample: One sample call of the learner's side (:data:`Sample`; a policy actor's
            :class:`~services.trainer.data.table_sampler.TableSampler`, bounded at its poll of
            :data:`~services.trainer.data.table_sampler.SAMPLE_POLL_S`).
        tables: Per trainable agent, its table (:func:`services.trainer.data.tables.claim_tables`).
        reconnecting: Runs a call again while the store restarts.
        external: The job's external episodes (an external stale removal takes no slot).
    """

    def __init__(
        self, sample: Sample, tables: dict[str, str], reconnecting: Reconnecting, external: ExternalEpisodes
    ) -> None:
        self.sample = sample
        self.tables = tables
        self._reconnecting = reconnecting
        self.external = external

    def take(
        self,
        agent: str,
        count: int,
        current_version: int,
        *,
        deadline: float | None = None,
        stop: threading.Event | None = None,
    ) -> Taken:
        """The next ``count`` items of the agent's table (one update's batch), whole groups only.

        Without ``deadline`` the items are read once the step's rollout is over: every item of the step is in,
        so a missing one is an error. With one (external episodes, which arrive whenever their clients report),
        the table is polled until ``count`` items came or the deadline passed. A group may carry the batch past
        ``count`` (its members come together); a group still missing members stays in the table.

        Args:
            agent: A trainable agent.
            count: Items to consume: returned, or removed as stale or with a stale group (external episodes
                removed as stale do not count: the update waits for fresh ones).
            current_version: The learner's policy version of the agent, for the table's ``max_policy_lag``.
            deadline: ``time.monotonic()`` value until which missing items are waited for; None = no wait.
            stop: When set while waiting, the wait ends (the job is stopping).

        Returns:
            A :class:`Taken`.

        Raises:
            FailedPreconditionError: no ``deadline`` and the table ran dry before ``count`` items (nothing came
                within the sampler's poll; an empty table is not a service outage to reconnect from).
            DeadlineExceededError: ``deadline`` passed before ``count`` items came (the counts are named; the
                items taken so far are consumed).
            CancelledError: ``stop`` was set while waiting.
        """
        table = self.tables[agent]
        out = Taken()
        consumed = 0
        while consumed < count:
            got = self._reconnecting(
                lambda n=count - consumed: self.sample(agent, table, n, current_version),
                f"sampling {table!r}",
            )
            if got is None and deadline is None:
                raise FailedPreconditionError(
                    f"table {table!r} holds {consumed} of the {count} items this update needs and no "
                    "rollout will insert more"
                )
            if got is not None:
                consumed += self._accept(agent, got, out)
            if deadline is not None and consumed < count:
                _check_wait(table, consumed, count, deadline, stop)
        return out

    def _accept(self, agent: str, got: SampledIds, out: Taken) -> int:
        """Add a sample call's result to ``out``: its items to train on, and the episodes the table removed as
        stale or with a stale group.

        Returns:
            How many of them used a slot of the update (everything but an external episode removed as stale).
        """
        used = 0
        for eid in got.stale_ids:
            used += 0 if self.external.is_external(eid) else 1
            self.external.taken(agent, eid)
            out.stale += 1
        for eid in got.dropped_ids:
            self.external.taken(agent, eid)
            used += 1
            out.dropped += 1
        for eid in got.item_ids:
            self.external.taken(agent, eid)
            used += 1
            out.item_ids.append(eid)
        return used


def _check_wait(table: str, consumed: int, count: int, deadline: float, stop: threading.Event | None) -> None:
    """Raise when a waiting :meth:`BatchReader.take` must give up: the job stops, or the deadline passed."""
    if stop is not None and stop.is_set():
        raise CancelledError(
            f"stopped while table {table!r} held {consumed} of the {count} items this update needs"
        )
    if time.monotonic() >= deadline:
        raise DeadlineExceededError(
            f"table {table!r} got {consumed} of the {count} items this update needs in time"
        )
