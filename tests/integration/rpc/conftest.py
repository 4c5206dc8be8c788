"""Fixtures shared by the rpc integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from marti.rpc.settings import ServerSettings
from marti.rpc.testing import serve_in_thread


@pytest.fixture(scope="module")
def hosted_broker_address() -> Iterator[str]:
    """A broker on a free port, hosted by this test process (one per test module)."""
    from services.comm_broker.servicer import broker_service
    from services.comm_broker.settings import BrokerSettings

    with serve_in_thread(
        lambda: [broker_service(BrokerSettings(port=0))], ServerSettings(host="127.0.0.1", port=0)
    ) as server:
        yield server.address
