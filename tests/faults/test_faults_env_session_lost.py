"""``kill -9`` of a real env server process, restart on the same port: a ``marti.make(address=...)`` env raises
``SessionLostError`` on ``step`` (type-based outage for the trainer) and carries on after ``reset()``."""

from __future__ import annotations

import pytest
from sdk_servers import once_reachable

import marti
from marti.errors import SessionLostError
from services.trainer.job.connections.reconnect import is_outage

from .procs import start

ENV = "collaborative_task_solving"


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
            once_reachable(lambda: env.step({env.acting_agents[0]: "x"}), 30.0, 0.2)
        assert is_outage(info.value), "the trainer's reconnect loop re-runs the phase on a lost session"

        obs, _ = once_reachable(env.reset, 30.0, 0.2)
        assert obs == first, "the new session is made with the same env id, config and creation seed"
        env.step({env.acting_agents[0]: "allocate evenly"})
    finally:
        env.close()
        svc.stop()
        if again is not None:
            again.stop()
