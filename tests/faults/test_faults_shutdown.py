"""Graceful shutdown of every service, as a real process: SIGTERM flips health to NOT_SERVING, lets
in-flight calls finish within ``grace_s``, flushes (the broker's log, the store's database) and exits 0;
a second SIGTERM exits at once."""

from __future__ import annotations

import signal
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2

from marti.api.broker.v1 import broker_service_pb2 as bpb
from marti.api.broker.v1 import broker_service_pb2_grpc as bgrpc
from marti.clients.broker import MartiCommClient
from marti.clients.experience import ExperienceSharingClient
from marti.types.trajectory import Trajectory, Turn

from .procs import health_watch, start

SERVICES = ["broker", "env-server", "store", "trainer"]
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("name", SERVICES)
def test_sigterm_not_serving_then_exit_0_and_second_sigterm_exits_at_once(name, tmp_path):
    svc = start(name, settings={"grace_s": "30"})
    try:
        channel, seen, reader = health_watch(svc.address)
        assert seen == [SERVING]
        # hold an in-flight server stream so the 30 s drain would really wait
        held = grpc.insecure_channel(svc.address)
        from grpc_health.v1 import health_pb2_grpc

        long_call = health_pb2_grpc.HealthStub(held).Watch(
            health_pb2.HealthCheckRequest(service="x"), timeout=60
        )
        next(iter(long_call))
        svc.signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while NOT_SERVING not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
        assert NOT_SERVING in seen, seen
        assert svc.proc.poll() is None, "draining: still up within the grace period"
        start_t = time.monotonic()
        svc.signal(signal.SIGTERM)
        code = svc.proc.wait(timeout=10)
        assert time.monotonic() - start_t < 5 and code != 0, code  # second signal: exit at once, non-zero
        long_call.cancel()
        held.close()
        channel.close()
    finally:
        svc.stop()


def _traj(i: int) -> Trajectory:
    turn = Turn(
        step=0, prompt_token_ids=[1, 2, 3], response_token_ids=[i % 50], response_logprobs=[-0.5], reward=1.0
    )
    return Trajectory(episode_id=f"ep{i}", agent_id="a1", turns=[turn])


def test_broker_drains_in_flight_long_poll_and_flushes_its_log(tmp_path):
    data = str(tmp_path / "broker")
    svc = start("broker", "--data-dir", data, settings={"grace_s": "10"})
    try:
        sender = MartiCommClient("a", svc.address, session="s1", timeout_s=5)
        for i in range(20):
            sender.send_message("b", {"i": i})
        sender.flush()
        sender.close()
        # an in-flight long poll of an agent with an empty mailbox: it must end normally during the drain
        stub = bgrpc.BrokerServiceStub(grpc.insecure_channel(svc.address))
        result = {}

        def poll() -> None:
            try:
                result["resp"] = stub.Receive(
                    bpb.ReceiveRequest(session="s1", agent_id="c", timeout_ms=1500), timeout=20
                )
            except grpc.RpcError as err:
                result["err"] = err.code()

        t = threading.Thread(target=poll)
        t.start()
        time.sleep(0.4)
        svc.signal(signal.SIGTERM)
        t.join(20)
        assert "err" not in result, result
        assert svc.proc.wait(timeout=15) == 0
        assert any("stopped" in line for line in svc.output)
    finally:
        svc.stop()
    again = start("broker", "--data-dir", data)
    try:
        b = MartiCommClient("b", again.address, session="s1", timeout_s=5)
        got = []
        for _ in range(10):
            got += [m.content["i"] for m in b.get_messages(timeout_s=1)]
            if len(got) >= 20:
                break
        assert sorted(got) == list(range(20))
        b.close()
    finally:
        again.stop()


def test_store_drains_a_waiting_sample_and_keeps_confirmed_items(tmp_path):
    data = str(tmp_path / "store")
    svc = start("store", "--data-dir", data, settings={"grace_s": "10"})
    try:
        client = ExperienceSharingClient("a1", svc.address, timeout_s=10)
        keys = client.share_experiences([_traj(i) for i in range(30)])
        assert len(set(keys)) == 30
        result = {}

        def wait_sample() -> None:  # asks for more than exists: waits for its timeout, then ends
            try:
                result["items"] = client.sample("default", 64, timeout_s=1.5, allow_partial=True)
            except Exception as exc:  # noqa: BLE001 - recorded for the assertion
                result["err"] = exc

        t = threading.Thread(target=wait_sample)
        t.start()
        time.sleep(0.4)
        svc.signal(signal.SIGTERM)
        t.join(20)
        assert "err" not in result or type(result["err"]).__name__ == "DeadlineExceededError", result
        assert svc.proc.wait(timeout=15) == 0
        client.close()
    finally:
        svc.stop()
    again = start("store", "--data-dir", data)
    try:
        client = ExperienceSharingClient("a1", again.address, timeout_s=10)
        episodes = {t.episode_id for t in client.get_trajectories(agent_id="a1")}
        assert episodes == {f"ep{i}" for i in range(30)}
        client.close()
    finally:
        again.stop()
