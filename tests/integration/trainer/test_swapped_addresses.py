"""A job given a service address where another service listens (a swapped ``--env`` / ``--store`` port) is
refused before the run folder: ``marti train --overwrite`` keeps the earlier run (a real broker on port 0 stands in
for the wrong server; the job runs in a subprocess, as a user runs it)."""

from __future__ import annotations

import socket

import pytest

from marti.errors import InvalidArgumentError
from marti.rpc.testing import serve_in_thread
from services.comm_broker.servicer import broker_service
from services.comm_broker.settings import BrokerSettings
from services.trainer.job.connections.addresses import resolve_addresses
from services.trainer.job.connections.served import check_given_services
from tests.refused_runs import train_over_an_old_run

JOB = {
    "training_name": "t", "num_agents": 2,
    "agents": [{"name": "a", "pretrain_model": "tiny-llama", "role": "planner"},
               {"name": "b", "pretrain_model": "tiny-llama", "role": "executor"}],
    "environment": {"env_name": "collaborative_task_solving", "scenario": "private_allocation"},
}  # fmt: skip


@pytest.fixture(scope="module")
def broker() -> str:
    settings = BrokerSettings(port=0)
    with serve_in_thread(lambda: [broker_service(settings)], settings) as server:
        yield server.address


def test_an_env_address_where_a_broker_listens_is_refused_before_an_overwrite(tmp_path, broker) -> None:
    proc = train_over_an_old_run(
        tmp_path, {**JOB, "services": {"broker": broker, "env": broker, "store": broker}}
    )
    assert f"env address {broker} (--env or services.env)" in proc.stderr, proc.stderr
    assert "does not serve marti.api.env.v1.EnvService" in proc.stderr


def test_each_given_address_is_checked_for_its_own_service(broker) -> None:
    addresses, missing = resolve_addresses(None, broker=broker, store=broker)
    assert missing == ("env",)
    check_given_services(addresses, ("broker",))  # the broker at the broker's address: fine
    with pytest.raises(InvalidArgumentError, match=r"store address .* does not serve .*ExperienceService"):
        check_given_services(addresses, ("broker", "store"))


def test_a_store_that_is_down_is_waited_for_then_refused_before_an_overwrite(tmp_path) -> None:
    """No server at the store's address: the job waits ``services.reconnect_timeout_s`` (as its own retries
    would), then is refused naming the address and the wait, with the old run kept (it was cleared, then the job
    failed 120 s later, before)."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    job = {**JOB, "services": {"store": f"127.0.0.1:{port}", "reconnect_timeout_s": 1.0}}
    proc = train_over_an_old_run(tmp_path, job)
    assert f"store address 127.0.0.1:{port} (--store or services.store): no answer within 1 s" in proc.stderr
    assert "Nothing was changed in the run folder" in proc.stderr


def test_a_store_that_refuses_the_jobs_token_is_named_before_an_overwrite(tmp_path) -> None:
    """Health checks are exempt from auth, so a store that needs a token passes the address check; the job's
    tables are created there before the run folder, and the refusal names the store and its flag."""
    from services.experience_store.__main__ import make_spec
    from services.experience_store.settings import StoreSettings

    settings = StoreSettings(port=0, data_dir=str(tmp_path / "data"), token="s3cret")
    with serve_in_thread(lambda: [make_spec(settings)[0]], settings) as server:
        proc = train_over_an_old_run(tmp_path, {**JOB, "services": {"store": server.address}})
    assert f"store at {server.address} (--store or services.store): " in proc.stderr, proc.stderr
    assert "authorization" in proc.stderr.lower() and "Traceback" not in proc.stderr
