"""Fixtures of the security suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from marti.rpc.settings import ServerSettings
from marti.rpc.testing import serve_in_thread

from .stack import all_specs


@pytest.fixture(scope="module")
def stack_factory(tmp_path_factory) -> Iterator:
    """Yields ``start(settings) -> address`` that hosts all four services; every server stops at the end."""
    opened = []

    def start(settings: ServerSettings) -> str:
        tmp = tmp_path_factory.mktemp("stack")
        ctx = serve_in_thread(lambda: all_specs(str(tmp)), settings)
        server = ctx.__enter__()
        opened.append(ctx)
        return server.address

    yield start
    for ctx in reversed(opened):
        ctx.__exit__(None, None, None)
