"""Routing of the broker core: validates a Send batch, resolves receivers and enqueues it atomically.

Pure Python, single-threaded like the rest of the core. A batch is checked whole (ids, sizes, receivers,
every mailbox's capacity) before anything changes, then written to the store and enqueued.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from marti.errors import BatchTooLargeError, InvalidArgumentError, NotFoundError, ResourceExhaustedError

from .limits import BrokerLimits, check_name
from .mailbox import Entry, Mailbox
from .mailboxes import Mailboxes
from .session import Session
from .store import Store, StoredMessage
from .types import Envelope, SendResult


class MailboxFullError(ResourceExhaustedError):
    """A mailbox is at ``max_mailbox_messages`` or ``max_mailbox_bytes`` (gRPC RESOURCE_EXHAUSTED).

    Args:
        message: Names the agent, its fill level and the limit.
        agent: The agent whose mailbox is full.
    """

    def __init__(self, message: str, agent: str) -> None:
        super().__init__(message)
        self.agent = agent


class Router:
    """Routes Send and Broadcast batches into the receivers' mailboxes.

    Args:
        limits: Limits and timings.
        store: Write-ahead store; a batch's rows, dedup ids and sequence numbers go in one transaction.
        clock: Wall-clock seconds since the epoch.
        mailboxes: The mailbox component (creates receivers' mailboxes on first use).
    """

    def __init__(
        self, limits: BrokerLimits, store: Store, clock: Callable[[], float], mailboxes: Mailboxes
    ) -> None:
        self.limits = limits
        self.store = store
        self.clock = clock
        self.mailboxes = mailboxes

    def send(
        self,
        session: Session,
        sender: str,
        envelopes: Sequence[Envelope],
        broadcast: bool = False,
        started: float | None = None,
    ) -> SendResult:
        """Accepts a batch atomically: every envelope is enqueued for all its receivers, or none is.

        Args:
            session: The session.
            sender: The calling agent (joins the session if new; its id is checked by the caller).
            envelopes: The batch; each ``envelope.sender`` must equal ``sender``.
            broadcast: Treat every envelope as a broadcast (the Broadcast rpc).
            started: ``time.perf_counter()`` when the call began (for the mean Send handling time);
                now if None.

        Returns:
            The :class:`SendResult` (``enqueued`` counts mailbox entries: 0 for a topic nobody subscribes to).

        Raises:
            InvalidArgumentError: Bad ids, no receivers, more than one addressing mode (receivers, topic,
                broadcast flag) in a Send, sender mismatch, negative ttl or sequence.
            NotFoundError: A receiver outside a fixed roster.
            ResourceExhaustedError: Batch, payload, receivers or a mailbox limit (named in the message).
        """
        t0 = time.perf_counter() if started is None else started
        try:
            result = self._send(session, sender, envelopes, broadcast)
        except (InvalidArgumentError, NotFoundError, ResourceExhaustedError):
            session.counters.rejected += 1
            raise
        session.counters.send_latency_s_sum += time.perf_counter() - t0
        session.counters.send_count += 1
        return result

    def _targets(self, session: Session, env: Envelope) -> list[str]:
        if env.broadcast:
            return [a for a in session.mailboxes if a != env.sender]
        if env.topic:
            check_name(self.limits, "topic", env.topic)
            return sorted(a for a in session.topics.get(env.topic, ()) if a != env.sender)
        if not env.receivers:
            raise InvalidArgumentError(
                f"message {env.message_id!r} has no receivers, topic or broadcast flag"
            )
        if len(env.receivers) > self.limits.max_receivers:
            raise ResourceExhaustedError(
                f"message {env.message_id!r} lists {len(env.receivers)} receivers, over max_receivers="
                f"{self.limits.max_receivers}"
            )
        return list(dict.fromkeys(env.receivers))

    def _validate(self, sender: str, envelopes: Sequence[Envelope], broadcast: bool) -> None:
        lim = self.limits
        if len(envelopes) > lim.max_batch_messages:
            raise BatchTooLargeError(  # its ErrorInfo names the limit: a client splits the batch by it
                f"batch of {len(envelopes)} messages is over max_batch_messages={lim.max_batch_messages}",
                max_batch_messages=lim.max_batch_messages,
            )
        for env in envelopes:
            check_name(lim, "message_id", env.message_id)
            if env.sender != sender:
                raise InvalidArgumentError(
                    f"envelope sender {env.sender!r} differs from the caller {sender!r}"
                )
            if not broadcast and bool(env.receivers) + bool(env.topic) + env.broadcast > 1:
                modes = [f"receivers {list(env.receivers)!r}"] if env.receivers else []
                modes += [f"topic {env.topic!r}"] if env.topic else []
                modes += ["the broadcast flag"] if env.broadcast else []
                raise InvalidArgumentError(
                    f"message {env.message_id!r} is addressed {len(modes)} ways ({', '.join(modes)}); give it "
                    "receivers, a topic or the broadcast flag, one of them (the broker would use one and drop "
                    "the others)"
                )
            if len(env.payload) > lim.max_payload_bytes:
                raise ResourceExhaustedError(
                    f"message {env.message_id!r} payload of {len(env.payload)} bytes is over "
                    f"max_payload_bytes={lim.max_payload_bytes}"
                )
            if env.ttl_s < 0 or env.sequence < 0:
                raise InvalidArgumentError(
                    f"message {env.message_id!r}: ttl_s={env.ttl_s} and sequence={env.sequence} must be >= 0"
                )

    def _send(
        self, session: Session, sender: str, envelopes: Sequence[Envelope], broadcast: bool
    ) -> SendResult:
        lim = self.limits
        self._validate(sender, envelopes, broadcast)
        self.mailboxes.get(session, sender, create=True)
        now = self.clock()
        session.prune_dedup(now, lim.dedup_window_s, lim.max_dedup_entries)
        plan: list[tuple[Envelope, list[str]]] = []
        seen: set[str] = set()
        sequences: list[int] = []
        dedup = session.dedup
        last = start = session.last_seq.get(sender, 0)
        mailboxes = session.mailboxes
        for env in envelopes:
            mid = env.message_id
            if mid in dedup or mid in seen:
                sequences.append(0)
                continue
            seen.add(mid)
            seq = env.sequence or last + 1
            if seq > last:
                last = seq
            env = _replace(env, seq, now, broadcast)
            targets = self._targets(session, env)
            for t in targets:
                if t not in mailboxes:
                    self.mailboxes.get(session, t, create=True)
            plan.append((env, targets))
            sequences.append(seq)
        per_box = self._check_capacity(session, plan)
        rows: list[StoredMessage] = []
        durable = self.store.durable
        default_ttl = lim.default_ttl_s
        enqueued = 0
        for box, items in per_box:
            in_flight = box._in_flight
            entries = []
            for env in items:
                if env.message_id in in_flight:
                    continue
                ttl = env.ttl_s or default_ttl
                entry = Entry(env, box.next_position(), 0, now + ttl if ttl > 0 else 0.0)
                if durable:
                    rows.append(StoredMessage(box.agent_id, entry.position, 0, entry.expires_at, env))
                entries.append(entry)
            items[:] = entries
            enqueued += len(entries)
        changed_seq = {sender: last} if last != start else {}
        if durable:
            self.store.record_send(
                session.name, rows, [(env.message_id, now) for env, _ in plan], changed_seq
            )
        for box, entries in per_box:
            box.add_many(entries)
        for env, _ in plan:
            dedup[env.message_id] = now
        session.last_seq.update(changed_seq)
        c = session.counters
        c.sent += len(plan)
        c.enqueued += enqueued
        c.duplicates += len(envelopes) - len(plan)
        return SendResult(len(plan), len(envelopes) - len(plan), enqueued, tuple(sequences))

    def _check_capacity(
        self, session: Session, plan: list[tuple[Envelope, list[str]]]
    ) -> list[tuple[Mailbox, list]]:
        """Checks every receiver's mailbox limits for the whole batch (atomic: before any change).

        Returns:
            ``(mailbox, envelopes for it)`` pairs in first-target order.

        Raises:
            MailboxFullError: A mailbox would exceed ``max_mailbox_messages`` or ``max_mailbox_bytes``.
        """
        lim = self.limits
        groups: dict[str, list[Envelope]] = {}
        for env, targets in plan:
            for t in targets:
                group = groups.get(t)
                if group is None:
                    groups[t] = [env]
                else:
                    group.append(env)
        out = []
        for t, items in groups.items():
            box = session.mailboxes[t]
            n = len(items)
            if box.count + n > lim.max_mailbox_messages:
                raise MailboxFullError(
                    f"mailbox of agent {t!r} holds {box.count} messages; {n} more would exceed "
                    f"max_mailbox_messages={lim.max_mailbox_messages}",
                    t,
                )
            nbytes = sum(env.size_bytes for env in items)
            if box.bytes + nbytes > lim.max_mailbox_bytes:
                raise MailboxFullError(
                    f"mailbox of agent {t!r} holds {box.bytes} bytes; {nbytes} more would exceed "
                    f"max_mailbox_bytes={lim.max_mailbox_bytes}",
                    t,
                )
            out.append((box, items))
        return out


def _replace(env: Envelope, seq: int, now: float, broadcast: bool) -> Envelope:
    if env.sequence == seq and env.sent_at and not (broadcast and not env.broadcast):
        return env
    return Envelope(
        message_id=env.message_id,
        sender=env.sender,
        payload=env.payload,
        content_type=env.content_type,
        receivers=() if broadcast else env.receivers,
        topic="" if broadcast else env.topic,
        broadcast=env.broadcast or broadcast,
        sequence=seq,
        sent_at=env.sent_at or now,
        ttl_s=env.ttl_s,
    )  # ``wire`` is left empty: it no longer matches the fields
