"""Pure core of the comm_broker service: sessions, mailboxes, state board, storage (no grpc)."""

from .broker import Broker, MailboxFullError
from .limits import BrokerLimits
from .mailbox import Entry, Mailbox
from .session import Session
from .store import SqliteStore, Store
from .types import AgentState, Counters, DeadLetter, Delivery, Envelope, SendResult, StatsSnapshot

__all__ = [
    "AgentState",
    "Broker",
    "BrokerLimits",
    "Counters",
    "DeadLetter",
    "Delivery",
    "Entry",
    "Envelope",
    "Mailbox",
    "MailboxFullError",
    "SendResult",
    "Session",
    "SqliteStore",
    "StatsSnapshot",
    "Store",
]
