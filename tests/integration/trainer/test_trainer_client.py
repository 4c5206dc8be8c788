"""``marti.TrainerClient`` and ``marti.aio.TrainerClient`` against a real (idle) trainer service on a free port.

Domain types come back (``JobInfo``), the service's errors become ``marti.errors`` classes, and the token is
read from ``MARTI_TRAINER_TOKEN`` when not given. A full job's lifecycle through raw stubs is covered by
``test_trainer_service.py``; ``deploy/submit_job.py`` drives one through this client.
"""

from __future__ import annotations

import asyncio
import math

import pytest

import marti
import marti.aio
from marti.api.trainer.v1 import trainer_pb2
from marti.clients.trainer import JobInfo, MetricsRecord
from marti.clients.trainer.protocol import _job, _record
from marti.errors import InvalidArgumentError, NotFoundError, UnauthenticatedError
from marti.rpc.settings import ServerSettings
from marti.rpc.testing import serve_in_thread

TOKEN = "trainer-client-token"


@pytest.fixture(scope="module")
def address():
    """An idle trainer service (no broker/env/store needed until a job runs), token required."""
    from services.trainer.__main__ import build_specs
    from services.trainer.job.service.settings import TrainerSettings

    with serve_in_thread(
        lambda: build_specs(TrainerSettings(port=0)), ServerSettings(port=0, token=TOKEN)
    ) as s:
        yield s.address


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("MARTI_TOKEN", "MARTI_TRAINER_TOKEN"):
        monkeypatch.delenv(var, raising=False)


def test_sync_client_lists_and_maps_errors(address, monkeypatch):
    monkeypatch.setenv("MARTI_TRAINER_TOKEN", TOKEN)
    with marti.TrainerClient(address, timeout_s=10) as client:
        assert client.list_jobs() == []
        with pytest.raises(NotFoundError, match="nope"):
            client.get_job("nope")
        with pytest.raises(NotFoundError):
            client.stop_job("nope")
        with pytest.raises(NotFoundError):
            client.save_checkpoint("nope", timeout_s=5)
        for bad in (math.nan, 0, 10**400):  # the one timeout check's rule, not a generic type message
            with pytest.raises(InvalidArgumentError, match=r"^timeout_s must be > 0 and <= 2592000 s"):
                client.save_checkpoint("nope", timeout_s=bad)
        with pytest.raises(NotFoundError):
            list(client.stream_metrics("nope"))
        with pytest.raises(InvalidArgumentError, match="bogus"):
            client.submit_job("training_name: x\nbogus: 1\n")


def test_token_is_required(address):
    with marti.TrainerClient(address, timeout_s=10) as client, pytest.raises(UnauthenticatedError):
        client.list_jobs()


def test_async_client_from_two_loops(address):
    client = marti.aio.TrainerClient(address, token=TOKEN, timeout_s=10)

    async def use() -> list[JobInfo]:
        with pytest.raises(NotFoundError):
            await client.get_job("nope")
        with pytest.raises(NotFoundError):
            async for _ in client.stream_metrics("nope"):
                pass
        return await client.list_jobs()

    assert asyncio.run(use()) == []
    assert asyncio.run(use()) == []
    asyncio.run(client.close())


def test_domain_types_from_messages():
    job = trainer_pb2.Job(
        job_id="j1", training_name="t", state=trainer_pb2.JOB_STATE_SUCCEEDED, step=3, max_steps=3
    )
    job.created_at.FromSeconds(100)
    info = _job(job)
    assert info == JobInfo("j1", "t", "SUCCEEDED", 3, 3, created_at_s=100.0) and info.done
    rec = trainer_pb2.MetricsRecord(step=2, values={"loss": 0.5}, kind="train")
    assert _record(rec) == MetricsRecord(2, {"loss": 0.5}, 0.0, "train")
