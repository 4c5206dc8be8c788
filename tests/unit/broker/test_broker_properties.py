"""Property tests (hypothesis): per-sender ordering and exactly-once effect under retries and redelivery."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.comm_broker.core import Broker, BrokerLimits, Envelope

SENDERS = ("a", "b", "c")

# One step of a random schedule: send the next message of a sender (maybe twice: a retry), retry an
# earlier message, receive some messages and ack a random subset (lost acks), or let time pass (ack timeout).
step = st.one_of(
    st.tuples(st.just("send"), st.sampled_from(SENDERS), st.booleans()),
    st.tuples(st.just("retry"), st.sampled_from(SENDERS), st.integers(0, 50)),
    st.tuples(st.just("recv"), st.integers(1, 6), st.lists(st.booleans(), max_size=6)),
    st.tuples(st.just("tick"), st.floats(0.0, 3.0), st.just(None)),
)


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


@settings(max_examples=150, deadline=None)
@given(st.lists(step, max_size=80), st.integers(1, 4))
def test_per_sender_order_and_exactly_once_effect(schedule, batch):
    clock = Clock()
    broker = Broker(BrokerLimits(ack_timeout_s=2.0, max_delivery_attempts=10_000), clock=clock)
    sent: dict[str, list[Envelope]] = {s: [] for s in SENDERS}
    processed: list[str] = []
    processed_set: set[str] = set()
    last_first_seq: dict[str, int] = {}

    def deliver(deliveries, ack_mask):
        to_ack = []
        for i, d in enumerate(deliveries):
            mid = d.envelope.message_id
            if mid not in processed_set:  # the client-side dedup of the SDK
                # per-sender FIFO: first deliveries of one sender come in increasing sequence order
                assert d.envelope.sequence > last_first_seq.get(d.envelope.sender, 0)
                last_first_seq[d.envelope.sender] = d.envelope.sequence
                processed.append(mid)
                processed_set.add(mid)
            if i >= len(ack_mask) or ack_mask[i]:
                to_ack.append(mid)
        broker.ack("s", "r", to_ack)

    for kind, x, y in schedule:
        if kind == "send":
            n = len(sent[x]) + 1
            e = Envelope(message_id=f"{x}-{n}", sender=x, receivers=("r",), sequence=n)
            sent[x].append(e)
            broker.send("s", x, [e])
            if y:
                broker.send("s", x, [e])  # a retried Send after a lost response
        elif kind == "retry" and sent[x]:
            broker.send("s", x, [sent[x][y % len(sent[x])]])
        elif kind == "recv":
            deliver(broker.receive("s", "r", x), y)
        elif kind == "tick":
            clock.t += x
    # drain: everything accepted is eventually processed exactly once
    for _ in range(10_000):
        clock.t += 3.0
        got = broker.receive("s", "r", batch)
        if not got and broker.stats("s").in_flight == 0 and broker.stats("s").pending == 0:
            break
        deliver(got, [])
    expected = {e.message_id for msgs in sent.values() for e in msgs}
    assert sorted(processed) == sorted(expected)
    assert len(processed) == len(processed_set)
    stats = broker.stats("s").counters
    assert stats.sent == len(expected)
    assert stats.acked == len(expected)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(SENDERS), st.integers(1, 30)), max_size=60))
def test_out_of_order_arrivals_leave_in_sequence_order(arrivals):
    broker = Broker(BrokerLimits())
    seen = set()
    for sender, seq in arrivals:
        mid = f"{sender}-{seq}"
        if mid in seen:
            continue
        seen.add(mid)
        broker.send("s", sender, [Envelope(message_id=mid, sender=sender, receivers=("r",), sequence=seq)])
    out = broker.receive("s", "r", 4096) if seen else []
    for sender in SENDERS:
        seqs = [d.envelope.sequence for d in out if d.envelope.sender == sender]
        assert seqs == sorted(seqs)
    assert len(out) == len(seen)
