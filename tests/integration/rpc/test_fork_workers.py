"""A program that makes rpcs, then forks workers (``multiprocessing``'s ``fork`` start method), can call the
services from the children, within their deadlines, and keeps working in the parent.

The program runs in a fresh interpreter (``import marti`` decides gRPC's fork settings before the first
channel), against a broker hosted by this test process. Children use both a client inherited from the
parent (sync and ``marti.aio``) and clients they make themselves. gRPC's asyncio stack does not survive
``fork``: when the parent used ``marti.aio`` (its channels open), a child's aio call raises ``ForkedAioError``
at once rather than hanging; sync calls work in every case.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent(
    """
    import asyncio, multiprocessing, sys, time
    import marti, marti.aio

    ADDRESS = sys.argv[1]
    AIO_PARENT = sys.argv[2] == "1"
    AIO_CHILD = sys.argv[3] == "1"
    DEADLINE_S = 10.0
    inherited = marti.MartiCommClient("parent", ADDRESS, session="fork", timeout_s=DEADLINE_S)
    inherited_aio = marti.aio.MartiCommClient("parent-aio", ADDRESS, session="fork", timeout_s=DEADLINE_S)

    async def aio_put(client, value):
        return await client.broadcast_state(value)

    def work(i):
        start = time.monotonic()
        own = marti.MartiCommClient(f"child-{i}", ADDRESS, session="fork", timeout_s=DEADLINE_S)
        try:
            own.broadcast_state({"child": i})
            seen = set(own.get_agent_states(exclude_self=False))
        finally:
            own.close()
        inherited.broadcast_state({"via": i})
        aio = "unused"
        if AIO_CHILD:
            try:
                asyncio.run(aio_put(inherited_aio, {"aio": i}))
                aio = "ok"
            except Exception as exc:
                aio = type(exc).__name__
        return i, sorted(seen), aio, time.monotonic() - start

    if __name__ == "__main__":
        inherited.broadcast_state({"parent": 0})
        if AIO_PARENT:
            asyncio.run(aio_put(inherited_aio, {"parent": 0}))
        with multiprocessing.get_context("fork").Pool(2) as pool:
            results = pool.map_async(work, range(4)).get(timeout=4 * DEADLINE_S)
        expected_aio = "unused" if not AIO_CHILD else "ForkedAioError" if AIO_PARENT else "ok"
        for i, seen, aio, took in results:
            assert f"child-{i}" in seen and "parent" in seen, seen
            assert aio == expected_aio, (aio, expected_aio)
            assert took < DEADLINE_S, took
        inherited.broadcast_state({"parent": 1})
        if AIO_PARENT:
            asyncio.run(aio_put(inherited_aio, {"parent": 1}))
        assert inherited.get_agent_states(exclude_self=False)["parent"] == {"parent": 1}
        inherited.close()
        print("OK", len(results))
    """
)


@pytest.fixture(scope="module")
def address(hosted_broker_address: str) -> str:
    """A broker on a free port, hosted by this test process (conftest.py)."""
    return hosted_broker_address


@pytest.mark.parametrize("aio_parent,aio_child", [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")])
def test_forked_workers_call_the_services_within_their_deadlines(address, tmp_path, aio_parent, aio_child):
    script = tmp_path / "fork_workers.py"
    script.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_") and not k.startswith("MARTI_")}
    proc = subprocess.run(
        [sys.executable, str(script), address, aio_parent, aio_child],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK 4")
