"""Settings every test process needs before any gRPC import (see ``marti/__init__.py``)."""

import marti  # noqa: F401 - sets GRPC_ENABLE_FORK_SUPPORT before a test module imports grpc
