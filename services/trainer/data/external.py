"""Which external episodes (those the inference gateway inserted as their clients reported them) no update has
taken yet: the learner's slot rule and the job's last line read it.

An external episode removed by its table as stale takes no slot of an update (external episodes are not aligned
with steps, so the update waits for a fresh one); the job's last line warns about external episodes reported but
never trained (:meth:`ExternalEpisodes.untaken`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

#: External episode ids remembered (to tell a stale external removal from a built-in one).
REMEMBERED_IDS = 100_000


class ExternalEpisodes:
    """External episodes inserted into the trainable agents' tables, and those not taken yet (thread-safe).

    Args:
        agents: The trainable agents.
    """

    def __init__(self, agents: list[str]) -> None:
        self._lock = threading.Lock()
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._untaken: dict[str, OrderedDict[str, None]] = {a: OrderedDict() for a in agents}

    def inserting(self, agent: str, episode_id: str) -> None:
        """An external episode's item is about to go into ``agent``'s table (recorded first: the learner may take
        it the moment it lands)."""
        with self._lock:
            self._untaken[agent][episode_id] = None
            _remember(self._ids, episode_id)

    def not_inserted(self, agent: str, episode_id: str) -> None:
        """The item's insert failed: it is not waiting in the table."""
        with self._lock:
            self._untaken[agent].pop(episode_id, None)

    def taken(self, agent: str, episode_id: str) -> None:
        """An update took (or the table removed) one of the agent's episodes."""
        with self._lock:
            self._untaken[agent].pop(episode_id, None)

    def is_external(self, episode_id: str) -> bool:
        """Whether ``episode_id`` is an external episode (of the last :data:`REMEMBERED_IDS`)."""
        with self._lock:
            return episode_id in self._ids

    def untaken(self) -> int:
        """External episodes inserted that no update has taken yet (trained on, or removed as stale or dropped
        with their group): the most of any agent's table."""
        with self._lock:
            return max((len(ids) for ids in self._untaken.values()), default=0)


def _remember(ids: OrderedDict[str, None], episode_id: str) -> None:
    """Add ``episode_id`` to ``ids``, forgetting the oldest beyond :data:`REMEMBERED_IDS`."""
    ids[episode_id] = None
    while len(ids) > REMEMBERED_IDS:
        ids.popitem(last=False)
