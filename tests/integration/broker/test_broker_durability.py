"""kill -9 the broker process and restart it on the same data dir: acked Sends survive, acked receipts stay gone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from marti.aio import MartiCommClient as AsyncMartiCommClient
from marti.clients.broker import MartiCommClient
from marti.errors import UnavailableError

ROOT = Path(__file__).resolve().parents[3]


def start_broker(data_dir: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.comm_broker", "--port", "0", "--data-dir", str(data_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("listening on "):
            return proc, line.split()[-1]
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"broker did not start: {proc.stdout.read()}")


@contextlib.contextmanager
def running_broker(data_dir: Path) -> Iterator[tuple[subprocess.Popen, str]]:
    """A broker process on ``data_dir``: yields ``(proc, address)``; stopped with SIGTERM at the end unless the
    test killed it."""
    proc, address = start_broker(data_dir)
    try:
        yield proc, address
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(15)


def kill9(proc: subprocess.Popen) -> None:
    """SIGKILL the broker and wait for it."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_kill9_restart_delivers_every_acknowledged_send_and_nothing_acked(tmp_path):
    with (
        running_broker(tmp_path) as (proc, address),
        MartiCommClient("a", address, session="run-1", batching_size=10, update_frequency_s=0) as a,
        MartiCommClient("b", address, session="run-1", auto_ack=False) as b,
    ):
        b.get_messages()
        for i in range(100):
            a.send_message("b", {"i": i})
        a.flush()  # every Send is acknowledged: 100 messages are in the WAL
        a.broadcast_state({"phase": "before crash"})
        first = b.get_messages(max_messages=30)
        assert b.ack([m.message_id for m in first]) == 30
        b.get_messages(max_messages=5)  # delivered, never acked: must come back
        kill9(proc)
    with running_broker(tmp_path) as (_, address), MartiCommClient("b", address, session="run-1") as b:
        got = []
        while True:
            batch = b.get_messages(max_messages=100, timeout_s=0.5)
            if not batch:
                break
            got += batch
        assert [m.content["i"] for m in got] == list(range(30, 100))
        assert b.get_agent_states() == {"a": {"phase": "before crash"}}


def test_a_subscribe_loop_raises_unavailable_when_the_broker_dies(tmp_path):
    """A ``subscribe()`` loop (sync and asyncio) whose broker is killed raises ``UnavailableError`` (it does not
    hang: a new ``subscribe()`` once the broker is back goes on), and the message the loop moved past was acked
    before the crash, so the restarted broker does not deliver it again."""
    raised: dict[str, BaseException] = {}

    def sync_loop(b: MartiCommClient) -> None:
        try:
            for _ in b.subscribe():
                pass  # asks for the next message: "on it" is acked, then the loop waits
        except BaseException as exc:  # noqa: BLE001 - the test checks what came out
            raised["sync"] = exc

    async def aio_loop(address: str) -> None:
        async with AsyncMartiCommClient("c", address, session="sub-1") as c:
            try:
                async for _ in c.subscribe():
                    pass
            except BaseException as exc:  # noqa: BLE001 - the test checks what came out
                raised["aio"] = exc

    with (
        running_broker(tmp_path) as (proc, address),
        MartiCommClient("a", address, session="sub-1", update_frequency_s=0) as a,
        MartiCommClient("b", address, session="sub-1") as b,
    ):
        a.send_message("b", "on it")
        a.flush()
        threads = [
            threading.Thread(target=sync_loop, args=(b,)),
            threading.Thread(target=lambda: asyncio.run(aio_loop(address))),
        ]
        for t in threads:
            t.start()
        time.sleep(1.0)
        kill9(proc)
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads), "a subscribe loop hung after the broker died"
        assert {k: type(v) for k, v in raised.items()} == {"sync": UnavailableError, "aio": UnavailableError}
    with running_broker(tmp_path) as (_, address), MartiCommClient("b", address, session="sub-1") as b:
        assert b.get_messages(timeout_s=1) == []
