"""An insert waiting for room whose caller goes away is given up at once, and its item is never stored.

Over a real gRPC store: a queue table holding ``ROOM`` items makes the next insert wait for room (its
``timeout_s`` is ``WAIT_S``, far longer than the test). The caller then goes away: its client is closed from
another thread, its task is cancelled (as ``asyncio.wait_for`` or Ctrl-C do), or its process is killed. The store's
wait must end within ``GONE_S`` (``waiting_inserts`` back to 0), and once a sampler drained the table the
abandoned item must not appear: the table gets no insert after the acknowledged ones.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from marti.clients.experience import AsyncExperienceSharingClient, ExperienceSharingClient
from marti.types.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[3]
ROOM = 2
#: The abandoned insert's own wait, seconds: only its caller going away can end it within the test.
WAIT_S = 120
#: How soon the store must see the caller gone and end the wait, seconds.
GONE_S = 5.0
LATE = Trajectory(episode_id="late", agent_id="w")


def _becomes(reader: ExperienceSharingClient, field: str, value: int, within_s: float) -> None:
    """Wait until table ``q``'s ``field`` (of :class:`TableInfo`) is ``value``, at most ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while getattr(reader.info("q"), field) != value:
        assert time.monotonic() < deadline, f"table q: {field} is not {value}: {reader.info('q')}"
        time.sleep(0.02)


def _closed_by_another_thread(addr: str, reader: ExperienceSharingClient) -> None:
    writer = ExperienceSharingClient("w", addr)
    thread = threading.Thread(target=_quietly, args=(lambda: writer.insert("q", [LATE], timeout_s=WAIT_S),))
    thread.start()
    try:
        _becomes(reader, "waiting_inserts", 1, 10)
    finally:
        writer.close()
        thread.join(GONE_S)
    assert not thread.is_alive()


def _task_cancelled(addr: str, reader: ExperienceSharingClient) -> None:
    async def main() -> None:
        async with AsyncExperienceSharingClient("w", addr) as writer:
            task = asyncio.create_task(writer.insert("q", [LATE], timeout_s=WAIT_S))
            try:
                await asyncio.to_thread(_becomes, reader, "waiting_inserts", 1, 10)
            finally:
                task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())


_WRITER = textwrap.dedent(
    """
    import sys
    from marti.clients.experience import ExperienceSharingClient
    from marti.types.trajectory import Trajectory
    writer = ExperienceSharingClient("w", sys.argv[1])
    writer.insert("q", [Trajectory(episode_id="late", agent_id="w")], timeout_s=float(sys.argv[2]))
    """
)


def _process_killed(addr: str, reader: ExperienceSharingClient) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, addr, str(WAIT_S)], env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    try:
        _becomes(reader, "waiting_inserts", 1, 60)  # the process imports the SDK first
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def _quietly(fn: Callable[[], object]) -> None:
    """Run ``fn``; what a call cut by its client's close raises is not this test's subject."""
    try:
        fn()
    except Exception:  # noqa: BLE001 - see test_insert_cut_by_close.py for what it raises
        pass


@pytest.mark.parametrize(
    "go_away",
    [_closed_by_another_thread, _task_cancelled, _process_killed],
    ids=["client_closed", "task_cancelled", "process_killed"],
)
def test_an_insert_waiting_for_room_is_given_up_when_its_caller_goes(store_server, go_away):
    addr, _ = store_server
    with ExperienceSharingClient("reader", addr) as reader:
        reader.create_table("q", preset="queue", max_size=ROOM)
        acked = [r.key for r in reader.insert("q", [Trajectory(f"ep-{i}", "a1") for i in range(ROOM)])]
        go_away(addr, reader)
        _becomes(reader, "waiting_inserts", 0, GONE_S)  # the store's wait ended, long before WAIT_S
        drained = reader.sample("q", ROOM, timeout_s=2)
        assert [s.key for s in drained] == acked  # the acknowledged items stayed, in their order
        time.sleep(0.5)  # room now: an insert still waiting would get it and commit
        info = reader.info("q")
        assert (info.size, info.inserts, info.waiting_inserts) == (0, ROOM, 0), info
        assert reader.get_items(agent_id="w", tables=["q"]) == []
