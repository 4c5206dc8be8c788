"""Start the marti services as local processes: the embedded stack of ``marti up`` and ``marti train``."""

from __future__ import annotations

import itertools
import math
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from marti.errors import InvalidArgumentError, UnavailableError
from marti.plumbing.dir_lock import ensure_folder
from marti.rpc.client.health import wait_until_serving

#: Service CLI names and their default ports (ARCHITECTURE.md section 6).
DEFAULT_PORTS = {"broker": 50051, "env-server": 50052, "store": 50053, "trainer": 50054}
#: Config keys / env-var stems for each service.
SERVICE_KEYS = {"broker": "BROKER", "env-server": "ENV", "store": "STORE", "trainer": "TRAINER"}
_LISTEN = re.compile(r"listening on (\S+)")


@dataclass
class ServiceProcess:
    """A service running as a child process.

    Attributes:
        name: CLI name (``broker``, ``env-server``, ``store``, ``trainer``).
        process: The child process.
        address: ``host:port`` it printed when it started listening.
        log_path: Where its stdout and stderr go.
    """

    name: str
    process: subprocess.Popen
    address: str
    log_path: Path | None = None


@dataclass
class LocalStack:
    """Starts, health-checks and stops a set of marti services as local processes.

    Args:
        services: CLI names to start, in order.
        ports: Port per service; 0 asks the OS for a free one (the default for embedded stacks); ``None`` leaves
            it to the service's own setting (``MARTI_<SERVICE>_PORT``, else :data:`DEFAULT_PORTS`).
        data_dir: Root for the broker's and store's data dirs (``<data_dir>/broker``, ``<data_dir>/store``);
            ``None`` runs them in memory.
        log_dir: Folder for per-service logs; ``None`` inherits the parent's stderr.
        token: Bearer token every service requires (and ``MARTI_TOKEN`` for clients).
        extra_args: Extra CLI arguments per service name.
        startup_timeout_s: Time each service may take to report SERVING, seconds.
        stop_grace_s: Seconds :meth:`stop` gives the services, all together, to exit after SIGTERM before it
            SIGKILLs those still running (>= 0; ``marti up --stop-grace-s``). A service interrupted while it
            starts gets the same grace on its own first.
    """

    services: tuple[str, ...] = ("broker", "env-server", "store")
    ports: dict[str, int | None] = field(default_factory=dict)
    data_dir: Path | None = None
    log_dir: Path | None = None
    token: str | None = None
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    startup_timeout_s: float = 60.0
    stop_grace_s: float = 15.0
    running: dict[str, ServiceProcess] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.stop_grace_s) and self.stop_grace_s >= 0):
            raise InvalidArgumentError(
                f"--stop-grace-s {self.stop_grace_s!r} is out of range (>= 0 seconds; stop_grace_s)"
            )

    def _command(self, name: str, port: int | None) -> list[str]:
        cmd = [sys.executable, "-m", "marti.command.main", name] + (
            [] if port is None else ["--port", str(port)]
        )
        if self.data_dir is not None and name in ("broker", "store"):
            cmd += ["--data-dir", str(Path(self.data_dir) / name)]
        if name == "trainer":  # the trainer's jobs use the services started before it
            for svc, flag in (("broker", "--broker"), ("env-server", "--env"), ("store", "--store")):
                if svc in self.running:
                    cmd += [flag, self.running[svc].address]
        return cmd + self.extra_args.get(name, [])

    def _spawn(self, name: str, port: int | None) -> ServiceProcess:
        env = dict(os.environ)
        if self.token:
            env["MARTI_TOKEN"] = self.token
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["MARTI_PARENT_PID"] = str(os.getpid())  # the service exits when this process dies (run_server)
        log_path = None
        stderr = None
        if self.log_dir is not None:
            log_path = Path(self.log_dir) / f"{name}.log"
            try:
                stderr = open(log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
            except OSError as exc:  # a read-only log dir: was a PermissionError traceback
                raise InvalidArgumentError(
                    f"log dir {self.log_dir} cannot be written ({log_path.name}: {exc.strerror or exc})"
                ) from None
        proc = subprocess.Popen(
            self._command(name, port),
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            start_new_session=True,
        )
        try:
            address, rest = self._read_address(name, port, proc, log_path)
        except BaseException:  # a signal while it starts: it is in no `running` list that stop() would end
            _end(proc, self.stop_grace_s)
            raise
        threading.Thread(target=_drain, args=(proc, log_path, rest), daemon=True).start()
        return ServiceProcess(name, proc, address, log_path)

    def _read_address(
        self, name: str, port: int | None, proc: subprocess.Popen, log_path: Path | None
    ) -> tuple[str, bytes]:
        """The address ``proc`` printed and the bytes read past its line; waits :attr:`startup_timeout_s` at
        most, also for a child that stopped (SIGSTOP) or hangs before printing anything."""
        deadline = time.monotonic() + self.startup_timeout_s
        assert proc.stdout is not None  # noqa: S101 - Popen was given stdout=PIPE
        fd, buffer = proc.stdout.fileno(), bytearray()
        while (line := _next_line(fd, buffer, deadline)) is not None:
            if not line:
                code = proc.wait()
                said = _last_line(log_path) if log_path is not None else ""
                if port is None:
                    port = os.environ.get(f"MARTI_{SERVICE_KEYS[name]}_PORT") or DEFAULT_PORTS[name]
                raise UnavailableError(
                    f"{name} (port {port or 'any'}) exited with code {code} before listening"
                    + (f": {said}" if said else " (its error is printed above)")
                )
            match = _LISTEN.search(line.decode(errors="replace"))
            if match:
                return match.group(1), bytes(buffer)
        proc.kill()
        raise UnavailableError(f"{name} did not print its address within {self.startup_timeout_s:.0f}s")

    def start(self) -> dict[str, str]:
        """Start every service and wait until each reports SERVING.

        Returns:
            Address (``host:port``) per service name.

        Raises:
            InvalidArgumentError: ``data_dir`` or ``log_dir`` cannot be a folder (named, before any service
                starts; :func:`marti.plumbing.dir_lock.ensure_folder`), a log file in ``log_dir`` cannot be written, or a
                service would serve TLS
                (:func:`tls_refusal`).
            UnavailableError: a service exited or did not listen in time (started ones are stopped).
            DeadlineExceededError: a service did not report SERVING in time.
        """
        refusal = tls_refusal(self.services)
        if refusal:
            raise InvalidArgumentError(refusal)
        for folder, what in ((self.data_dir, "data dir"), (self.log_dir, "log dir")):
            if folder is not None:
                ensure_folder(folder, what)
        try:
            for name in self.services:
                svc = self._spawn(name, self.ports.get(name, 0))
                self.running[name] = svc
                wait_until_serving(svc.address, timeout_s=self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self.addresses

    def restart(self, name: str) -> str:
        """Start the running service ``name`` again (its process has exited) on the port it had, with the same
        data dir, log file and token, and wait until it reports SERVING.

        Returns:
            Its address (``host:port``), the one it had.

        Raises:
            UnavailableError: it exited or did not listen in time.
            DeadlineExceededError: it did not report SERVING in time (then it is killed).
            InvalidArgumentError: its log file cannot be written.
            In each case :attr:`running` keeps an exited process for ``name``.
        """
        port = int(self.running[name].address.rsplit(":", 1)[1])
        svc = self._spawn(name, port)
        self.running[name] = svc
        try:
            wait_until_serving(svc.address, timeout_s=self.startup_timeout_s)
        except BaseException:
            svc.process.kill()  # listening but not serving: it would hold the port from the next try
            svc.process.wait()
            raise
        return svc.address

    def kill(self, name: str, grace_s: float) -> int:
        """Send SIGTERM to the running service ``name``, then SIGKILL when it has not exited after ``grace_s``
        seconds (a stopped or deadlocked process); returns its exit code (``-9`` after the SIGKILL)."""
        proc = self.running[name].process
        _end(proc, grace_s, resume=False)
        return proc.returncode

    @property
    def addresses(self) -> dict[str, str]:
        """Address per running service."""
        return {name: svc.address for name, svc in self.running.items()}

    def stop(self, timeout_s: float | None = None) -> dict[str, int]:
        """Send SIGTERM to every service (reverse start order; and SIGCONT, so a stopped one handles it), wait
        until they exit or ``timeout_s`` seconds have passed in all (None: :attr:`stop_grace_s`), then SIGKILL the
        stragglers.

        Returns:
            Exit code per service.
        """
        codes: dict[str, int] = {}
        deadline = time.monotonic() + (self.stop_grace_s if timeout_s is None else timeout_s)
        for name in reversed(list(self.running)):
            _terminate(self.running[name].process)
        for name in reversed(list(self.running)):
            proc = self.running[name].process
            try:  # one deadline for all: N hung services wait the grace once, not N times
                codes[name] = proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[name] = proc.wait()
        self.running.clear()
        return codes

    def __enter__(self) -> LocalStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def tls_refusal(services: tuple[str, ...]) -> str | None:
    """Why a stack of ``services`` cannot start: a ``MARTI_<SERVICE>_TLS_*`` variable that would make one of them
    serve TLS, which the stack's plaintext health checks cannot reach (it
    waited 60 s, then said ``not SERVING ... UNREACHABLE``); ``None`` when there is none."""
    for name in services:
        for key in ("TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_CLIENT_CA_FILE"):
            var = f"MARTI_{SERVICE_KEYS[name]}_{key}"
            if os.environ.get(var):
                return (
                    f"{var} is set: the {name} would serve TLS, and a local stack checks its services "
                    f"in plaintext; unset it, or start the services one by one (marti {name} --tls-cert-file ...)"
                )
    return None


def _end(proc: subprocess.Popen, timeout_s: float, *, resume: bool = True) -> None:
    """SIGTERM ``proc`` if it runs (once: a second SIGTERM makes a service exit at once), and SIGCONT it when
    ``resume`` (a stopped process handles the SIGTERM only once continued), wait ``timeout_s`` seconds, then
    SIGKILL it."""
    _terminate(proc, resume=resume)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _terminate(proc: subprocess.Popen, *, resume: bool = True) -> None:
    """SIGTERM ``proc`` if it runs, then SIGCONT it when ``resume``: a stopped (SIGSTOP) process handles the
    SIGTERM at once instead of keeping it pending until the SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        if resume:
            proc.send_signal(signal.SIGCONT)


def _last_line(path: Path) -> str:
    """The last non-blank line of a service's log (its one-line error when it failed to start), or ``""``."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def _next_line(fd: int, buffer: bytearray, deadline: float) -> bytes | None:
    """The next line of the pipe ``fd`` (with its newline), read through ``buffer``, which keeps the bytes read
    past it; ``b""`` at its end; ``None`` once ``deadline`` (``time.monotonic()``) passed without one (a
    ``readline()`` blocked for as long as the writer neither wrote nor exited)."""
    while b"\n" not in buffer:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:  # the end: what is left, then b""
            line = bytes(buffer)
            buffer.clear()
            return line
        buffer += chunk
    end = buffer.index(b"\n") + 1
    line = bytes(buffer[:end])
    del buffer[:end]
    return line


def _drain(proc: subprocess.Popen, log_path: Path | None, first: bytes = b"") -> None:
    """Copy ``first`` (read already) and a child's remaining stdout to its log (or discard it) so the pipe never
    fills."""
    assert proc.stdout is not None  # noqa: S101
    sink = open(log_path, "ab") if log_path else None  # noqa: SIM115
    try:
        for line in itertools.chain([first], proc.stdout):
            if sink:
                sink.write(line)
                sink.flush()
    finally:
        if sink:
            sink.close()
