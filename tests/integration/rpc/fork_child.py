"""What the fork tests' programs share: the parent's bounded wait for a forked child and the child's report.

The programs run in a fresh interpreter (no pytest, no ``GRPC_*`` variables), so this is source text that each
program starts with, not functions to import.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

#: How long a parent waits for its child by default; a child still running then is killed and the program fails.
CHILD_WAIT_S = 20

#: ``wait_child(pid, read_fd, wait_s)``: the child's JSON report, or SystemExit naming a hung child (killed);
#: ``report(write_fd, out)``: the child writes ``out`` as JSON and exits at once.
CHILD_HELPERS = textwrap.dedent(
    f"""
    import asyncio, json, os, signal, sys, time

    def wait_child(pid, read_fd, wait_s={CHILD_WAIT_S}):
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise SystemExit(f"the child hung: still running after {{wait_s}} s")
        with os.fdopen(read_fd) as f:
            data = f.read()
        assert data, ("the child reported nothing", status)
        return json.loads(data)

    def report(write_fd, out):
        os.write(write_fd, json.dumps(out).encode())
        os._exit(0)
    """
)


def run_program(
    tmp_path: Path, name: str, program: str, *args: str, timeout_s: float = CHILD_WAIT_S + 60
) -> subprocess.CompletedProcess:
    """Write ``program`` to ``tmp_path/name`` and run it with ``args`` in a fresh interpreter whose environment
    has no ``GRPC_*`` or ``MARTI_*`` variables (stdout and stderr captured, at most ``timeout_s`` seconds)."""
    script = tmp_path / name
    script.write_text(program)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPC_") and not k.startswith("MARTI_")}
    return subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=timeout_s
    )
