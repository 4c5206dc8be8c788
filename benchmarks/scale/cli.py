"""The command line of ``marti bench scale``: its flags, the run of every phase, the checks and ``--json``."""

from __future__ import annotations

import asyncio
import importlib
import os

from benchmarks.report import bench_parser, check_json_path, positive_float, positive_int, write_json
from benchmarks.scale.broker_burst import bench_broker, ring
from benchmarks.scale.env_burst import bench_env
from benchmarks.scale.paced import bench_idle_and_paced
from benchmarks.scale.servers import Server, plan_limits
from benchmarks.scale.settings import FULL, QUICK
from benchmarks.scale.summary import broker_summary, env_summary
from benchmarks.scale.tables import burst_table, paced_and_memory_report


def main(argv: list[str] | None = None) -> int:
    """Runs the env_server and comm_broker scale runs and prints the table; returns 1 if a check failed."""
    p = bench_parser("scale", importlib.import_module("benchmarks.scale").__doc__)
    p.add_argument(
        "--sessions", type=positive_int, default=None, help="concurrent env sessions (default 1000)"
    )
    p.add_argument(
        "--agents", type=positive_int, default=None, help="concurrent broker agents (default 1000)"
    )
    p.add_argument(
        "--turns", type=positive_int, default=None, help="Step turns, then BatchStep turns (default 3)"
    )
    p.add_argument(
        "--env-rounds", type=positive_int, default=3, help="env create..close rounds (leak check; 3)"
    )
    p.add_argument(
        "--broker-sessions", type=positive_int, default=1, help="broker sessions the agents split into"
    )
    p.add_argument(
        "--messages", type=positive_int, default=None, help="messages each agent sends (default 10)"
    )
    p.add_argument(
        "--idle-timeout",
        type=positive_float,
        default=60.0,
        help="an agent waiting this long for nothing gives up, s",
    )
    p.add_argument("--at-limit", action="store_true", help="caps set to exactly N; probe one beyond")
    p.add_argument("--quick", action="store_true", help=f"small run for tests: {QUICK}")
    p.add_argument("--skip", choices=("env", "broker"), help="skip one of the two services")
    p.add_argument(
        "--paced-rate",
        type=positive_float,
        default=None,
        help="paced phase: calls/s per service, all client processes together (default 200; quick 40)",
    )
    p.add_argument(
        "--procs", type=positive_int, default=None, help="paced phase: client processes (default 4)"
    )
    p.add_argument(
        "--paced-seconds", type=positive_float, default=None, help="paced phase: seconds (default 20)"
    )
    p.add_argument(
        "--no-paced", action="store_true", help="skip the paced phase (idle memory still measured)"
    )
    p.add_argument("--no-burst", action="store_true", help="skip the burst phases (create..close, ring)")
    p.add_argument("--json", metavar="PATH", help="also write every number to PATH as JSON")
    args = p.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for k, v in defaults.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.procs > min(args.sessions, args.agents):
        p.error(
            f"--procs {args.procs} must not exceed --sessions ({args.sessions}) or --agents ({args.agents}): "
            "every process owns a slice"
        )
    if args.broker_sessions > args.agents:
        p.error(f"--broker-sessions {args.broker_sessions} must not exceed --agents ({args.agents})")
    check_json_path(p, args.json)

    limits = plan_limits(args.sessions, args.agents, args.broker_sessions, args.messages, args.at_limit)
    load_before = os.getloadavg()
    print(
        f"sessions: {args.sessions}; agents: {args.agents} in {args.broker_sessions} broker session(s); "
        f"turns: {args.turns}+{args.turns}; messages per agent: {args.messages}; cpus: {os.cpu_count()}"
    )
    print("load average before: " + " ".join(f"{x:.2f}" for x in load_before))
    for lim in limits:
        if lim.value is None:
            print(f"limit {lim.service} {lim.name}={lim.default} (needed {lim.needed}): left alone")
        else:
            why = "exactly N (--at-limit)" if args.at_limit and lim.value == lim.needed else "raised"
            print(f"limit {lim.service} {lim.name}={lim.default} -> {' '.join(lim.flag)} ({why})")
    flags = {
        svc: [x for lim in limits if lim.service == svc for x in lim.flag]
        for svc in ("env_server", "comm_broker")
    }

    env_result = broker_result = None
    servers_alive = {}
    if args.skip != "env" and not args.no_burst:
        print(f"env_server: {args.sessions} sessions x {args.env_rounds} round(s) ...", flush=True)
        server = Server("env-server", flags["env_server"])
        try:
            env_result = asyncio.run(
                bench_env(server, args.sessions, args.turns, args.env_rounds, args.at_limit)
            )
            servers_alive["env_server"] = server.alive()
        finally:
            code = server.stop()
        if not servers_alive.get("env_server"):
            print(f"env_server died (exit {code}); last output:\n" + "\n".join(server.tail))
    if args.skip != "broker" and not args.no_burst:
        print(f"comm_broker: {args.agents} agents x {args.messages} messages ...", flush=True)
        server = Server("broker", flags["comm_broker"])
        try:
            broker_result = asyncio.run(
                bench_broker(
                    server, args.agents, args.broker_sessions, args.messages, args.idle_timeout, args.at_limit
                )
            )
            servers_alive["comm_broker"] = server.alive()
        finally:
            code = server.stop()
        if not servers_alive.get("comm_broker"):
            print(f"comm_broker died (exit {code}); last output:\n" + "\n".join(server.tail))
    paced = (
        None
        if args.no_paced
        else {"rate": args.paced_rate, "procs": args.procs, "seconds": args.paced_seconds}
    )
    print(
        f"idle memory{'' if paced is None else ' and paced load'} on fresh servers: {args.sessions} sessions, "
        f"{args.agents} mailboxes"
        + ("" if paced is None else f"; {args.paced_rate:g} calls/s per service from {args.procs} processes "
           f"for {args.paced_seconds:g} s")
        + " ...",
        flush=True,
    )  # fmt: skip
    idle_paced = bench_idle_and_paced(
        flags, args.sessions, ring(args.agents, args.broker_sessions), args.skip, paced, args.settle
    )
    for k, alive in idle_paced["servers_alive"].items():
        servers_alive[f"{'env_server' if k == 'env' else 'comm_broker'} (idle, paced)"] = alive
    load_after = os.getloadavg()

    rows: dict[str, dict] = {}
    if env_result:
        for key, ph in env_result["rounds"][0]["phases"].items():
            rows[f"env.{key}"] = (ph.name, ph.summary())
    if broker_result:
        for key, ph in broker_result["phases"].items():
            s = ph.summary()
            if key == "exchange":
                s["ok"] = broker_result["agents_ok"]
            rows[f"broker.{key}"] = (ph.name, s)
    print()
    if rows:
        print(burst_table(rows))
        print()

    failed: list[str] = []
    if env_result:
        failed += env_summary(env_result, args)
    if broker_result:
        failed += broker_summary(broker_result, args)
    print()
    targets = paced_and_memory_report(idle_paced, args)
    for key, idle in idle_paced["idle"].items():
        if idle["errors"] or idle["ok"] != idle["n"]:
            failed.append(f"{key} idle phase: {idle['ok']}/{idle['n']} set up, errors {idle['errors']}")
    pc = idle_paced["paced"]
    if pc is not None:
        failed.extend(f"paced: {x}" for x in pc["worker_failures"])
        for key in ("env", "broker"):
            if key in pc and (pc[key]["errors"] or pc[key]["ok"] != pc[key]["scheduled"]):
                failed.append(
                    f"paced {key}: {pc[key]['ok']}/{pc[key]['scheduled']} calls ok, errors {pc[key]['errors_by_type']}"
                )
    for svc, alive in servers_alive.items():
        if not alive:
            failed.append(f"{svc} died")
    print("checks failed: " + ("; ".join(failed) if failed else "none"))
    print("load average after: " + " ".join(f"{x:.2f}" for x in load_after))

    if args.json:
        out = {
            "benchmark": "scale",
            "args": vars(args),
            "cpus": os.cpu_count(),
            "limits": [vars(lim) for lim in limits],
            "rows": {k: dict(s, name=name) for k, (name, s) in rows.items()},
            "env_server": None,
            "comm_broker": None,
            "idle_memory": idle_paced["idle"],
            "paced": idle_paced["paced"],
            "paced_server_cpu": idle_paced["server_cpu"],
            "loadavg_paced_start": idle_paced.get("loadavg_paced_start"),
            "paced_cores_by_second": idle_paced.get("cores_by_second"),
            "targets": targets,
            "servers_alive": servers_alive,
            "checks_failed": failed,
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in load_after],
        }
        if env_result:
            out["env_server"] = {
                "rss_before_mb": env_result["rss_before_mb"],
                "leak_check": env_result["leak_check"],
                "rounds": [
                    {k: v for k, v in rd.items() if k != "phases"}
                    | {"phases": {k: ph.summary() for k, ph in rd["phases"].items()}}
                    for rd in env_result["rounds"]
                ],
            }
        if broker_result:
            out["comm_broker"] = {k: v for k, v in broker_result.items() if k != "phases"} | {
                "phases": {k: rows[f"broker.{k}"][1] for k in broker_result["phases"]}
            }
        write_json(args.json, out)
        print(f"wrote {args.json}")
    return 1 if failed else 0
