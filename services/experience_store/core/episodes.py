"""What a table knows about its items' episodes and groups: the idempotent insert's memory and the whole-groups
sample's index.

An idempotent insert is keyed by ``(episode_id, agent_id)`` (:func:`once_key`): each agent of a team inserts its
own trajectory of the episode. It is answered as a duplicate when the same agent's trajectory of the episode is
in the table, held by an open sample, or was taken from the table (sampled out, removed as stale or dropped with
its group) within the last ``window`` taken keys; a deleted episode id is taken for every agent. The memory of
taken keys is bounded (oldest forgotten first) and lives in memory only: a restarted store still knows the items
its tables hold, but not those taken before the restart. A table's reset (:meth:`EpisodeIndex.forget_taken`)
ends the memory's scope: the next job starts with none.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

from .storage import ItemRecord

#: The agent part of a taken key that stands for every agent of the episode (a deleted episode id).
_ANY_AGENT = None


def once_key(episode_id: str, agent_id: str) -> tuple[str, str]:
    """The key an idempotent insert is "once" by: one agent's trajectory of one episode."""
    return (episode_id, agent_id)


def grouped(rec: ItemRecord) -> bool:
    """Whether an item belongs to a group a whole-groups sample keeps together: a group id and a size >= 2."""
    return bool(rec.group_id) and rec.group_size >= 2


class EpisodeIndex:
    """Episode ids and groups of one table's items (the caller holds the table's lock).

    Args:
        window: Taken ids (see the module docstring; and dropped group ids) remembered, count (>= 0; 0 = none).
    """

    def __init__(self, window: int) -> None:
        self.window = window
        self._episodes: dict[str, set[int]] = {}
        self._once: dict[tuple[str, str], set[int]] = {}  # once_key -> keys of the table's items
        self._groups: dict[str, set[int]] = {}
        self._held: Counter = Counter()  # once_keys of items removed by open takes
        self._taken: OrderedDict[tuple[str, str | None], None] = OrderedDict()
        self._dropped_groups: OrderedDict[str, int] = OrderedDict()  # group id -> members still to come

    def add(self, rec: ItemRecord) -> None:
        """Index an item that entered the table."""
        self._episodes.setdefault(rec.episode_id, set()).add(rec.key)
        self._once.setdefault(once_key(rec.episode_id, rec.agent_id), set()).add(rec.key)
        if grouped(rec):
            self._groups.setdefault(rec.group_id, set()).add(rec.key)

    def remove(self, rec: ItemRecord) -> None:
        """Forget an item that left the table."""
        _discard(self._episodes, rec.episode_id, rec.key)
        _discard(self._once, once_key(rec.episode_id, rec.agent_id), rec.key)
        if grouped(rec):
            _discard(self._groups, rec.group_id, rec.key)

    def keys(self, episode_ids: set[str]) -> list[int]:
        """Keys of the table's items of these episodes."""
        return [k for e in episode_ids for k in self._episodes.get(e, ())]

    def members(self, group_id: str) -> set[int]:
        """Keys of the table's items of a group."""
        return self._groups.get(group_id, set())

    def duplicate(self, episode_id: str, agent_id: str) -> int | None:
        """For an idempotent insert: None when this agent's trajectory of the episode is new to the table; else
        the key of its item still in the table (the smallest), or 0 when it was taken (or is held by an open
        sample, or the episode was deleted)."""
        key = once_key(episode_id, agent_id)
        keys = self._once.get(key)
        if keys:
            return min(keys)
        if self._held[key] > 0 or key in self._taken or (episode_id, _ANY_AGENT) in self._taken:
            return 0
        return None

    def hold(self, recs, sign: int) -> None:
        """An open take removed (+1) or put back / committed (-1) these items."""
        for rec in recs:
            key = once_key(rec.episode_id, rec.agent_id)
            self._held[key] += sign
            if self._held[key] <= 0:
                del self._held[key]

    def taken(self, recs) -> None:
        """Remember these items' trajectories as taken (the oldest beyond ``window`` are forgotten)."""
        for rec in recs:
            _remember(self._taken, once_key(rec.episode_id, rec.agent_id), self.window)

    def deleted(self, episode_ids) -> None:
        """Remember these episodes as taken for every agent (the oldest beyond ``window`` are forgotten)."""
        for e in episode_ids:
            _remember(self._taken, (e, _ANY_AGENT), self.window)

    def was_deleted(self, episode_id: str) -> bool:
        """Whether the episode id was deleted (:meth:`deleted`) within the window."""
        return (episode_id, _ANY_AGENT) in self._taken

    def forget_taken(self) -> None:
        """Forget every taken episode id and dropped group (the table was reset); the episodes of items still
        held by open takes stay known."""
        self._taken.clear()
        self._dropped_groups.clear()

    def drop_group(self, group_id: str, to_come: int) -> None:
        """Remember a group dropped for staleness whose ``to_come`` members were not in the table yet: those late
        members are dropped too when they arrive. Only they: the group id is forgotten once all of them came, so a
        later group that reuses the id (the next problem of the same seed, a client's next group) is its own."""
        if to_come > 0:
            _remember(self._dropped_groups, group_id, self.window, to_come)

    def group_dropped(self, group_id: str) -> int:
        """How many late members of a dropped group are still to come (0 = none; within the window)."""
        return self._dropped_groups.get(group_id, 0)

    def late_dropped(self, group_id: str, count: int) -> None:
        """``count`` late members of a dropped group were dropped; the group is forgotten once none is to come."""
        left = self._dropped_groups.get(group_id, 0) - count
        if left > 0:
            self._dropped_groups[group_id] = left
        else:
            self._dropped_groups.pop(group_id, None)


def _discard(index: dict[str, set[int]], name: str, key: int) -> None:
    keys = index.get(name)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[name]


def _remember(ids: OrderedDict, name: str, window: int, value=None) -> None:
    if window <= 0:
        return
    ids[name] = value
    ids.move_to_end(name)
    while len(ids) > window:
        ids.popitem(last=False)
