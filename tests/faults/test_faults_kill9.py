"""``kill -9`` mid-traffic, restart on the same data dir, count ids end to end: nothing acknowledged is lost.

Broker: a sender sends numbered messages one per Send; every Send that returned OK is "acknowledged".
The broker is killed while the sender runs, restarted, and the receiver must get every acknowledged id.
Store: the same with confirmed inserts. Env server: sessions live in memory; after a restart an old id is
NOT_FOUND and the client recreates the session (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import threading
import time

import grpc
import pytest
from waits import until

from marti.api.env.v1 import env_pb2 as epb
from marti.api.env.v1 import env_service_pb2_grpc as egrpc
from marti.clients.broker import MartiCommClient
from marti.clients.experience import ExperienceSharingClient
from marti.errors import MartiError
from marti.types.trajectory import Trajectory, Turn

from .procs import start


def _writer(write, stop: threading.Event, acked: list[int]) -> threading.Thread:
    def run() -> None:
        i = 0
        while not stop.is_set():
            try:
                write(i)
                acked.append(i)
            except MartiError:
                return  # the service died: ids from here on were never acknowledged
            i += 1

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_broker_kill9_loses_no_acknowledged_message(tmp_path):
    data = str(tmp_path / "broker")
    svc = start("broker", "--data-dir", data)
    acked: list[int] = []
    try:
        sender = MartiCommClient("a", svc.address, session="k", timeout_s=5)

        def send(i: int) -> None:
            sender.send_message("b", {"i": i})
            sender.flush()

        stop = threading.Event()
        t = _writer(send, stop, acked)
        until(lambda: len(acked) > 20 or not t.is_alive(), "20 sends acknowledged", timeout_s=60)
        time.sleep(0.2)  # and more in flight at the kill
        svc.kill9()
        stop.set()
        t.join(10)
        # A message in flight at the kill stays buffered (never acknowledged): close reports it, as it must.
        with contextlib.suppress(MartiError):
            sender.close()
    finally:
        svc.stop()
    assert len(acked) > 20, "the writer must have made progress before the kill"
    again = start("broker", "--data-dir", data)
    try:
        b = MartiCommClient("b", again.address, session="k", timeout_s=5)
        got: set[int] = set()
        idle = 0
        while idle < 2:
            batch = b.get_messages(timeout_s=2.0)  # 2 empty reads in a row: all delivered
            idle = idle + 1 if not batch else 0
            got |= {m.content["i"] for m in batch}
        assert set(acked) <= got, sorted(set(acked) - got)[:10]
        print(f"broker kill -9: {len(acked)} acknowledged, {len(got)} delivered after restart, 0 lost")
        b.close()
    finally:
        again.stop()


def _traj(i: int) -> Trajectory:
    turn = Turn(
        step=0, prompt_token_ids=[1, 2], response_token_ids=[3], response_logprobs=[-0.1], reward=float(i)
    )
    return Trajectory(episode_id=f"ep{i}", agent_id="a1", turns=[turn])


def test_store_kill9_loses_no_confirmed_experience(tmp_path):
    data = str(tmp_path / "store")
    svc = start("store", "--data-dir", data)
    acked: list[int] = []
    try:
        client = ExperienceSharingClient("a1", svc.address, timeout_s=5)
        stop = threading.Event()
        t = _writer(lambda i: client.share_experience(_traj(i)), stop, acked)
        until(lambda: len(acked) > 10 or not t.is_alive(), "10 inserts confirmed", timeout_s=60)
        time.sleep(0.2)  # and more in flight at the kill
        svc.kill9()
        stop.set()
        t.join(10)
    finally:
        svc.stop()
    assert len(acked) > 10
    again = start("store", "--data-dir", data)
    try:
        client = ExperienceSharingClient("a1", again.address, timeout_s=10)
        got = {int(tr.episode_id[2:]) for tr in client.get_trajectories(agent_id="a1")}
        assert set(acked) <= got, sorted(set(acked) - got)[:10]
        print(f"store kill -9: {len(acked)} confirmed, {len(got)} stored after restart, 0 lost")
    finally:
        again.stop()


def test_env_server_kill9_sessions_are_recreated(tmp_path):
    svc = start("env-server")
    try:
        stub = egrpc.EnvServiceStub(grpc.insecure_channel(svc.address))
        env_id = stub.ListEnvs(epb.ListEnvsRequest()).envs[0].env_id
        old = stub.CreateSession(epb.CreateSessionRequest(env_id=env_id, seed=3)).session_id
        first = stub.Reset(epb.ResetRequest(session_id=old, seed=3))
        svc.kill9()
    finally:
        svc.stop()
    again = start("env-server")
    try:
        stub = egrpc.EnvServiceStub(grpc.insecure_channel(again.address))
        with pytest.raises(grpc.RpcError) as info:
            stub.Reset(epb.ResetRequest(session_id=old, seed=3), timeout=5)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        new = stub.CreateSession(epb.CreateSessionRequest(env_id=env_id, seed=3)).session_id
        # same seed, same first observation: a recreated session replays the episode start deterministically
        second = stub.Reset(epb.ResetRequest(session_id=new, seed=3))
        for resp in (first, second):
            if "session_id" in resp.DESCRIPTOR.fields_by_name:
                resp.ClearField("session_id")
        assert second == first
    finally:
        again.stop()
