"""A program that used ``marti.aio`` clients, closed them, then forks, can call the services from the child.

gRPC's asyncio stack runs a poller thread until its last ``grpc.aio`` channel is collected; while that thread
is inside gRPC, gRPC skips its fork handlers and sync calls in a forked child hung (every child, before the
fix: a closed channel stayed cached by the client's stubs, so the thread outlived ``close``). Here the parent
uses and closes an async broker, env and store client, keeps the client objects, and forks: no thread but the
main one is left at fork time, and each child makes sync calls (new client), and async calls with a new
``marti.aio`` client, within their deadlines.

The program runs in a fresh interpreter with no ``GRPC_*`` variables, against real servers on a free port
hosted by this test process; the parent kills a child that runs longer than :data:`CHILD_WAIT_S`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from fork_child import CHILD_HELPERS
from sdk_servers import ScriptedInference, serve_sdk_services

TOKEN = "fork-token"
#: The parent waits this long for each child; a child that hangs is killed and the program fails.
CHILD_WAIT_S = 15
#: Children forked one after the other.
CHILDREN = 2

PROGRAM = CHILD_HELPERS + textwrap.dedent(
    f"""
    import asyncio, json, os, signal, sys, threading, time
    import marti, marti.aio

    ADDRESS, TOKEN, SESSION = sys.argv[1:4]
    KW = dict(token=TOKEN, timeout_s=5)

    async def use_and_close():
        comm = marti.aio.MartiCommClient("parent", ADDRESS, session=SESSION, **KW)
        env = marti.aio.EnvClient(ADDRESS, **KW)
        store = marti.aio.ExperienceSharingClient("parent", ADDRESS, **KW)
        await comm.broadcast_state({{"parent": 0}})
        await env.list_envs()
        await store.list_tables()
        for client in (comm, env, store):
            await client.close()
        return comm, env, store  # kept alive, as a program keeps its client objects

    async def child_aio(i):
        async with marti.aio.MartiCommClient(f"child-aio-{{i}}", ADDRESS, session=SESSION, **KW) as c:
            await c.broadcast_state({{"aio": i}})

    def child(i, write_fd):
        start = time.monotonic()
        sync = marti.MartiCommClient(f"child-{{i}}", ADDRESS, session=SESSION, **KW)
        sync.broadcast_state({{"child": i}})
        seen = sorted(sync.get_agent_states(exclude_self=False))
        sync.close()
        asyncio.run(child_aio(i))
        os.write(write_fd, json.dumps([seen, time.monotonic() - start]).encode())
        os._exit(0)

    clients = asyncio.run(use_and_close())
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    assert not others, ("threads left after closing the async clients", others)
    for i in range({CHILDREN}):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            child(i, write_fd)
        os.close(write_fd)
        seen, took = wait_child(pid, read_fd, {CHILD_WAIT_S})
        assert "parent" in seen and f"child-{{i}}" in seen, seen
        assert took < {CHILD_WAIT_S}, took
    check = marti.MartiCommClient("check", ADDRESS, session=SESSION, **KW)
    states = check.get_agent_states(exclude_self=True)
    check.close()
    assert {{f"child-aio-{{i}}" for i in range({CHILDREN})}} <= set(states), states
    print("OK", {CHILDREN})
    """
)


@pytest.fixture(scope="module")
def address(tmp_path_factory) -> Iterator[str]:
    """Broker, env server and store hosted by one real server on a free port, token required."""
    with serve_sdk_services(tmp_path_factory.mktemp("store"), TOKEN, ScriptedInference()) as address:
        yield address


def test_children_forked_after_closing_the_async_clients_can_call_the_services(address, tmp_path):
    script = tmp_path / "fork_after_aio_close.py"
    script.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_") and not k.startswith("MARTI_")}
    proc = subprocess.run(
        [sys.executable, str(script), address, TOKEN, f"fork-{tmp_path.name}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILDREN * CHILD_WAIT_S + 60,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith(f"OK {CHILDREN}")
