"""The policy actor's own take from its agents' tables (OpenRLHF's actor-owned buffer, Reverb's learner dataset).

The driver keeps the take's slot rule, waits and reconnects (:class:`~services.trainer.data.batch_reader.BatchReader`)
and sends each sample call here: table, count, policy version and where the store is. The actor's
:class:`~services.trainer.data.table_sampler.TableSampler` keeps the trajectories and answers with episode ids and
figures, so the driver never deserialises a token.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from marti.types.trajectory import Trajectory
from services.trainer.data.table_sampler import BatchSummary, SampledIds, TableSampler


@dataclass(frozen=True)
class StoreAccess:
    """Where a policy actor reaches the experience store.

    Attributes:
        address: The store's ``host:port``.
        token: Bearer token (the job passes the one its own store client sends); None lets the client read
            ``MARTI_STORE_TOKEN`` / ``MARTI_TOKEN`` in the actor.
        ca_file: CA file for TLS; None = plaintext.
    """

    address: str
    token: str | None = None
    ca_file: str | None = None


class TableTaking:
    """The take methods of :class:`~services.trainer.ray.policy_worker.PolicyWorker` (a mixin): one
    :class:`TableSampler` per actor, on a store client built on first use from a :class:`StoreAccess`."""

    _sampler: TableSampler | None = None
    _access: StoreAccess | None = None
    _sampler_lock = threading.Lock()  # one policy actor per process

    def _table_sampler(self, access: StoreAccess) -> TableSampler:
        """The actor's sampler, with a store client for ``access`` (a new one when the address changed)."""
        from marti.clients.experience import ExperienceSharingClient

        with self._sampler_lock:
            if self._sampler is None or self._access != access:
                if self._sampler is not None:
                    self._sampler.store.close()
                store = ExperienceSharingClient(
                    "trainer", access.address, token=access.token, tls_ca_file=access.ca_file
                )
                self._sampler, self._access = TableSampler(store), access
            return self._sampler

    def take_items(
        self, agent: str, table: str, count: int, current_version: int, access: StoreAccess
    ) -> SampledIds | None:
        """One sample call of ``agent``'s update (see :meth:`TableSampler.sample`): at most ~2 s of waiting.

        Raises:
            UnavailableError: the store cannot be reached (the driver reconnects and calls again).
        """
        return self._table_sampler(access).sample(agent, table, count, current_version)

    def batch_summary(self, agent: str, current_version: int) -> BatchSummary:
        """Close ``agent``'s take and answer its figures (:meth:`TableSampler.summary`; empty when nothing was
        taken in this actor)."""
        if self._sampler is None:
            return BatchSummary()
        return self._sampler.summary(agent, current_version)

    def pop_taken(self, agent: str, keep: list[int] | None = None) -> list[Trajectory]:
        """The kept trajectories of ``agent``'s last summarised batch (:meth:`TableSampler.pop`); passed by
        reference to this actor's update (and to separate reference and critic actors), never to the driver.

        Raises:
            FailedPreconditionError: no batch of ``agent`` is waiting, or ``keep`` is out of range.
        """
        if self._sampler is None:
            return []
        return self._sampler.pop(agent, keep)
