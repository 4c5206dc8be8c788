"""Every SDK client, sync and aio, once closed: each call raises the closed-client ``FailedPreconditionError``
naming the client (never gRPC's ``ValueError: Cannot invoke RPC on closed channel!``), and a call waiting when
its client is closed raises the same error (never ``asyncio.CancelledError`` in an aio client, never a cancelled
status in a sync one closed by another thread), while a task cancelled by its caller still gets
``asyncio.CancelledError``. Real servers on a free port (see ``sdk_servers``).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sdk_servers import ScriptedInference, serve_sdk_services

import marti
import marti.aio
from marti.clients.env import EnvClient
from marti.errors import FailedPreconditionError

TOKEN = "closed-token"


class WaitingInference(ScriptedInference):
    """As :class:`ScriptedInference`, but model ``wait`` answers only after 10 s (a call to close under)."""

    async def Generate(self, request, context):  # noqa: N802 - gRPC method name
        if request.model == "wait":
            await asyncio.sleep(10)
        return await super().Generate(request, context)


@pytest.fixture(scope="module")
def address(tmp_path_factory) -> Iterator[str]:
    """Broker, env server, store, idle trainer and a waiting inference service on one server."""
    with serve_sdk_services(tmp_path_factory.mktemp("store"), TOKEN, WaitingInference(), trainer=True) as a:
        yield a


def _client(area: str, aio: bool, address: str) -> Any:
    mod = marti.aio if aio else marti
    if area == "broker":
        return mod.MartiCommClient("a1", address, session=f"closed-{uuid.uuid4().hex[:8]}", token=TOKEN)
    if area == "store":
        return mod.ExperienceSharingClient("a1", address, token=TOKEN)
    cls = {
        "env": marti.aio.EnvClient if aio else EnvClient,
        "trainer": mod.TrainerClient,
        "inference": mod.InferenceClient,
    }[area]
    return cls(address, token=TOKEN)


#: One call of each area's client (its name, its arguments).
CALLS = {
    "broker": ("get_messages", ()),
    "env": ("list_envs", ()),
    "store": ("list_tables", ()),
    "trainer": ("list_jobs", ()),
    "inference": ("models", ()),
}
NAMES = {"broker": "broker client", "env": "env client", "store": "store client", "trainer": "trainer client"}


@pytest.mark.parametrize("area", sorted(CALLS))
@pytest.mark.parametrize("aio", [False, True], ids=["sync", "aio"])
def test_a_closed_client_raises_failed_precondition_at_once(address, area, aio):
    name, args = CALLS[area]

    async def use(client: Any) -> None:
        await client.close()
        await getattr(client, name)(*args)

    client = _client(area, aio, address)
    with pytest.raises(FailedPreconditionError, match="closed") as info:
        if aio:
            asyncio.run(use(client))
        else:
            client.close()
            getattr(client, name)(*args)
    assert NAMES.get(area, "inference client") in str(info.value)


#: A call of each client (sync or aio) that waits (until the client is closed under it).
WAITING = {
    "store": lambda c: c.sample(table="default", batch_size=1, timeout_s=10),
    "inference": lambda c: c.generate("wait", [{"role": "user", "content": "hi"}], timeout_s=20),
    "broker": lambda c: c.get_messages(timeout_s=5),
}


#: Quick calls of the other aio clients, closed under them while in flight (before their answer is read).
IN_FLIGHT = {"env": lambda c: c.list_envs(), "trainer": lambda c: c.list_jobs()}
CLOSED_UNDER = [(a, d) for a in sorted(WAITING) for d in (0.0, 0.5)] + [(a, 0.0) for a in sorted(IN_FLIGHT)]


@pytest.mark.parametrize(("area", "delay_s"), CLOSED_UNDER, ids=[f"{a}-{d}s" for a, d in CLOSED_UNDER])
def test_an_aio_call_waiting_when_its_client_closes_raises_failed_precondition(address, area, delay_s):
    async def main() -> None:
        client = _client(area, True, address)
        task = asyncio.create_task({**WAITING, **IN_FLIGHT}[area](client))
        await asyncio.sleep(delay_s)
        await client.close()
        with pytest.raises(FailedPreconditionError, match="closed"):
            await asyncio.wait_for(task, 15)

    asyncio.run(main())


@pytest.mark.parametrize("area", sorted(WAITING))
def test_a_sync_call_waiting_when_another_thread_closes_its_client_raises_failed_precondition(address, area):
    client = _client(area, False, address)
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            WAITING[area](client)
        except BaseException as exc:  # the test reads what the waiting call raised
            raised.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        waiter.join(0.5)  # the call is waiting now
        assert waiter.is_alive()
    finally:
        client.close()
        waiter.join(15)
    assert len(raised) == 1 and isinstance(raised[0], FailedPreconditionError), raised
    assert "closed" in str(raised[0]) and NAMES.get(area, "inference client") in str(raised[0])


@pytest.mark.parametrize("area", sorted(WAITING))
def test_a_caller_cancelling_its_own_task_still_gets_cancelled_error(address, area):
    async def main() -> None:
        client = _client(area, True, address)
        task = asyncio.create_task(WAITING[area](client))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await client.close()

    asyncio.run(main())
