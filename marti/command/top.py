"""``marti top ADDR...``: a live view of running marti services.

For every address it asks the standard health service, lists the hosted services by server reflection, and
then reads what each service exposes:

- comm_broker (``BrokerService.GetStats``): sessions, agents, queue depths (pending, in flight), message
  throughput (sent/s, delivered/s between two polls), compression, latencies, dead letters;
- experience_store (``ExperienceService.ListTables``): per table size, bytes, insert and sample rates, calls
  waiting on the rate limiter (queue depths), evictions;
- env_server (``EnvService.ListEnvs``): the registered environments, the live sessions (unary and stream
  ones) and the session cap;
- trainer (``TrainerService.ListJobs`` and ``StreamMetrics``): per job state, step / max_steps, steps/s, and
  the newest training record per agent (reward, losses, throughput) and per watched process (``system/...``,
  from the trainer's resource monitor).

It refreshes in place with ``rich.live``; ``--once`` prints one frame and exits (0 iff every address reports
SERVING). A table too wide for the terminal is split into stacked tables of the same rows (the key column
repeated), so headers stay whole at 80 columns. See docs/operations_monitoring.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from marti.clients.broker import whole_broker_stats
from marti.clients.env import EnvClient
from marti.clients.experience import ExperienceSharingClient
from marti.clients.trainer import TrainerClient
from marti.errors import DeadlineExceededError, MartiError
from marti.rpc.client.channel import make_channel
from marti.rpc.errors import status_code_for

__all__ = ["KINDS", "ServicePoller", "Snapshot", "build_parser", "main", "render"]

KINDS = {
    "marti.api.broker.v1.BrokerService": "broker",
    "marti.api.env.v1.EnvService": "env",
    "marti.api.experience.v1.ExperienceService": "store",
    "marti.api.trainer.v1.TrainerService": "trainer",
}
"""Full service name -> the short kind ``marti top`` shows."""

#: Per-agent metric suffixes shown first, in this order (others follow alphabetically up to MAX_AGENT_COLUMNS).
AGENT_COLUMNS = ("reward", "policy_loss", "kl", "entropy", "tokens_per_s", "version_lag")
MAX_AGENT_COLUMNS = 6
#: Prefixes of training metrics that are not agents.
NON_AGENT_PREFIXES = ("team", "time", "system", "eval", "task", "alloc")
_BROKER_FIELDS = (
    "sent",
    "enqueued",
    "delivered",
    "redelivered",
    "acked",
    "expired",
    "dead_lettered",
    "duplicates",
    "rejected",
    "compression_ratio",
    "avg_send_latency_s",
    "avg_delivery_latency_s",
    "sessions",
    "agents",
    "pending",
    "in_flight",
)


@dataclass
class JobView:
    """One trainer job as ``marti top`` shows it (``metrics`` is its newest ``train`` record, or empty)."""

    job_id: str
    name: str
    state: str
    step: int
    max_steps: int
    error: str = ""
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Snapshot:
    """What one poll of one address found.

    Attributes:
        address: ``host:port``.
        time_s: ``time.monotonic()`` of the poll, seconds (rates divide counter deltas by its differences).
        health: ``SERVING``, ``NOT_SERVING``, ... or ``UNREACHABLE: CODE``.
        kinds: Short kinds of the marti services found by reflection (``broker``, ``env``, ``store``,
            ``trainer``), in that order.
        broker: ``BrokerStats`` fields by name (whole broker), when a broker is hosted.
        envs: Registered env ids, when an env server is hosted.
        env_sessions: ``(live sessions, max_sessions)`` of the env server; ``None`` when it does not report
            them (a server older than ``ListEnvsResponse.live_sessions``).
        tables: ``TableInfo`` fields by name, one dict per table, when a store is hosted.
        jobs: Trainer jobs, newest first, when a trainer is hosted.
        problems: One line per call that failed (the rest of the snapshot is still shown).
    """

    address: str
    time_s: float
    health: str = "UNKNOWN"
    kinds: list[str] = field(default_factory=list)
    broker: dict[str, float] | None = None
    envs: list[str] | None = None
    env_sessions: tuple[int, int] | None = None
    tables: list[dict[str, Any]] | None = None
    jobs: list[JobView] | None = None
    problems: list[str] = field(default_factory=list)


class ServicePoller:
    """Polls one address: health, reflection and each hosted service's statistics rpcs.

    Args:
        address: ``host:port``.
        token: Bearer token (reflection and the stats rpcs need it where the server asks for one).
        tls_ca_file: PEM CA for TLS servers.
        timeout_s: Deadline of each call, seconds.
        max_jobs: Most trainer jobs shown (newest first); metrics are read for these only.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        tls_ca_file: str | None = None,
        timeout_s: float = 2.0,
        max_jobs: int = 5,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.max_jobs = max_jobs
        self._channel = make_channel(address, token=token, tls_ca_file=tls_ca_file)
        # the typed SDK clients, all on the one channel (none of them dials or closes it)
        self._trainer = TrainerClient(address, timeout_s=timeout_s, channel=self._channel)
        self._env = EnvClient(address, timeout_s=timeout_s, channel=self._channel, deltas=False)
        self._store = ExperienceSharingClient(
            "marti-top", address, timeout_s=timeout_s, channel=self._channel
        )
        self._services: list[str] = []
        self._job_metrics: dict[str, tuple[int, dict[str, float]]] = {}

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def _list_services(self) -> list[str]:
        stub = reflection_pb2_grpc.ServerReflectionStub(self._channel)
        req = reflection_pb2.ServerReflectionRequest(list_services="")
        call = stub.ServerReflectionInfo(iter([req]), timeout=self.timeout_s)
        try:
            resp = next(iter(call))
        finally:
            call.cancel()
        return [s.name for s in resp.list_services_response.service]

    def poll(self) -> Snapshot:
        """One snapshot; failures are recorded in ``Snapshot.problems`` (and ``health``), never raised."""
        snap = Snapshot(self.address, time.monotonic())
        try:
            resp = health_pb2_grpc.HealthStub(self._channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=self.timeout_s
            )
            snap.health = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
        except grpc.RpcError as err:
            snap.health = f"UNREACHABLE: {err.code().name}"
            self._services = []  # a restarted server may host other services: ask reflection again
            return snap
        if not self._services:
            try:
                self._services = self._list_services()
            except grpc.RpcError as err:
                snap.problems.append(f"reflection: {err.code().name}: {err.details()}")
                return snap
        snap.kinds = [k for name, k in KINDS.items() if name in self._services]
        for kind in snap.kinds:
            try:
                getattr(self, f"_poll_{kind}")(snap)
            except grpc.RpcError as err:
                snap.problems.append(f"{kind}: {err.code().name}: {err.details()}")
            except MartiError as err:  # from the SDK clients: same report as a raw stub's status
                snap.problems.append(f"{kind}: {status_code_for(err).name}: {err.message}")
            except Exception as exc:  # noqa: BLE001 - one odd answer must not end the live view
                snap.problems.append(f"{kind}: {type(exc).__name__}: {exc}")
        return snap

    def _poll_broker(self, snap: Snapshot) -> None:
        stats = whole_broker_stats(self._channel, self.timeout_s)
        snap.broker = {name: float(getattr(stats, name)) for name in _BROKER_FIELDS}

    def _poll_env(self, snap: Snapshot) -> None:
        info = self._env.server_info()
        snap.envs = [e["env_id"] for e in info.envs]
        if info.live_sessions is not None and info.max_sessions is not None:
            snap.env_sessions = (info.live_sessions, info.max_sessions)

    def _poll_store(self, snap: Snapshot) -> None:
        keys = (
            "name",
            "size",
            "num_bytes",
            "inserts",
            "samples",
            "evictions",
            "waiting_inserts",
            "waiting_samples",
        )
        snap.tables = [{k: getattr(t, k) for k in keys} for t in self._store.list_tables()]

    def _poll_trainer(self, snap: Snapshot) -> None:
        jobs = self._trainer.list_jobs()[: self.max_jobs]
        snap.jobs = []
        for job in jobs:
            view = JobView(job.job_id, job.training_name, job.state, job.step, job.max_steps, job.error)
            if job.step > 0:
                view.metrics = self._latest_metrics(job.job_id, job.step)
            snap.jobs.append(view)

    def _latest_metrics(self, job_id: str, step: int) -> dict[str, float]:
        """The newest ``train`` record of a job at or after ``step`` (cached per job and step)."""
        cached = self._job_metrics.get(job_id)
        if cached is not None and cached[0] >= step:
            return cached[1]
        latest: tuple[int, dict[str, float]] | None = None
        records = self._trainer.stream_metrics(job_id, from_step=step, timeout_s=self.timeout_s)
        try:
            with closing(records):
                for rec in records:
                    if rec.kind == "train":
                        latest = (rec.step, dict(rec.values))
                        if rec.step >= step:
                            break
        except DeadlineExceededError:
            pass  # a running job has no newer record yet: keep what was read
        if latest is None:
            return cached[1] if cached else {}
        self._job_metrics[job_id] = latest
        return latest[1]


#: Width a cell's content may claim when columns are packed (longer text, e.g. a job error, wraps in its cell).
_MAX_CELL = 40


@dataclass
class FitTable:
    """A table that keeps its headers whole: rendered as one table when it fits the width it is given, else
    as several stacked tables of the same rows, each with the first ``keys`` columns and as many of the others
    as fit (rich alone would squeeze every header to a few letters at 80 columns).

    Attributes:
        title: Title of the first table.
        columns: ``(header, justify)`` per column.
        rows: The cells of each row, as text, one per column.
        keys: Leading columns repeated in every part (the row's name), 0 for none.
        caption: Caption under the last part.
    """

    title: str
    columns: list[tuple[str, str]]
    rows: list[list[str]]
    keys: int = 1
    caption: str | None = None

    def parts(self, width: int) -> list[list[int]]:
        """Column indices of each stacked table, for ``width`` terminal cells."""
        need = [
            min(_MAX_CELL, max([len(h)] + [len(r[i]) for r in self.rows])) + 3
            for i, (h, _) in enumerate(self.columns)
        ]
        base = sum(need[: self.keys]) + 1
        groups: list[list[int]] = []
        cur, used = list(range(self.keys)), base
        for i in range(self.keys, len(self.columns)):
            if len(cur) > self.keys and used + need[i] > width:
                groups.append(cur)
                cur, used = list(range(self.keys)), base
            cur.append(i)
            used += need[i]
        return [*groups, cur]

    def tables(self, width: int) -> list[Table]:
        """The stacked tables for ``width`` cells (one table when every column fits)."""
        groups = self.parts(width)
        out = []
        for n, cols in enumerate(groups):
            last = n == len(groups) - 1
            t = Table(
                title=self.title if n == 0 else None,
                title_justify="left",
                caption=self.caption if last else None,
            )
            for i in cols:
                t.add_column(self.columns[i][0], justify=self.columns[i][1], overflow="fold")
            for r in self.rows:
                t.add_row(*(r[i] for i in cols))
            out.append(t)
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """Render for the width rich offers here (inside a panel, its inner width)."""
        yield from self.tables(options.max_width)


def _rate(prev: Snapshot | None, cur: Snapshot, old: float | None, new: float | None) -> str:
    """Per-second rate of a counter between two polls, or ``-`` without a previous value."""
    if prev is None or old is None or new is None or cur.time_s <= prev.time_s:
        return "-"
    return f"{max(0.0, new - old) / (cur.time_s - prev.time_s):.1f}"


def _num(v: float) -> str:
    if float(v).is_integer() and abs(v) < 1e12:
        return f"{int(v):,}"
    return f"{v:.4g}"


def _broker_table(prev: Snapshot | None, cur: Snapshot) -> FitTable:
    b = cur.broker or {}
    pb = prev.broker if prev else None
    heads = ("sessions", "agents", "pending", "in flight", "sent/s", "delivered/s", "acked", "dead letters")
    heads += ("compression", "send ms", "delivery ms")
    row = [
        _num(b["sessions"]),
        _num(b["agents"]),
        _num(b["pending"]),
        _num(b["in_flight"]),
        _rate(prev, cur, pb and pb["sent"], b["sent"]),
        _rate(prev, cur, pb and pb["delivered"], b["delivered"]),
        _num(b["acked"]),
        _num(b["dead_lettered"]),
        f"{b['compression_ratio']:.2f}x",
        f"{b['avg_send_latency_s'] * 1e3:.2f}",
        f"{b['avg_delivery_latency_s'] * 1e3:.2f}",
    ]
    return FitTable("broker", [(h, "right") for h in heads], [row], keys=0)


def _store_table(prev: Snapshot | None, cur: Snapshot) -> FitTable:
    old = {t["name"]: t for t in (prev.tables or [])} if prev else {}
    heads = (
        "table",
        "size",
        "MiB",
        "inserts",
        "samples",
        "inserts/s",
        "samples/s",
        "waiting ins/smp",
        "evicted",
    )
    rows = []
    for row in cur.tables or []:
        o = old.get(row["name"])
        rows.append(
            [
                row["name"],
                _num(row["size"]),
                f"{row['num_bytes'] / 2**20:.2f}",
                _num(row["inserts"]),
                _num(row["samples"]),
                _rate(prev if o else None, cur, o and o["inserts"], row["inserts"]),
                _rate(prev if o else None, cur, o and o["samples"], row["samples"]),
                f"{row['waiting_inserts']}/{row['waiting_samples']}",
                _num(row["evictions"]),
            ]
        )
    return FitTable("store tables", [(h, "left" if h == "table" else "right") for h in heads], rows)


def _agents(metrics: dict[str, float]) -> list[str]:
    return sorted(
        {k.split("/")[0] for k in metrics if k.count("/") == 1 and k.endswith("/reward")}
        - set(NON_AGENT_PREFIXES)
    )


def _agent_table(job: JobView) -> FitTable | None:
    agents = _agents(job.metrics)
    if not agents:
        return None
    suffixes = {k.split("/", 1)[1] for k in job.metrics if k.split("/")[0] in agents and k.count("/") == 1}
    cols = [c for c in AGENT_COLUMNS if c in suffixes]
    cols += sorted(suffixes - set(cols))
    cols = cols[:MAX_AGENT_COLUMNS]
    rows = [
        [a, *(_num(job.metrics[f"{a}/{c}"]) if f"{a}/{c}" in job.metrics else "-" for c in cols)]
        for a in agents
    ]
    columns = [("agent", "left"), *((c, "right") for c in cols)]
    return FitTable(f"job {job.job_id} agents (step {job.step})", columns, rows)


def _system_table(job: JobView) -> FitTable | None:
    names = sorted({k.split("/")[1] for k in job.metrics if k.startswith("system/") and k.count("/") == 2})
    rows = [n for n in names if f"system/{n}/rss_mb" in job.metrics or f"system/{n}/alive" in job.metrics]
    if not rows:
        return None
    host = [
        f"{label} {job.metrics[key]:.0f}{unit}"
        for key, label, unit in (
            ("system/host/cpu_percent", "host cpu", "%"),
            ("system/host/mem_used_mb", "mem used", " MiB"),
            ("system/host/mem_available_mb", "available", " MiB"),
        )
        if key in job.metrics
    ]
    m = job.metrics

    def cell(n: str, key: str) -> str:
        v = m.get(f"system/{n}/{key}")
        return "-" if v is None else format(v, ".0f")

    cells = [
        [n + (" (exited)" if m.get(f"system/{n}/alive") == 0.0 else "")]
        + [cell(n, k) for k in ("cpu_percent", "rss_mb", "gpu_mb")]
        for n in rows
    ]
    columns = [("process", "left"), ("cpu %", "right"), ("rss MiB", "right"), ("gpu MiB", "right")]
    return FitTable(f"job {job.job_id} resources", columns, cells, caption="  ".join(host) or None)


def _trainer_parts(prev: Snapshot | None, cur: Snapshot) -> list[RenderableType]:
    if not cur.jobs:
        return [Text("trainer: no jobs", style="dim")]
    old = {j.job_id: j for j in (prev.jobs or [])} if prev else {}
    rows = []
    for j in cur.jobs or []:
        o = old.get(j.job_id)
        pct = f"{100.0 * j.step / j.max_steps:.0f}%" if j.max_steps else "-"
        rate = _rate(prev if o else None, cur, o and o.step, j.step)
        rows.append([j.job_id, j.name, j.state, f"{j.step}/{j.max_steps}", pct, rate, j.error[:60]])
    heads = ("job", "name", "state", "step", "progress", "steps/s", "error")
    if not any(r[-1] for r in rows):  # no job failed: no empty error column
        heads, rows = heads[:-1], [r[:-1] for r in rows]
    columns = [(h, "right" if h in ("step", "progress", "steps/s") else "left") for h in heads]
    parts: list[RenderableType] = [FitTable("trainer jobs", columns, rows)]
    shown = next((j for j in cur.jobs or [] if j.metrics), None)  # newest job with metrics
    if shown is not None:
        team = {k: v for k, v in shown.metrics.items() if k.startswith(("team/", "time/"))}
        if team:
            parts.append(Text("  ".join(f"{k}={_num(v)}" for k, v in sorted(team.items()))))
        parts += [p for p in (_agent_table(shown), _system_table(shown)) if p is not None]
    return parts


def render_one(prev: Snapshot | None, cur: Snapshot) -> Panel:
    """The panel of one address: health and kinds in the title, a table per hosted service."""
    style = "green" if cur.health == "SERVING" else "red"
    title = Text.assemble((cur.address, "bold"), "  ", (cur.health, style), "  ", " ".join(cur.kinds))
    parts: list[RenderableType] = []
    if cur.broker is not None:
        parts.append(_broker_table(prev, cur))
    if cur.envs is not None:
        shown = ", ".join(cur.envs[:8]) + (f" (+{len(cur.envs) - 8})" if len(cur.envs) > 8 else "")
        parts.append(Text(f"env server: {len(cur.envs)} envs: {shown}"))
        if cur.env_sessions is not None:
            parts.append(Text(f"live sessions: {cur.env_sessions[0]:,} of max {cur.env_sessions[1]:,}"))
        else:
            parts.append(Text("live sessions: not reported (env server older than this marti)", style="dim"))
    if cur.tables is not None:
        parts.append(_store_table(prev, cur))
    if cur.jobs is not None:
        parts += _trainer_parts(prev, cur)
    for p in cur.problems:
        parts.append(Text(p, style="yellow"))
    if not parts:
        parts.append(Text("no marti service found", style="dim"))
    return Panel(Group(*parts), title=title, title_align="left", border_style=style)


def render(prev: dict[str, Snapshot], cur: dict[str, Snapshot]) -> Group:
    """One frame: a panel per address, in the order given.

    Args:
        prev: The previous snapshot per address (rates need it; empty on the first frame).
        cur: The current snapshot per address.
    """
    stamp = Text(time.strftime("marti top  %H:%M:%S"), style="bold")
    return Group(stamp, *(render_one(prev.get(a), s) for a, s in cur.items()))


def _bounded(lo: float, hi: float, kind: type = float):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{text} outside [{lo}, {hi}]")
        return v

    return parse


def _address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"address {text!r} is not host:port with a port in 1..65535")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``marti top`` (every limit is checked, naming the bad value)."""
    p = argparse.ArgumentParser(prog="marti top", description="live view of marti services")
    p.add_argument("addresses", nargs="+", type=_address, metavar="ADDR", help="host:port of a service")
    p.add_argument("--once", action="store_true", help="print one frame and exit (0 iff all SERVING)")
    p.add_argument("--interval-s", type=_bounded(0.1, 3600.0), default=2.0, help="refresh period, seconds")
    p.add_argument(
        "--rate-window-s",
        type=_bounded(0.0, 60.0),
        default=1.0,
        help="with --once: seconds between the two polls that rates are computed from (0: no rates)",
    )
    p.add_argument("--iterations", type=_bounded(1, 10**9, int), default=None, help="stop after N frames")
    p.add_argument(
        "--timeout-s", type=_bounded(0.1, 60.0), default=2.0, help="deadline of each call, seconds"
    )
    p.add_argument(
        "--max-jobs", type=_bounded(1, 100, int), default=5, help="trainer jobs shown, newest first"
    )
    p.add_argument("--width", type=_bounded(40, 1000, int), default=None, help="columns (default: terminal)")
    p.add_argument("--token", default=os.environ.get("MARTI_TOKEN"), help="bearer token")
    p.add_argument("--tls-ca-file", default=None, help="PEM CA for TLS servers")
    return p


def _poll_all(pool: ThreadPoolExecutor, pollers: Sequence[ServicePoller]) -> dict[str, Snapshot]:
    return {p.address: s for p, s in zip(pollers, pool.map(lambda p: p.poll(), pollers), strict=True)}


def _follow(
    pool: ThreadPoolExecutor,
    pollers: list[ServicePoller],
    cur: dict[str, Snapshot],
    args: argparse.Namespace,
    show: Callable[[Any], None],
) -> dict[str, Snapshot]:
    """Poll every ``args.interval_s`` after the first frame (``cur``) and ``show`` each new frame, until
    ``args.iterations`` frames in all (None: until interrupted); returns the last poll."""
    frames = 1
    while args.iterations is None or frames < args.iterations:
        time.sleep(args.interval_s)
        prev, cur = cur, _poll_all(pool, pollers)
        show(render(prev, cur))
        frames += 1
    return cur


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``marti top``.

    Returns:
        With ``--once`` or ``--iterations``: 0 if every address reported SERVING in the last frame, else 1.
        Interrupted by Ctrl-C: 0.
    """
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    console = Console(width=args.width)
    pollers = [
        ServicePoller(
            a,
            token=args.token,
            tls_ca_file=args.tls_ca_file,
            timeout_s=args.timeout_s,
            max_jobs=args.max_jobs,
        )
        for a in args.addresses
    ]
    prev: dict[str, Snapshot] = {}
    cur: dict[str, Snapshot] = {}
    try:
        with ThreadPoolExecutor(max_workers=min(16, len(pollers))) as pool:
            if args.once:
                if args.rate_window_s > 0:
                    prev = _poll_all(pool, pollers)
                    time.sleep(args.rate_window_s)
                cur = _poll_all(pool, pollers)
                console.print(render(prev, cur))
            elif console.is_terminal:
                from rich.live import Live

                cur = _poll_all(pool, pollers)
                with Live(render({}, cur), console=console, refresh_per_second=4) as live:
                    cur = _follow(pool, pollers, cur, args, live.update)
            else:  # a file, a pipe, a container log: Live would show the last frame alone, at the end
                cur = _poll_all(pool, pollers)
                console.print(render({}, cur))
                cur = _follow(pool, pollers, cur, args, console.print)
    except KeyboardInterrupt:
        return 0
    finally:
        for p in pollers:
            p.close()
    return 0 if all(s.health == "SERVING" for s in cur.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
