"""The broker SDK with its default settings (batches of 128, a 1 ms linger, ``send_when_idle``) over a real
broker on port 0.

* A lone message reaches another agent without ``flush`` (at once: no batch is in flight), within a generous
  bound.
* 3,000 messages of about 1 KB sent with ``send_message`` alone all arrive, once each, in send order.
* A client never closed still sends what it buffered when its process exits: a plain program (``atexit``) and a
  ``multiprocessing`` fork child (which ends with ``os._exit``); when it cannot, the failure is logged. (Those
  clients set ``send_when_idle=False`` and a 60 s linger, so only the exit flush can send their message.)
* With the default settings, a program that sends and exits at once: the flush timer has the batch in flight
  when ``atexit`` runs; the exit flush waits for it, so the message arrives, and a refusal of it is logged.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from marti.clients.broker import MartiCommClient
from marti.rpc.testing import serve_in_thread
from services.comm_broker.servicer import broker_service
from services.comm_broker.settings import BrokerSettings


def serve():
    settings = BrokerSettings(port=0, tick_interval_s=0.05)
    return serve_in_thread(lambda: [broker_service(settings)], settings)


@pytest.fixture(scope="module")
def address():
    with serve() as server:
        yield server.address


def message(i: int) -> dict:
    """About 1 KB of JSON, as an agent's turn."""
    text = f"Turn {i}: I think we should move two units from logistics to research because it pays more. " * 9
    return {"sender": "s", "step": i, "role": "planner", "text": text}


def test_lone_message_arrives_at_once_without_flush(address):
    with (
        MartiCommClient("s", address, session="lone") as a,
        MartiCommClient("r", address, session="lone") as b,
    ):
        b.get_messages()  # join
        for i in range(5):
            t0 = time.perf_counter()
            a.send_message("r", {"i": i})  # no flush: the flush timer sends it at once
            got = b.get_messages(timeout_s=10)
            took = time.perf_counter() - t0
            assert [m.content for m in got] == [{"i": i}]
            assert took < 3.0, took  # one Send rpc; generous for a shared machine at a load of 10


def test_three_thousand_messages_arrive_once_in_order(address):
    n = 3000
    with (
        MartiCommClient("s", address, session="many") as a,
        MartiCommClient("r", address, session="many") as b,
    ):
        b.get_messages()
        ids = [a.send_message("r", message(i)) for i in range(n)]  # the tail is sent by the flush timer
        got = []
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            got += b.get_messages(max_messages=1000, timeout_s=1)
        assert [m.content["step"] for m in got] == list(range(n))
        assert [m.message_id for m in got] == ids
        assert b.get_messages(timeout_s=0.2) == []  # nothing twice
        stats = a.get_communication_stats()
        assert stats.total_sent == n and stats.refused_messages == 0
        assert stats.compression_ratio > 2.5  # batches compress; single messages do not (about 1.7)


EXIT_PROGRAM = textwrap.dedent(
    """
    import multiprocessing, sys
    import marti

    ADDRESS, SESSION, CHILD = sys.argv[1], sys.argv[2], sys.argv[3]
    if CHILD == "early":  # the SDK's client module is imported before the fork (else first in the child)
        import marti.clients.broker

    def child():
        c = marti.MartiCommClient(
            "child", ADDRESS, session=SESSION, update_frequency_s=60, send_when_idle=False
        )
        c.send_message("r", "from a multiprocessing child")  # never flushed nor closed

    if __name__ == "__main__":
        if CHILD != "none":
            p = multiprocessing.get_context("fork").Process(target=child)
            p.start()
            p.join(60)
            assert p.exitcode == 0, p.exitcode
        c = marti.MartiCommClient(
            "main", ADDRESS, session=SESSION, update_frequency_s=60, send_when_idle=False
        )
        c.send_message("r", "from the main process")  # never flushed nor closed: a 60 s linger
        print("sent", flush=True)
        sys.stdin.readline()  # the test says when to exit
    """
)


def _start(tmp_path, *args: str) -> subprocess.Popen:
    script = tmp_path / "exit_program.py"
    script.write_text(EXIT_PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_") and not k.startswith("MARTI_")}
    proc = subprocess.Popen(
        [sys.executable, str(script), *args], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "sent", proc.stderr.read()
    return proc


@pytest.mark.parametrize("child", ["early", "lazy"])
def test_unclosed_clients_send_their_buffer_at_process_exit(address, tmp_path, child):
    session = f"at-exit-{child}"
    with MartiCommClient("r", address, session=session) as r:
        r.get_messages()
        proc = _start(tmp_path, address, session, child)
        out, err = proc.communicate("\n", timeout=60)
        assert proc.returncode == 0, err
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got += [m.content for m in r.get_messages(timeout_s=0.5)]
        assert sorted(got) == ["from a multiprocessing child", "from the main process"]


def test_exit_flush_that_fails_is_logged(tmp_path):
    with serve() as server:
        proc = _start(tmp_path, server.address, "at-exit-down", "none")
    # the broker is gone: the exit flush cannot send the message and says so
    out, err = proc.communicate("\n", timeout=60)
    assert proc.returncode == 0, err
    assert "could not send 1 buffered message(s)" in err and "'main'" in err, err


SEND_AND_EXIT = textwrap.dedent(
    """
    import sys
    import marti

    c = marti.MartiCommClient("main", sys.argv[1], session=sys.argv[2])  # the defaults: send_when_idle
    print(c.send_message("r", "x" * int(sys.argv[3])), flush=True)  # then exit at once, never closed
    """
)


def _send_and_exit(tmp_path, address: str, session: str, size: int) -> subprocess.CompletedProcess:
    script = tmp_path / "send_and_exit.py"
    script.write_text(SEND_AND_EXIT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_") and not k.startswith("MARTI_")}
    done = subprocess.run(
        [sys.executable, str(script), address, session, str(size)], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


def test_a_program_that_sends_and_exits_at_once_delivers_with_the_defaults(address, tmp_path):
    for i in range(3):
        session = f"send-and-exit-{i}"
        with MartiCommClient("r", address, session=session) as r:
            r.get_messages()
            _send_and_exit(tmp_path, address, session, 100)
            assert [m.content for m in r.get_messages(timeout_s=5)] == ["x" * 100]


def test_a_refusal_of_the_batch_in_flight_at_exit_is_logged(tmp_path):
    settings = BrokerSettings(port=0, tick_interval_s=0.05, max_payload_bytes=1024)
    with serve_in_thread(lambda: [broker_service(settings)], settings) as server:
        with MartiCommClient("r", server.address, session="refused-at-exit") as r:
            r.get_messages()
            done = _send_and_exit(tmp_path, server.address, "refused-at-exit", 2000)
    message_id = done.stdout.strip()
    assert "at exit" in done.stderr and message_id in done.stderr, done.stderr
