"""A session: the scope of mailboxes, topics, the state board, dedup ids and dead letters."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from .mailbox import Mailbox
from .types import AgentState, Counters, DeadLetter


@dataclass(slots=True)
class Session:
    """All state of one session (a training run or an episode). Nothing is shared across sessions.

    Attributes:
        name: Session name.
        created_at: Wall-clock creation time (s).
        last_active: Wall-clock time of the last call touching it (s); drives idle expiry.
        fixed_roster: If true, the agents are those listed at creation; any other agent id is NOT_FOUND.
        dictionary: Optional zstd dictionary (bytes) shipped to clients for this session.
        mailboxes: Agent id -> mailbox; the session's known agents.
        topics: Topic -> subscribed agent ids.
        states: Agent id -> last state.
        dedup: message_id -> first-seen wall-clock time, oldest first.
        last_seq: Sender -> highest sequence number seen.
        dead: Dead letters, oldest first (bounded by ``max_dead_letters``).
        counters: Session counters.
        active_streams: Open Subscribe streams (a session with one is never idle).
    """

    name: str
    created_at: float
    last_active: float
    fixed_roster: bool = False
    dictionary: bytes = b""
    mailboxes: dict[str, Mailbox] = field(default_factory=dict)
    topics: dict[str, set[str]] = field(default_factory=dict)
    states: dict[str, AgentState] = field(default_factory=dict)
    dedup: OrderedDict[str, float] = field(default_factory=OrderedDict)
    last_seq: dict[str, int] = field(default_factory=dict)
    dead: deque[DeadLetter] = field(default_factory=deque)
    counters: Counters = field(default_factory=Counters)
    active_streams: int = 0

    def prune_dedup(self, now: float, window_s: float, max_entries: int) -> float | None:
        """Forgets ids older than the window or beyond the count limit.

        Returns:
            The first-seen time of the newest id forgotten, or None if none was.
        """
        cut = None
        while self.dedup:
            mid, seen = next(iter(self.dedup.items()))
            if seen >= now - window_s and len(self.dedup) <= max_entries:
                break
            self.dedup.popitem(last=False)
            cut = seen
        return cut
