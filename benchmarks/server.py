"""A marti service in its own process for a bench: started, health-checked and stopped by
:class:`marti.command.stack.LocalStack` (the start of ``marti up``), with its output in a log file."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from marti.command.stack import LocalStack


class Server:
    """A service in its own process on port 0, started (and health-checked) by :class:`marti.command.stack.LocalStack`;
    its output goes to a log file in a temporary folder. Use it as a context manager, or call :meth:`stop`.

    Args:
        service: The ``marti`` command of the service: ``env-server``, ``broker`` or ``store``.
        flags: Extra command-line flags of that command, passed as they are.

    Attributes:
        proc: The service's process (its pid is the server's: ``marti SERVICE`` runs it in that process).
        address: ``host:port`` it listens on.
        tail: The last 40 lines of its output, read by :meth:`stop`.

    Raises:
        UnavailableError: The service exited or did not listen in time (from :meth:`LocalStack.start`).
        DeadlineExceededError: The service did not report SERVING in time.
    """

    def __init__(self, service: str, flags: list[str]) -> None:
        self.service = service
        self._logs = tempfile.TemporaryDirectory(prefix=f"marti-bench-{service}-")
        self.stack = LocalStack(
            services=(service,), log_dir=Path(self._logs.name), extra_args={service: flags}
        )
        try:
            self.stack.start()
        except BaseException:
            self._logs.cleanup()
            raise
        started = self.stack.running[service]
        self.proc: subprocess.Popen = started.process
        self.address: str = started.address
        self._log_path = started.log_path
        self.tail: list[str] = []

    def cpu_s(self) -> float | None:
        """CPU seconds (user + system) the server has used so far; None where /proc is missing."""
        return cpu_s(self.proc.pid)

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.proc.poll() is None

    def stop(self) -> int | None:
        """Stops the server (:meth:`LocalStack.stop`: SIGTERM, then SIGKILL), keeps the last 40 lines of its output
        in :attr:`tail` and removes its log folder; returns its exit code."""
        if self.stack.running:
            self.stack.stop()
        if self._log_path is not None and self._log_path.exists():
            self.tail = self._log_path.read_text(errors="replace").splitlines()[-40:]
        self._logs.cleanup()
        return self.proc.returncode

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used so far; None where /proc is missing."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
