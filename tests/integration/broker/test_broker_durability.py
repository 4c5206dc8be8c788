"""kill -9 the broker process and restart it on the same data dir: acked Sends survive, acked receipts stay gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from marti.clients.broker import MartiCommClient

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


def test_kill9_restart_delivers_every_acknowledged_send_and_nothing_acked(tmp_path):
    proc, address = start_broker(tmp_path)
    try:
        with (
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
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    proc, address = start_broker(tmp_path)
    try:
        with MartiCommClient("b", address, session="run-1") as b:
            got = []
            while True:
                batch = b.get_messages(max_messages=100, timeout_s=0.5)
                if not batch:
                    break
                got += batch
            assert [m.content["i"] for m in got] == list(range(30, 100))
            assert b.get_agent_states() == {"a": {"phase": "before crash"}}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
