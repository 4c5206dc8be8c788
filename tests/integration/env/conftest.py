"""A real env server on a free loopback port, shared by the module's tests."""

from __future__ import annotations

import pytest

from marti.env.registry import default_registry
from marti.rpc.testing import serve_in_thread
from services.env_server.core.sessions import SessionManager
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings


@pytest.fixture(scope="module")
def env_server():
    """Yields ``(address, sessions)``: the server address and its session core (cap 8 sessions)."""
    settings = EnvServerSettings(port=0, max_sessions=8, max_batch_steps=16, reap_interval_s=0.05)
    sessions = SessionManager(default_registry(), max_sessions=8, idle_timeout_s=600.0)
    with serve_in_thread(lambda: [env_service(settings, sessions=sessions)], settings) as server:
        yield server.address, sessions
