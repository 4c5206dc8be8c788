"""Run marti services as real child processes (``python -m marti.command.main NAME --port 0``) for fault tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
_LISTEN = re.compile(r"listening on (\S+:\d+)")
#: Env-var prefix of each service's settings.
PREFIX = {
    "broker": "MARTI_BROKER_",
    "env-server": "MARTI_ENV_",
    "store": "MARTI_STORE_",
    "trainer": "MARTI_TRAINER_",
}


@dataclass
class Service:
    """A service child process.

    Attributes:
        name: CLI name.
        proc: The process.
        address: ``host:port`` it printed.
        output: Lines it printed after the address (drained by a thread).
    """

    name: str
    proc: subprocess.Popen
    address: str
    output: list[str] = field(default_factory=list)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` to the process."""
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        """``kill -9`` and reap."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Kill if still running (test cleanup)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def start(name: str, *args: str, settings: dict[str, str] | None = None, timeout_s: float = 90.0) -> Service:
    """Start ``marti NAME --port 0 ARGS`` and wait for its address.

    Args:
        name: ``broker``, ``env-server``, ``store`` or ``trainer``.
        args: Extra CLI arguments.
        settings: Settings passed as environment variables (``grace_s`` -> ``MARTI_BROKER_GRACE_S``).
        timeout_s: Longest wait for ``listening on``, seconds.

    Raises:
        RuntimeError: the process exited or did not listen in time.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for key, value in (settings or {}).items():
        env[PREFIX[name] + key.upper()] = value
    proc = subprocess.Popen(
        [sys.executable, "-m", "marti.command.main", name, "--port", "0", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        seen.append(line)
        match = _LISTEN.search(line)
        if match:
            svc = Service(name, proc, match.group(1))
            threading.Thread(target=svc.output.extend, args=(proc.stdout,), daemon=True).start()
            return svc
    proc.kill()
    raise RuntimeError(f"{name} did not start: {''.join(seen)[-2000:]}")


def health_watch(address: str) -> tuple[grpc.Channel, list[int], threading.Thread]:
    """Open a health ``Watch`` stream; statuses seen are appended to the returned list by a thread."""
    channel = grpc.insecure_channel(address)
    seen: list[int] = []
    stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), timeout=60)

    def read() -> None:
        try:
            for resp in stream:
                seen.append(resp.status)
        except grpc.RpcError:
            pass

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.02)
    return channel, seen, thread
