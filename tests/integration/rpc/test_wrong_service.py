"""Clients pointed at the wrong place get an error that names the mistake, over real gRPC:

* a client dialing another service (an env client at a broker) gets :class:`UnimplementedError` naming the
  server's address, the method and what the server serves (gRPC alone said ``InternalError: Method not found!``);
* every SDK client refuses an address without a port (gRPC dialed port 443) with :class:`InvalidArgumentError`
  naming it, before dialing anything.
"""

from __future__ import annotations

import asyncio
import re

import grpc
import pytest

import marti
import marti.aio
from marti.clients.env import EnvClient
from marti.errors import InvalidArgumentError, UnimplementedError
from marti.rpc.testing import serve_in_thread

ENV_KWARGS = {"scenario": "resource_allocation", "num_agents": 3}


@pytest.fixture(scope="module")
def broker_address():
    """A real server hosting only the broker."""
    from services.comm_broker.servicer import broker_service
    from services.comm_broker.settings import BrokerSettings

    with serve_in_thread(lambda: [broker_service(BrokerSettings(port=0))]) as server:
        yield server.address


def _calls_to_a_broker(address: str):
    """``(what, call)`` for clients of other services, each dialing the broker."""

    async def aio_env() -> None:
        client = marti.aio.EnvClient(address)
        try:
            await client.list_envs()
        finally:
            await client.close()

    return {
        "env client (unary)": lambda: EnvClient(address).list_envs(),
        "remote env (make)": lambda: marti.make("collaborative_task_solving", address=address, **ENV_KWARGS),
        "aio env client": lambda: asyncio.run(aio_env()),
        "store client": lambda: marti.ExperienceSharingClient("a", address=address).create_table(
            "t", preset="queue"
        ),
        "trainer client": lambda: marti.TrainerClient(address).list_jobs(),
        "inference client": lambda: marti.InferenceClient(address).models(),
    }


@pytest.mark.parametrize("what", list(_calls_to_a_broker("x:1")))
def test_a_client_of_another_service_is_told_so(broker_address, what):
    with pytest.raises(UnimplementedError) as err:
        _calls_to_a_broker(broker_address)[what]()
    text = str(err.value)
    assert f"the server at {broker_address} does not serve 'marti.api." in text, text
    assert "it serves marti.api.broker.v1.BrokerService" in text and "different service" in text, text


def test_a_server_that_is_not_marti_maps_to_unimplemented_too():
    """gRPC's own ``Method not found!`` (a server without the marti interceptor) is an UnimplementedError."""
    server = grpc.server(__import__("concurrent.futures").futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with pytest.raises(UnimplementedError, match="does not serve the method called.*different service"):
            EnvClient(f"127.0.0.1:{port}").list_envs()
    finally:
        server.stop(None)


def _constructors():
    return {
        "MartiCommClient": lambda a: marti.MartiCommClient(agent_id="a", address=a, session="s"),
        "aio MartiCommClient": lambda a: marti.aio.MartiCommClient(agent_id="a", address=a, session="s"),
        "ExperienceSharingClient": lambda a: marti.ExperienceSharingClient("a", address=a),
        "aio ExperienceSharingClient": lambda a: marti.aio.ExperienceSharingClient("a", address=a),
        "EnvClient": EnvClient,
        "aio EnvClient": marti.aio.EnvClient,
        "make": lambda a: marti.make("collaborative_task_solving", address=a, **ENV_KWARGS),
        "TrainerClient": marti.TrainerClient,
        "InferenceClient": marti.InferenceClient,
        "health": lambda a: marti.rpc.client.health.check_health(a, timeout_s=1),
    }


@pytest.mark.parametrize("address", ["localhost", "127.0.0.1", "[::1]", "dns:///localhost"])
@pytest.mark.parametrize("client", list(_constructors()))
def test_an_address_without_a_port_is_refused_naming_it(client, address):
    import marti.rpc.client.health  # noqa: F401 - for the "health" entry

    with pytest.raises(InvalidArgumentError, match=re.escape(repr(address)) + ".* port") as err:
        _constructors()[client](address)
    if not address.startswith("dns:"):  # a dns:/// env address is a pool's, checked with the pool's entries
        assert "it has no port" in str(err.value)


def test_a_server_with_a_token_names_what_it_serves_only_to_callers_with_the_token():
    from marti.errors import UnauthenticatedError
    from marti.rpc.settings import ServerSettings
    from services.comm_broker.servicer import broker_service
    from services.comm_broker.settings import BrokerSettings

    settings = ServerSettings(port=0, token="s3cret")
    with serve_in_thread(lambda: [broker_service(BrokerSettings(port=0))], settings) as server:
        with pytest.raises(UnauthenticatedError):
            EnvClient(server.address, token="wrong").list_envs()
        with pytest.raises(UnimplementedError, match="it serves marti.api.broker.v1.BrokerService"):
            EnvClient(server.address, token="s3cret").list_envs()
