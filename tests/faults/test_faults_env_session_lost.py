"""``kill -9`` of a real env server process, restart on the same port: a ``marti.make(address=...)`` env raises
``SessionLostError`` on ``step`` (type-based outage for the trainer) and carries on after ``reset()``."""

from __future__ import annotations

import time

import pytest

import marti
from marti.errors import SessionLostError, UnavailableError
from services.trainer.reconnect import is_outage

from .procs import start

ENV = "collaborative_task_solving"


def _until_reachable(fn, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except UnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.mark.parametrize("transport", ["stream", "unary"])
def test_env_kill9_restart_session_lost_then_reset_recovers(transport):
    svc = start("env-server")
    port = svc.address.rsplit(":", 1)[1]
    again = None
    env = marti.make(ENV, address=svc.address, seed=11, transport=transport, timeout_s=10)
    try:
        first, _ = env.reset()
        for _ in range(2):
            env.step({env.acting_agents[0]: "allocate evenly"})
        svc.kill9()
        again = start("env-server", "--port", port)
        assert again.address.endswith(f":{port}")

        with pytest.raises(SessionLostError, match=r"reset\(\)") as info:
            _until_reachable(lambda: env.step({env.acting_agents[0]: "x"}))
        assert is_outage(info.value), "the trainer's reconnect loop re-runs the phase on a lost session"

        obs, _ = _until_reachable(env.reset)
        assert obs == first, "the new session is made with the same env id, config and creation seed"
        env.step({env.acting_agents[0]: "allocate evenly"})
    finally:
        env.close()
        svc.stop()
        if again is not None:
            again.stop()
