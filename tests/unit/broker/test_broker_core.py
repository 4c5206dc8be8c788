"""Unit tests of the broker core: limits at their edges, ordering, acks, redelivery, DLQ, TTL, dedup, states."""

from __future__ import annotations

import asyncio

import pytest

from marti.errors import (
    AbortedError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SessionLostError,
)
from services.comm_broker.core import Broker, BrokerLimits, Envelope, MailboxFullError


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def env(mid: str, sender: str = "a", to: tuple[str, ...] = ("b",), payload: bytes = b"x", **kw) -> Envelope:
    return Envelope(message_id=mid, sender=sender, payload=payload, receivers=to, **kw)


def make(**limits) -> tuple[Broker, Clock]:
    clock = Clock()
    return Broker(BrokerLimits(**limits), clock=clock), clock


def test_send_receive_ack_roundtrip_and_counters():
    b, _ = make()
    r = b.send("s", "a", [env("m1"), env("m2")])
    assert (r.accepted, r.duplicates, r.enqueued, r.sequences) == (2, 0, 2, (1, 2))
    got = b.receive("s", "b", 10)
    assert [d.envelope.message_id for d in got] == ["m1", "m2"]
    assert all(d.attempt == 1 for d in got)
    assert b.ack("s", "b", ["m1", "m2", "unknown"]) == 2
    assert b.ack("s", "b", ["m1"]) == 0  # idempotent
    snap = b.stats("s")
    assert (snap.counters.sent, snap.counters.delivered, snap.counters.acked) == (2, 2, 2)
    assert (snap.pending, snap.in_flight, snap.mailbox_bytes) == (0, 0, 0)


def test_empty_payload_and_non_ascii_ids():
    b, _ = make()
    b.send("séance", "агент", [env("m", sender="агент", to=("エージェント",), payload=b"")])
    got = b.receive("séance", "エージェント", 1)
    assert got[0].envelope.payload == b"" and got[0].envelope.sender == "агент"


def test_dedup_within_window_and_forgotten_after():
    b, clock = make(dedup_window_s=10)
    assert b.send("s", "a", [env("m1")]).accepted == 1
    r = b.send("s", "a", [env("m1"), env("m1")])
    assert (r.accepted, r.duplicates) == (0, 2)
    clock.t += 10.5
    assert b.send("s", "a", [env("m1")]).accepted == 1
    assert b.stats("s").counters.duplicates == 2


def test_dedup_entry_limit_forgets_oldest():
    b, _ = make(max_dedup_entries=2)
    for i in range(3):
        b.send("s", "a", [env(f"m{i}")])
    assert b.send("s", "a", [env("m0")]).accepted == 1  # forgotten
    assert b.send("s", "a", [env("m2")]).accepted == 0  # remembered


def test_mailbox_message_limit_edge():
    b, _ = make(max_mailbox_messages=3)
    b.send("s", "a", [env("m1"), env("m2"), env("m3")])  # exactly at the limit
    with pytest.raises(MailboxFullError, match="max_mailbox_messages=3") as info:
        b.send("s", "a", [env("m4")])
    assert info.value.agent == "b"
    assert isinstance(info.value, ResourceExhaustedError)
    b.receive("s", "b", 1)
    b.ack("s", "b", ["m1"])
    b.send("s", "a", [env("m4")])


def test_mailbox_bytes_limit_edge_and_atomic_batch():
    size = env("m1", payload=b"y" * 100).size_bytes
    b, _ = make(max_mailbox_bytes=2 * size)
    with pytest.raises(ResourceExhaustedError, match="max_mailbox_bytes"):
        b.send(
            "s",
            "a",
            [env("m1", payload=b"y" * 100), env("m2", payload=b"y" * 100), env("m3", payload=b"y" * 100)],
        )
    assert b.stats("s").pending == 0  # nothing of the refused batch was enqueued
    b.send("s", "a", [env("m1", payload=b"y" * 100), env("m2", payload=b"y" * 100)])
    assert b.stats("s").mailbox_bytes == 2 * size


def test_payload_batch_receivers_id_limits():
    b, _ = make(max_payload_bytes=4, max_batch_messages=2, max_receivers=2, max_agent_id_chars=5)
    b.send("s", "a", [env("m0", payload=b"1234")])
    with pytest.raises(ResourceExhaustedError, match="max_payload_bytes=4"):
        b.send("s", "a", [env("m1", payload=b"12345")])
    with pytest.raises(ResourceExhaustedError, match="max_batch_messages=2"):
        b.send("s", "a", [env("x1"), env("x2"), env("x3")])
    with pytest.raises(ResourceExhaustedError, match="max_receivers=2"):
        b.send("s", "a", [env("m2", to=("b", "c", "d"))])
    with pytest.raises(InvalidArgumentError, match="max_agent_id_chars=5"):
        b.send("s", "a", [env("m3", to=("bbbbbb",))])
    b.send("s", "a", [env("m4", to=("bbbbb",))])
    with pytest.raises(InvalidArgumentError, match="no receivers"):
        b.send("s", "a", [env("m5", to=())])
    with pytest.raises(InvalidArgumentError, match="differs from the caller"):
        b.send("s", "a", [env("m6", sender="z")])
    assert b.stats("s").counters.rejected == 6


def test_per_sender_order_by_sequence_even_if_retry_arrives_late():
    b, _ = make()
    b.send("s", "a", [env("a3", sequence=3)])
    b.send("s", "c", [env("c1", sender="c", sequence=1)])
    b.send("s", "a", [env("a1", sequence=1), env("a2", sequence=2)])
    got = [d.envelope.message_id for d in b.receive("s", "b", 10)]
    assert [m for m in got if m.startswith("a")] == ["a1", "a2", "a3"]
    assert got.index("c1") > 0  # arrival order across senders: sender a's first slot came first


def test_ack_timeout_redelivery_then_dead_letter():
    b, clock = make(ack_timeout_s=5, max_delivery_attempts=2)
    b.send("s", "a", [env("m1")])
    assert b.receive("s", "b", 10)[0].attempt == 1
    clock.t += 4.9
    assert b.receive("s", "b", 10) == []  # not yet due
    clock.t += 0.2
    again = b.receive("s", "b", 10)
    assert [(d.envelope.message_id, d.attempt) for d in again] == [("m1", 2)]
    clock.t += 5.1
    assert b.receive("s", "b", 10) == []
    dead = b.read_dead_letters("s", 10)
    assert [(d.envelope.message_id, d.attempts, d.reason) for d in dead] == [
        ("m1", 2, "max_delivery_attempts")
    ]
    snap = b.stats("s")
    assert (snap.counters.redelivered, snap.counters.dead_lettered, snap.dead_letters) == (1, 1, 1)
    assert b.read_dead_letters("s", 10, remove=True) and b.read_dead_letters("s", 10) == []


def test_dead_letters_are_bounded_by_bytes_with_at_least_one_each_read():
    b, clock = make(ack_timeout_s=1, max_delivery_attempts=1)
    b.send("s", "a", [env(f"m{i}", to=("b", "c"), payload=bytes(1000)) for i in range(3)])
    b.receive("s", "b", 10)
    b.receive("s", "c", 10)
    clock.t += 2
    b.tick()
    one = b.read_dead_letters("s", 10)[0].delivery_bytes
    assert one > 1000  # an upper bound of its serialized size, payload included

    def ids(**kw):
        return [(d.envelope.message_id, d.receiver) for d in b.read_dead_letters("s", 10, **kw)]

    assert len(ids(max_bytes=2 * one)) == 2 and len(ids(max_bytes=2 * one - 1)) == 1
    assert ids(max_bytes=10) == [("m0", "b")]  # one letter larger than the bound still comes, alone
    assert ids(receiver="c", max_bytes=2 * one) == [("m0", "c"), ("m1", "c")]
    assert len(ids()) == 6  # no bound given: the broker's max_frame_bytes (32 MiB)
    assert len(b.read_dead_letters("s", 10, remove=True, max_bytes=one)) == 1 and len(ids()) == 5


def test_dead_letter_limit_keeps_newest():
    b, clock = make(ack_timeout_s=1, max_delivery_attempts=1, max_dead_letters=2)
    b.send("s", "a", [env(f"m{i}") for i in range(3)])
    b.receive("s", "b", 10)
    clock.t += 2
    b.tick()
    assert [d.envelope.message_id for d in b.read_dead_letters("s", 10)] == ["m1", "m2"]


def test_ttl_expiry_counts_and_default_ttl():
    b, clock = make(default_ttl_s=10)
    b.send("s", "a", [env("short", ttl_s=1), env("default"), env("long", ttl_s=100)])
    clock.t += 1.0  # exactly at the edge: expired
    got = [d.envelope.message_id for d in b.receive("s", "b", 1)]
    assert got == ["default"]
    clock.t += 9.5
    assert [d.envelope.message_id for d in b.receive("s", "b", 10)] == ["long"]
    assert b.stats("s").counters.expired == 1


def test_max_unacked_caps_deliveries():
    b, _ = make(max_unacked_per_agent=2)
    b.send("s", "a", [env(f"m{i}") for i in range(5)])
    assert len(b.receive("s", "b", 10)) == 2
    assert b.receive("s", "b", 10) == []
    b.ack("s", "b", ["m0"])
    assert [d.envelope.message_id for d in b.receive("s", "b", 10, max_unacked=5)] == ["m2"]


def test_delivered_bytes_are_bounded_with_at_least_one_message_and_order_kept():
    b, _ = make(max_frame_bytes=5000, max_payload_bytes=10_000)
    b.send(
        "s", "a", [env(f"m{i}", payload=b"x" * 2000) for i in range(5)] + [env("big", payload=b"y" * 9000)]
    )
    one = env("m0", payload=b"x" * 2000).delivery_bytes
    ids = lambda out: [d.envelope.message_id for d in out]  # noqa: E731
    assert ids(b.receive("s", "b", 10, max_bytes=one)) == ["m0"]  # exactly at the bound: it fits
    assert ids(b.receive("s", "b", 10, max_bytes=2 * one + 1)) == ["m1", "m2"]
    assert ids(b.receive("s", "b", 10)) == ["m3", "m4"]  # the broker's max_frame_bytes by default
    assert ids(b.receive("s", "b", 10, max_bytes=1)) == ["big"]  # larger than any bound: delivered alone


def test_receive_max_messages_range():
    b, _ = make(max_batch_messages=3)
    for bad in (0, 4):
        with pytest.raises(InvalidArgumentError, match="max_messages"):
            b.receive("s", "b", bad)
    b.receive("s", "b", 3)


def test_broadcast_and_topics_skip_sender():
    b, _ = make()
    for agent in ("a", "b", "c"):
        b.join("s", agent)
    b.join("s", "c", ["news"])
    b.join("s", "a", ["news"])
    r = b.send("s", "a", [env("bc", to=())], broadcast=True)
    assert r.enqueued == 2
    b.send("s", "a", [env("t1", to=(), topic="news")])
    assert [d.envelope.message_id for d in b.receive("s", "c", 10)] == ["bc", "t1"]
    assert [d.envelope.message_id for d in b.receive("s", "b", 10)] == ["bc"]
    assert b.receive("s", "a", 10) == []


def test_topic_limit_edge():
    b, _ = make(max_topics_per_agent=2)
    b.join("s", "a", ["t1", "t2"])
    with pytest.raises(ResourceExhaustedError, match="max_topics_per_agent=2"):
        b.join("s", "a", ["t3"])


def test_sessions_are_isolated():
    b, _ = make()
    b.send("s1", "a", [env("m")])
    b.send("s2", "a", [env("m")])  # same id, other session: not a duplicate
    b.put_state("s1", "a", b"1")
    assert len(b.receive("s1", "b", 10)) == 1
    assert len(b.receive("s2", "b", 10)) == 1
    assert b.get_states("s2", "b") == []


def test_unknown_session_and_fixed_roster_not_found():
    b = Broker(BrokerLimits(), auto_create_sessions=False)
    with pytest.raises(SessionLostError, match="'nope'") as lost:  # typed: the trainer re-creates it
        b.send("nope", "a", [env("m")])
    assert lost.value.session_id == "nope"
    b.create_session("run", ["a", "b"], fixed_roster=True)
    with pytest.raises(NotFoundError, match="agent 'z'"):
        b.send("run", "a", [env("m", to=("z",))])
    with pytest.raises(NotFoundError):
        b.receive("run", "z", 1)
    with pytest.raises(NotFoundError):
        b.get_states("nope")
    with pytest.raises(NotFoundError):
        b.ack("run", "z", ["m"])
    session, created = b.create_session("run")
    assert not created and session.fixed_roster


def test_session_and_agent_limits_edge():
    b, _ = make(max_sessions=2, max_agents_per_session=2)
    b.join("s1", "a")
    b.join("s2", "a")
    with pytest.raises(ResourceExhaustedError, match="max_sessions=2"):
        b.join("s3", "a")
    b.join("s1", "b")
    with pytest.raises(ResourceExhaustedError, match="max_agents_per_session=2"):
        b.join("s1", "c")


def test_idle_sessions_expire_but_not_with_open_stream():
    b, clock = make(session_idle_s=60)
    b.send("old", "a", [env("m")])
    b.join("streaming", "a")
    b.sessions["streaming"].active_streams = 1
    clock.t += 59.9
    b.tick()
    assert "old" in b.sessions
    clock.t += 0.2
    b.tick()
    assert "old" not in b.sessions and "streaming" in b.sessions
    assert b.stats().counters.sent == 1  # expired sessions' counters stay in the totals


def test_state_board_versions_cas_exclude_self_and_limit():
    b, clock = make(max_state_bytes=4)
    s1 = b.put_state("s", "a", b"1")
    assert s1.version == 1 and s1.updated_at == clock.t
    assert b.put_state("s", "a", b"2", expected_version=1).version == 2
    with pytest.raises(AbortedError, match="version 2, not the expected 1"):
        b.put_state("s", "a", b"3", expected_version=1)
    with pytest.raises(AbortedError):
        b.put_state("s", "b", b"3", expected_version=1)
    assert b.put_state("s", "b", b"3", expected_version=0).version == 1
    b.put_state("s", "c", b"1234")
    with pytest.raises(ResourceExhaustedError, match="max_state_bytes=4"):
        b.put_state("s", "c", b"12345")
    assert [s.agent_id for s in b.get_states("s", "a")] == ["b", "c"]
    assert [s.agent_id for s in b.get_states("s", "a", exclude_self=False)] == ["a", "b", "c"]
    # a late joiner sees the current values
    assert {s.agent_id: s.value for s in b.get_states("s", "late")} == {"a": b"2", "b": b"3", "c": b"1234"}


def test_limits_reject_non_positive():
    with pytest.raises(InvalidArgumentError, match="max_mailbox_messages=0"):
        BrokerLimits(max_mailbox_messages=0)
    BrokerLimits(default_ttl_s=0)


async def test_long_poll_wakes_on_send_and_times_out():
    b = Broker(BrokerLimits())
    task = asyncio.ensure_future(b.receive_wait("s", "b", 10, timeout_s=30))
    await asyncio.sleep(0.05)
    b.send("s", "a", [env("m1")])
    got = await asyncio.wait_for(task, 10)  # woken by the send, not by its 30 s timeout
    assert [d.envelope.message_id for d in got] == ["m1"]
    t0 = asyncio.get_running_loop().time()
    assert await asyncio.wait_for(b.receive_wait("s", "b", 10, timeout_s=0.1), 30) == []
    assert 0.09 <= asyncio.get_running_loop().time() - t0 < 10  # not waiting on: that takes the 30 s


async def test_send_wait_blocks_until_space_then_times_out():
    b = Broker(BrokerLimits(max_mailbox_messages=1))
    b.send("s", "a", [env("m1")])
    waiting = asyncio.ensure_future(b.send_wait("s", "a", [env("m2")], wait_s=30))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    b.receive("s", "b", 1)
    b.ack("s", "b", ["m1"])
    assert (await asyncio.wait_for(waiting, 10)).accepted == 1  # woken by the ack, not by its 30 s wait
    with pytest.raises(MailboxFullError, match="max_mailbox_messages=1"):
        await b.send_wait("s", "a", [env("m3")], wait_s=0.05)


def test_a_released_delivery_is_pending_again_with_its_attempt_not_counted():
    """``release``: deliveries a Subscribe stream took but never sent go back in their turn, the same attempt
    next time; the ack-timeout path still counts attempts after that; unknown or acked ids are ignored."""
    b, clock = make(ack_timeout_s=5, max_delivery_attempts=2)
    b.send("s", "a", [env("m1"), env("m2")])
    assert [d.attempt for d in b.receive("s", "b", 10)] == [1, 1]
    assert b.release("s", "b", ["m1", "m2", "unknown"]) == 2
    assert b.stats("s").in_flight == 0
    again = b.receive("s", "b", 10)
    assert [(d.envelope.message_id, d.attempt) for d in again] == [("m1", 1), ("m2", 1)]
    assert b.ack("s", "b", ["m2"]) == 1 and b.release("s", "b", ["m2"]) == 0
    clock.t += 5.1
    assert [(d.envelope.message_id, d.attempt) for d in b.receive("s", "b", 10)] == [("m1", 2)]


def test_a_subscribe_stream_closed_while_sending_a_batch_puts_it_back():
    """The servicer's Subscribe generator closed at its ``yield`` (the client went while grpc wrote the batch):
    the batch is released, so the next delivery is attempt 1, not 2 (a review saw attempt 3 after a closed
    asyncio subscriber: one delivery had gone to a stream nobody read)."""
    from marti.api.broker.v1 import broker_service_pb2 as pb
    from services.comm_broker.servicer import BrokerServicer
    from services.comm_broker.settings import BrokerSettings

    b, _ = make(ack_timeout_s=30)
    b.send("s", "a", [env("m1")])
    servicer = BrokerServicer(b, BrokerSettings(port=0))

    async def main() -> None:
        stream = servicer.Subscribe(pb.SubscribeRequest(session="s", agent_id="b"), None)
        first = await stream.__anext__()
        assert first.count == 1
        await stream.aclose()

    asyncio.run(main())
    assert [(d.envelope.message_id, d.attempt) for d in b.receive("s", "b", 10)] == [("m1", 1)]
