"""A ``share_experiences`` cut off by its client's ``close`` (another thread, or another task of a ``marti.aio``
client) raises the closed-client ``FailedPreconditionError`` carrying the keys of the items the store confirmed
before, as a partly refused insert does (``metadata['inserted']`` and ``metadata['inserted_keys']``), never a bare
cancelled error; a retry with ``insert`` then stores none of them twice.

Over a real gRPC store: a queue table with room for ``ROOM`` items makes the stream wait for room after
``ROOM`` items (``ROOM / BATCH`` whole stream messages), and the client is closed under that wait.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from marti.clients.experience import AsyncExperienceSharingClient, ExperienceSharingClient, protocol
from marti.errors import FailedPreconditionError
from marti.types.trajectory import Trajectory

N, ROOM, BATCH = 300, 100, 10
#: The writer's wait for room, seconds: far longer than the test, so only the client's close can end it.
WAIT_S = 120
#: How soon the store must give the cut stream's waiting message up once the client is closed, seconds.
GONE_S = 5.0


def _trajectories() -> list[Trajectory]:
    return [Trajectory(episode_id=f"ep-{i}", agent_id="a1") for i in range(N)]


def _becomes(reader: ExperienceSharingClient, field: str, value: int, within_s: float = 10.0) -> None:
    """Wait until the table ``q``'s ``field`` (of :class:`TableInfo`) is ``value``."""
    deadline = time.monotonic() + within_s
    while getattr(reader.info("q"), field) != value:
        assert time.monotonic() < deadline, f"table q: {field} is not {value}: {reader.info('q')}"
        time.sleep(0.02)


def _full_and_waiting(reader: ExperienceSharingClient, confirmed: list[int]) -> None:
    """Wait until the writer's stream filled the table and waits for room, and the confirmations of the
    committed items reached the writer (``confirmed``: see :func:`confirmed`)."""
    _becomes(reader, "size", ROOM)
    _becomes(reader, "waiting_inserts", 1)
    deadline = time.monotonic() + 10
    while confirmed[0] < ROOM:
        assert time.monotonic() < deadline, f"the writer got {confirmed[0]} of {ROOM} confirmations"
        time.sleep(0.02)


@pytest.fixture
def confirmed(monkeypatch) -> list[int]:
    """``[n]``: the most items one insert stream of this process has had confirmed so far (a fixed sleep gave
    the confirmations time to arrive: on a loaded machine they came later)."""
    seen = [0]
    add = protocol._InsertRun.add

    def counting(run, resp) -> None:
        add(run, resp)
        seen[0] = max(seen[0], sum(k is not None for k in run.keys))

    monkeypatch.setattr(protocol._InsertRun, "add", counting)
    return seen


def _check_cut_off(err: BaseException | None, reader: ExperienceSharingClient) -> None:
    """``err`` is the closed-client error carrying the keys of exactly the items in the table, and a retry of
    the items with ``insert`` stores none of them twice."""
    assert isinstance(err, FailedPreconditionError), repr(err)
    assert str(err).startswith("the store client of agent 'a1' is closed")
    assert f"; {ROOM} of the {N} items were inserted" in str(err)
    assert err.metadata["inserted"] == str(ROOM)
    keys = [int(k) for k in err.metadata["inserted_keys"].split(",")]
    stored = {s.key: s.trajectory.episode_id for s in reader.get_items(agent_id="a1", tables=["q"])}
    assert stored == {k: f"ep-{i}" for i, k in enumerate(keys)}
    _becomes(reader, "waiting_inserts", 0, GONE_S)  # the store gave the cut stream's waiting message up
    assert [s.key for s in reader.sample("q", ROOM)] == keys  # room for the retry; the ids stay taken
    retried = reader.insert("q", _trajectories()[: ROOM + BATCH])
    assert [r.duplicate for r in retried] == [True] * ROOM + [False] * BATCH


@pytest.fixture
def reader(store_server):
    """A client of the store with the queue table ``q`` (room for ``ROOM`` items)."""
    with ExperienceSharingClient("reader", store_server[0]) as client:
        client.create_table("q", preset="queue", max_size=ROOM)
        yield client


def test_a_sync_share_experiences_closed_by_another_thread_gives_the_inserted_keys(
    store_server, reader, confirmed
):
    writer = ExperienceSharingClient("a1", store_server[0])
    raised: list[BaseException] = []

    def share() -> None:
        try:
            writer.share_experiences(_trajectories(), table="q", timeout_s=WAIT_S, batch_items=BATCH)
        except BaseException as exc:  # the test reads what the cut call raised
            raised.append(exc)

    thread = threading.Thread(target=share)
    thread.start()
    try:
        _full_and_waiting(reader, confirmed)
    finally:
        writer.close()
        thread.join(15)
    assert len(raised) == 1
    _check_cut_off(raised[0], reader)


def test_an_aio_share_experiences_closed_by_another_task_gives_the_inserted_keys(
    store_server, reader, confirmed
):
    async def main() -> BaseException | None:
        writer = AsyncExperienceSharingClient("a1", store_server[0])
        share = writer.share_experiences(_trajectories(), table="q", timeout_s=WAIT_S, batch_items=BATCH)
        task = asyncio.create_task(share)
        try:
            await asyncio.to_thread(_full_and_waiting, reader, confirmed)
        finally:
            await writer.close()
        return (await asyncio.wait({task}, timeout=15))[0].pop().exception()

    _check_cut_off(asyncio.run(main()), reader)


def test_a_share_experiences_on_a_closed_client_says_nothing_was_inserted(store_server):
    writer = ExperienceSharingClient("a1", store_server[0])
    writer.close()
    with pytest.raises(
        FailedPreconditionError, match=f"is closed; make a new one; 0 of the {N} items"
    ) as info:
        writer.share_experiences(_trajectories())
    assert (info.value.metadata["inserted"], info.value.metadata["inserted_keys"]) == ("0", "")
