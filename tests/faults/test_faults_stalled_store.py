"""A store that stops answering mid-call (SIGSTOP: its sockets stay open, so the connection looks alive until
keepalive gives up, 40 s later): the SDK's ``Insert`` and ``Sample`` streams end with ``DeadlineExceededError``
once the waits they asked for plus ``max(timeout_s, MIN_STREAM_ALLOWANCE_S)`` have passed (2 s here), instead of holding
the caller past every timeout it gave (sync and async clients). After SIGCONT nothing was lost: the sample's items
are still there, and the insert's error says what was confirmed (none: the store stopped before reading it).
The deadline counts a partial sample's wait per item, so a slow but moving sample is not cut off."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

from marti.clients.experience import AsyncExperienceSharingClient, ExperienceSharingClient, protocol
from marti.errors import DeadlineExceededError
from marti.types.trajectory import Trajectory, Turn

from .procs import start

WAIT_S = 0.5  # the wait each call asks the store for
ALLOWANCE_S = (
    2.0  # MIN_STREAM_ALLOWANCE_S here (10 s in use), so the three stalls take seconds, not half a minute
)
#: A stalled call must end by then (the allowance, the wait, and slack for a loaded machine); keepalive's 40 s
#: is past it.
ENDS_WITHIN_S = ALLOWANCE_S + WAIT_S + 15


def _traj(i: int) -> Trajectory:
    return Trajectory(f"e{i}", "a1", turns=[Turn(step=0, prompt_token_ids=[1], response_token_ids=[2])])


@pytest.fixture
def store(monkeypatch):
    """A real store process with a queue table ``q`` holding e0 and e1; SIGCONT and kill at the end."""
    monkeypatch.setattr(protocol, "MIN_STREAM_ALLOWANCE_S", ALLOWANCE_S)
    svc = start("store")
    client = ExperienceSharingClient("a1", svc.address, timeout_s=1.0)
    client.create_table("q", preset="queue", max_size=100)
    client.share_experiences([_traj(0), _traj(1)], table="q")
    yield svc, client
    svc.signal(signal.SIGCONT)
    client.close()
    svc.stop()


def _stalled(svc, call) -> tuple[BaseException, float]:
    """Run ``call`` with the store stopped; its error and how long it took."""
    svc.signal(signal.SIGSTOP)
    start_s = time.monotonic()
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the test checks the type
        return exc, time.monotonic() - start_s
    finally:
        svc.signal(signal.SIGCONT)
    raise AssertionError("the call returned while the store was stopped")


def test_a_sample_from_a_stalled_store_ends_and_loses_nothing(store):
    svc, client = store
    err, took = _stalled(svc, lambda: client.sample_batch("q", 2, timeout_s=WAIT_S))
    assert isinstance(err, DeadlineExceededError), repr(err)
    assert took < ENDS_WITHIN_S, took
    got = client.sample_batch("q", 2, timeout_s=30)  # the store answers again: the items were not taken
    assert sorted(s.trajectory.episode_id for s in got.items) == ["e0", "e1"]


def test_an_insert_into_a_stalled_store_ends_and_says_what_was_confirmed(store):
    svc, client = store
    err, took = _stalled(svc, lambda: client.share_experiences([_traj(2)], table="q", timeout_s=WAIT_S))
    assert isinstance(err, DeadlineExceededError), repr(err)
    assert took < ENDS_WITHIN_S, took
    assert err.metadata["inserted"] == "0"


def test_the_async_client_ends_too(store):
    svc, _ = store

    async def sample() -> None:
        async with AsyncExperienceSharingClient(agent_id="a1", address=svc.address, timeout_s=1.0) as client:
            await client.info("q")  # connected before the stop
            svc.signal(signal.SIGSTOP)
            await client.sample_batch("q", 2, timeout_s=WAIT_S)

    start_s = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        try:
            asyncio.run(sample())
        finally:
            svc.signal(signal.SIGCONT)
    assert time.monotonic() - start_s < ENDS_WITHIN_S


def test_a_partial_sample_fed_slower_than_one_wait_returns_its_items(store):
    """An ``allow_partial`` sample waits up to ``timeout_s`` for *each* item (the SDK's documented wait): fed one
    item every 1.2 s with a 2 s wait, 4 items take 4.8 s, past one wait plus the allowance (4 s), and the call
    still returns them (a review found the first deadline cut it off, putting every taken item back)."""
    svc, client = store
    client.create_table("slow", preset="queue")

    def produce() -> None:
        for i in range(4):
            time.sleep(1.2)
            client.share_experiences([Trajectory(f"s{i}", "a1")], table="slow")

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        got = client.sample("slow", 5, timeout_s=2.0, allow_partial=True)
    finally:
        producer.join(30)
    assert [s.trajectory.episode_id for s in got] == [f"s{i}" for i in range(4)]


def test_the_deadline_counts_each_wait_and_a_floor_for_the_transfer():
    """Insert messages add their waits; a whole-batch sample waits once, a partial one once per item; the
    allowance is the client's timeout_s, at least MIN_STREAM_ALLOWANCE_S (10 s)."""
    from marti.api.experience.v1 import experience_service_pb2 as spb

    with ExperienceSharingClient("a1", "127.0.0.1:1", timeout_s=1.0) as client:  # never dialled
        inserts = [spb.InsertRequest(timeout_ms=500), spb.InsertRequest(timeout_ms=1500)]
        assert client._stream_deadline_s(inserts) == 2.0 + protocol.MIN_STREAM_ALLOWANCE_S
        whole = spb.SampleRequest(timeout_ms=2000, num_samples=8, whole_batch=True)
        assert client._stream_deadline_s([whole]) == 2.0 + 10.0
        partial = spb.SampleRequest(timeout_ms=2000, num_samples=8, whole_batch=False)
        assert client._stream_deadline_s([partial]) == 16.0 + 10.0
    with ExperienceSharingClient("a1", "127.0.0.1:1", timeout_s=60.0) as client:
        assert client._stream_deadline_s([whole]) == 2.0 + 60.0
