"""The servers of ``marti bench scale``: each service in its own process (:mod:`benchmarks.server`), what
/proc says of its memory and CPU, and the server limits a run depends on."""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import server as bench_server
from benchmarks.server import cpu_s


class Server(bench_server.Server):
    """A service of the scale bench (:class:`benchmarks.server.Server`, started with ``--log-level WARNING``), with
    what /proc says of its memory.

    Args:
        service: The ``marti`` command of the service: ``env-server`` or ``broker``.
        flags: Extra command-line flags.

    Raises:
        UnavailableError: The service exited or did not listen in time (from :meth:`LocalStack.start`).
    """

    def __init__(self, service: str, flags: list[str]) -> None:
        super().__init__(service, ["--log-level", "WARNING", *flags])

    def rss_mb(self) -> float | None:
        """The server's resident set size now, MB (``VmRSS``); None where /proc is missing."""
        return status_kb(self.proc.pid, "VmRSS")

    def hwm_mb(self) -> float | None:
        """The server's peak resident set size so far, MB (``VmHWM``); None where /proc is missing."""
        return status_kb(self.proc.pid, "VmHWM")


def _machine_busy_s() -> float | None:
    """CPU seconds all processes of the machine have used so far (/proc/stat, not idle or iowait)."""
    try:
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


class CpuSampler:
    """Every second, until :meth:`stop`: the cores each named process used over that second, and the cores the
    whole machine used (other people's jobs included), from /proc.

    Args:
        pids: Name -> one pid or a list of pids (summed).
    """

    def __init__(self, pids: dict[str, int | list[int]]) -> None:
        self.pids = {k: v if isinstance(v, list) else [v] for k, v in pids.items()}
        self.series: dict[str, list[float | None]] = {k: [] for k in [*self.pids, "machine"]}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for k, pids in self.pids.items():
            got = [cpu_s(p) for p in pids]
            out[k] = None if any(x is None for x in got) else sum(got)
        out["machine"] = _machine_busy_s()
        return out

    def _run(self) -> None:
        prev, t_prev = self._read(), time.perf_counter()
        while not self._stop.wait(1.0):
            cur, t = self._read(), time.perf_counter()
            for k, v in cur.items():
                d = None if v is None or prev[k] is None else (v - prev[k]) / (t - t_prev)
                self.series[k].append(None if d is None else round(d, 2))
            prev, t_prev = cur, t

    def stop(self) -> dict[str, list[float | None]]:
        """Stops sampling; returns the cores used per second, per name."""
        self._stop.set()
        self._thread.join()
        return self.series


def status_kb(pid: int, key: str) -> float | None:
    """One ``kB`` line of /proc/PID/status, in MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass
class Limit:
    """One server limit the run depends on.

    Attributes:
        service: ``env_server`` or ``comm_broker``.
        name: Settings field (its flag is ``--`` + the name with dashes).
        default: The value the server would use (default or ``MARTI_*`` variable).
        needed: The least value the run needs.
        value: The value the bench passes (None: left alone).
    """

    service: str
    name: str
    default: int
    needed: int
    value: int | None = None

    @property
    def flag(self) -> list[str]:
        """The command-line flag and value to pass, or nothing."""
        return [] if self.value is None else ["--" + self.name.replace("_", "-"), str(self.value)]


def plan_limits(
    sessions: int, agents: int, broker_sessions: int, messages: int, at_limit: bool
) -> list[Limit]:
    """The limits that bound this run, with the value to pass where the default is too low (or, with
    ``at_limit``, the exact value for the session and agent caps)."""
    from services.comm_broker.settings import BrokerSettings
    from services.env_server.settings import EnvServerSettings

    env, broker = EnvServerSettings(), BrokerSettings()
    per_session = math.ceil(agents / broker_sessions)
    limits = [
        Limit("env_server", "max_sessions", env.max_sessions, sessions),
        Limit("env_server", "max_batch_steps", env.max_batch_steps, sessions),
        Limit("comm_broker", "max_sessions", broker.max_sessions, broker_sessions),
        Limit("comm_broker", "max_agents_per_session", broker.max_agents_per_session, per_session),
        Limit("comm_broker", "max_mailbox_messages", broker.max_mailbox_messages, messages),
        Limit("comm_broker", "max_unacked_per_agent", broker.max_unacked_per_agent, messages),
    ]
    exact = {("env_server", "max_sessions"), ("comm_broker", "max_agents_per_session")}
    for lim in limits:
        if at_limit and (lim.service, lim.name) in exact:
            lim.value = lim.needed
        elif lim.default < lim.needed:
            lim.value = lim.needed
    return limits
