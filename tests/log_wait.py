"""Wait for a line in the log file of a process that must keep running meanwhile (``marti up``'s stdout or
stderr, redirected to a file by the test)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def wait_for(path: Path, text: str, proc: subprocess.Popen, timeout_s: float = 60) -> str:
    """``path``'s content once it holds ``text``.

    Raises:
        AssertionError: ``proc`` exited first (its code and the content so far), or ``timeout_s`` seconds passed.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        content = path.read_text()
        if text in content:
            return content
        assert proc.poll() is None, (proc.returncode, content)
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path.read_text()!r}")
