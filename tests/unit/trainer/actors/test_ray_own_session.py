"""``ray_processes_in_own_session``: a process Ray starts the way a local ``ray.init`` starts its GCS and raylet
(``ray._private.services.start_ray_process``) leads a session of its own while the context is open, so a signal
to ``marti train``'s process group does not reach it, and Ray's own class is back afterwards."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="Linux: Ray's kernel fate sharing"
)

_SHOW_SESSION = [sys.executable, "-c", "import os; print(os.getsid(0), os.getpgid(0), os.getpid())"]


def _session_of_a_ray_process() -> tuple[int, int, int]:
    """(session id, process group id, pid) of a process started through Ray's ``start_ray_process``."""
    from ray._private import services

    info = services.start_ray_process(
        _SHOW_SESSION, "marti_test", fate_share=True, stdout_file=subprocess.PIPE
    )
    out, _ = info.process.communicate(timeout=60)
    sid, pgid, pid = (int(x) for x in out.split())
    return sid, pgid, pid


def test_ray_processes_lead_their_own_session_only_inside_the_context():
    from ray._private import services

    from services.trainer.ray.runtime import ray_processes_in_own_session

    original = services.ConsolePopen
    with ray_processes_in_own_session() as own:
        assert own is True
        sid, pgid, pid = _session_of_a_ray_process()
    assert sid == pgid == pid  # a new session: neither this process's group nor its session
    assert services.ConsolePopen is original
    sid, pgid, _ = _session_of_a_ray_process()
    assert (sid, pgid) == (os.getsid(0), os.getpgid(0))  # outside it, Ray's default: the caller's group


def test_the_original_class_is_back_after_an_error():
    from ray._private import services

    from services.trainer.ray.runtime import ray_processes_in_own_session

    original = services.ConsolePopen
    with pytest.raises(RuntimeError, match="ray.init failed"), ray_processes_in_own_session():
        raise RuntimeError("ray.init failed")
    assert services.ConsolePopen is original
