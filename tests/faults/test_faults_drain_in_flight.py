"""A stop lets in-flight calls finish within ``grace_s``: a sample waiting for items that an insert stream already
in flight brings during the grace gets them (a review found that ending every waiting call at SIGTERM, tried
once, took that result from the caller; the waits keep their grace)."""

from __future__ import annotations

import signal
import threading
import time

import grpc
from waits import until

from marti.api.experience.v1 import experience_service_pb2_grpc as sgrpc
from marti.clients.experience import ExperienceSharingClient
from marti.types.trajectory import Trajectory

from .procs import start


def test_a_waiting_sample_gets_the_item_an_in_flight_insert_stream_brings_during_the_grace(tmp_path):
    svc = start("store", "--data-dir", str(tmp_path / "store"), settings={"grace_s": "20"})
    try:
        client = ExperienceSharingClient("a1", svc.address, timeout_s=10)
        client.create_table("q", preset="queue", max_size=4)
        client.create_table("other", preset="queue", max_size=4)
        first = client._insert_reqs([Trajectory("o1", "a1")], "other", None, 10.0, 64, idempotent=True)
        second = client._insert_reqs([Trajectory("q1", "a1")], "q", None, 10.0, 64, idempotent=True)
        go = threading.Event()

        def requests():
            yield from first
            go.wait(30)
            yield from second

        channel = grpc.insecure_channel(svc.address)
        stream = sgrpc.ExperienceServiceStub(channel).Insert(requests(), timeout=60)
        next(stream)  # the stream is in flight: its first message is confirmed
        got: dict[str, object] = {}

        def sample() -> None:
            try:
                got["items"] = [s.trajectory.episode_id for s in client.sample("q", 1, timeout_s=30)]
            except Exception as exc:  # noqa: BLE001 - recorded for the assertion
                got["error"] = exc

        sampler = threading.Thread(target=sample)
        sampler.start()
        until(lambda: client.info("q").waiting_samples >= 1, "the sample waiting in the store", every_s=0.02)
        svc.signal(signal.SIGTERM)
        time.sleep(1.0)  # the stop has begun (NOT_SERVING, on_drain hooks)
        go.set()  # the in-flight stream's next message brings the item the sample waits for
        sampler.join(30)
        assert got == {"items": ["q1"]}, got
        list(stream)
        channel.close()
        assert svc.proc.wait(timeout=30) == 0
    finally:
        svc.stop()
