"""Settings every test process needs before any gRPC import (see ``marti/__init__.py``)."""

import os

import pytest

import marti  # noqa: F401 - sets GRPC_ENABLE_FORK_SUPPORT before a test module imports grpc


@pytest.fixture(autouse=True)
def _no_token_from_the_shell(monkeypatch):
    """SDK clients fall back to ``MARTI_TOKEN`` and ``MARTI_<SERVICE>_TOKEN``: a token in the developer's shell
    must not change what a test sees. Tests that need one set it themselves."""
    for name in [
        n for n in os.environ if n == "MARTI_TOKEN" or (n.startswith("MARTI_") and n.endswith("_TOKEN"))
    ]:
        monkeypatch.delenv(name)
