"""Calls that wait (a Sample on an empty queue, an Insert into a full one) must not keep the calls that would end
their wait from running. The store ran every table call on one pool of ``executor_threads`` threads, and a waiting
call holds its thread: with 2 threads and 3 samplers waiting on an empty queue, an insert of 3 items waited until
two samplers timed out (13.5 s of their 15 s), and those two raised DeadlineExceededError although the items they
waited for had arrived 1.5 s in. Waiting calls now run on threads of their own, over real gRPC here."""

from __future__ import annotations

import threading
import time

import pytest
from waits import until

import marti
from marti.rpc.testing import serve_in_thread
from services.experience_store.__main__ import make_spec
from services.experience_store.settings import StoreSettings

THREADS, WAITERS, WAIT_S = 2, 3, 30.0


@pytest.fixture
def address(tmp_path):
    settings = StoreSettings(port=0, data_dir=str(tmp_path), executor_threads=THREADS)
    with serve_in_thread(lambda: [make_spec(settings)[0]], settings) as server:
        yield server.address


def _trajectories(prefix: str, n: int) -> list[marti.Trajectory]:
    return [marti.Trajectory(episode_id=f"{prefix}{i}", agent_id="a") for i in range(n)]


def _in_threads(address: str, n: int, call) -> tuple[list[threading.Thread], dict]:
    """Starts ``n`` threads, each running ``call(client)`` with its own client; returns them and their outcomes."""
    out: dict = {}

    def run(i: int) -> None:
        with marti.ExperienceSharingClient(f"w{i}", address) as client:
            try:
                out[i] = call(client)
            except Exception as e:  # noqa: BLE001 - the outcome is checked by the test
                out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return threads, out


def test_an_insert_reaches_samplers_waiting_on_every_executor_thread(address) -> None:
    with marti.ExperienceSharingClient("a", address) as store:
        store.create_table("q", preset="queue", max_size=10)
        threads, out = _in_threads(address, WAITERS, lambda c: c.sample("q", 1, timeout_s=WAIT_S))
        # every sampler waits (the first THREADS would hold the executor's threads)
        until(lambda: store.info("q").waiting_samples == WAITERS, f"{WAITERS} samplers waiting")
        started = time.monotonic()
        store.share_experiences(_trajectories("e", WAITERS), table="q")
        assert time.monotonic() - started < WAIT_S / 2  # without own threads: about WAIT_S
        for t in threads:
            t.join()
    got = sorted(out[i][0].trajectory.episode_id for i in range(WAITERS))
    assert got == [f"e{i}" for i in range(WAITERS)]


def test_a_sample_reaches_inserts_waiting_on_a_full_queue(address) -> None:
    with marti.ExperienceSharingClient("a", address) as store:
        store.create_table("full", preset="queue", max_size=1)
        store.share_experience(_trajectories("first", 1)[0], table="full")
        threads, out = _in_threads(
            address,
            WAITERS,
            lambda c: c.share_experience(_trajectories(f"{c.agent_id}-", 1)[0], table="full"),
        )
        until(lambda: store.info("full").waiting_inserts == WAITERS, f"{WAITERS} inserts waiting for room")
        started = time.monotonic()
        taken = [store.sample("full", 1, timeout_s=10.0)[0] for _ in range(WAITERS + 1)]
        assert time.monotonic() - started < 15.0  # without own threads: the inserts' 30 s timeout
        for t in threads:
            t.join()
    assert all(isinstance(key, int) for key in out.values())
    assert len({s.trajectory.episode_id for s in taken}) == WAITERS + 1
