"""Pure core of the comm_broker service: sessions, routing, mailboxes, state board, storage (no grpc)."""

from .board import StateBoard
from .broker import Broker
from .limits import BrokerLimits, check_name
from .mailbox import Entry, Mailbox
from .mailboxes import Mailboxes
from .routing import MailboxFullError, Router
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
    "Mailboxes",
    "Router",
    "SendResult",
    "Session",
    "SqliteStore",
    "StateBoard",
    "StatsSnapshot",
    "Store",
    "check_name",
]
