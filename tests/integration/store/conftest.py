"""Fixtures: a real experience store server on a free loopback port."""

from __future__ import annotations

import pytest

from marti.rpc.testing import serve_in_thread
from services.experience_store.__main__ import make_spec
from services.experience_store.settings import StoreSettings


@pytest.fixture
def store_server(tmp_path):
    """A running store with a SQLite data dir; yields ``(address, servicer)``."""
    settings = StoreSettings(port=0, data_dir=str(tmp_path / "data"), default_timeout_ms=2000)
    holder = {}

    def specs():
        spec, servicer = make_spec(settings)
        holder["servicer"] = servicer
        return [spec]

    with serve_in_thread(specs, settings) as server:
        yield server.address, holder["servicer"]
