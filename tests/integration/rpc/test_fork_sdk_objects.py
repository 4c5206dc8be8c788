"""A forked child that uses an SDK object its parent made gets either working calls or a clear error at once.

* A stream-transport env (``marti.make``'s default) lives on a bidi stream of the parent, which a child cannot
  use: in the child, ``step``, ``reset`` and ``step_batch`` raise ``FailedPreconditionError`` (naming the
  parent's pid and the fixes) within a few seconds instead of hanging, ``close`` leaves the parent's session
  alone, and the parent's env keeps working. A unary env made by the parent, and an env made in the child,
  work in the child.
* A batching ``MartiCommClient`` made by the parent delivers, from the child, what the child sends (its flush
  timer thread is re-made there), alongside what the parent sends after the fork (no message-id clash) and
  what was buffered at fork time (sent by both processes, delivered once).

Each program runs in a fresh interpreter with no ``GRPC_*`` variables (``import marti`` decides gRPC's fork
settings before the first channel), against servers hosted by this test process.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import pytest
from fork_child import CHILD_HELPERS, run_program

from marti.rpc.testing import serve_in_thread

COMMON = CHILD_HELPERS

ENV_PROGRAM = COMMON + textwrap.dedent(
    """
    import marti
    from marti.clients.env import RemoteParallelEnv
    from marti.errors import FailedPreconditionError

    ADDRESS = sys.argv[1]
    KW = dict(num_agents=3, seed=1, address=ADDRESS, timeout_s=10)  # calls that must succeed, on a loaded machine

    def actions(env):
        return {a: "task_1: 1" for a in env.agents}

    def attempt(fn):
        start = time.monotonic()
        try:
            fn()
            return ["ok", "", time.monotonic() - start]
        except Exception as exc:
            return [type(exc).__name__, str(exc), time.monotonic() - start]

    env = marti.make("collaborative_task_solving", **KW)
    unary = marti.make("collaborative_task_solving", transport="unary", **KW)
    env.reset(seed=1)
    unary.reset(seed=1)
    parent_session = env.session_id
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        out = {
            "step": attempt(lambda: env.step(actions(env))),
            "reset": attempt(lambda: env.reset(seed=2)),
            "step_batch": attempt(lambda: RemoteParallelEnv.step_batch([env], [actions(env)])),
            "close": attempt(env.close),
            "unary": attempt(lambda: unary.step(actions(unary))),
        }
        def new_env():
            own = marti.make("collaborative_task_solving", **KW)
            own.reset(seed=1)
            own.step(actions(own))
            own.close()
        out["new"] = attempt(new_env)
        report(write_fd, out)
    os.close(write_fd)
    out = wait_child(pid, read_fd)
    for name in ("step", "reset", "step_batch"):
        kind, message, took = out[name]
        assert kind == "FailedPreconditionError", (name, out[name])
        assert f"process {os.getpid()}" in message and "transport='unary'" in message, message
        assert "new env" in message, message
        assert took < 5, (name, took)  # at once: a call on the parent's stream would wait its 10 s
    for name in ("close", "unary", "new"):
        assert out[name][0] == "ok", (name, out[name])
    # The parent's env and session were left alone by the child.
    env.step(actions(env))
    assert env.session_id == parent_session and not env.session_lost
    unary.step(actions(unary))
    env.close()
    unary.close()
    print("OK")
    """
)

BROKER_PROGRAM = COMMON + textwrap.dedent(
    """
    import marti

    ADDRESS = sys.argv[1]
    SESSION = sys.argv[2]
    receiver = marti.MartiCommClient("receiver", ADDRESS, session=SESSION, timeout_s=5)
    sender = marti.MartiCommClient(
        "sender", ADDRESS, session=SESSION, timeout_s=5, batching_size=100, update_frequency_s=0.05
    )
    sender.send_message("receiver", {"from": "parent", "n": 0})
    sender.flush()
    # Buffered at fork time (the parent's timer sends it after 50 ms; the fork comes first).
    sender.send_message("receiver", {"from": "parent", "n": 1})
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        inherited = sender.get_communication_stats().total_sent  # the parent's, counted before the fork
        sender.send_message("receiver", {"from": "child", "n": 0})
        # No flush and no close: only the child's flush timer can send it (total_sent counts it once acked).
        deadline = time.monotonic() + 20
        while sender.get_communication_stats().total_sent <= inherited and time.monotonic() < deadline:
            time.sleep(0.05)
        report(write_fd, {"stats": sender.get_communication_stats().total_sent - inherited})
    os.close(write_fd)
    sender.send_message("receiver", {"from": "parent", "n": 2})
    got = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(got) < 4:
        got += [(m.content["from"], m.content["n"]) for m in receiver.get_messages(timeout_s=0.5)]
    child = wait_child(pid, read_fd)
    assert child["stats"] >= 1, child
    time.sleep(0.5)  # a duplicate of the inherited message would be here by now
    got += [(m.content["from"], m.content["n"]) for m in receiver.get_messages(timeout_s=0.2)]
    expected = [("child", 0), ("parent", 0), ("parent", 1), ("parent", 2)]
    assert sorted(got) == expected, got
    sender.close()
    receiver.close()
    print("OK")
    """
)


_run = run_program


@pytest.fixture(scope="module")
def env_address() -> Iterator[str]:
    """An env server on a free port, hosted by this test process."""
    from services.env_server.servicer import env_service
    from services.env_server.settings import EnvServerSettings

    settings = EnvServerSettings(host="127.0.0.1", port=0)
    with serve_in_thread(lambda: [env_service(settings)], settings) as server:
        yield server.address


@pytest.fixture(scope="module")
def broker_address(hosted_broker_address: str) -> str:
    """A broker on a free port, hosted by this test process (conftest.py)."""
    return hosted_broker_address


def test_forked_child_gets_a_clear_error_from_the_parents_stream_env(env_address, tmp_path):
    proc = _run(tmp_path, "fork_env.py", ENV_PROGRAM, env_address)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK")


def test_forked_child_sends_through_the_parents_batching_broker_client(broker_address, tmp_path):
    proc = _run(tmp_path, "fork_broker.py", BROKER_PROGRAM, broker_address, f"fork-{tmp_path.name}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK")
