"""The ``marti`` command: start services, run the stack, train, evaluate, check health, benchmark."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

#: Subcommands that are implemented by another module's ``main(argv)``: name -> (module, help).
#: Commands that start Ray's processes (fork, then exec) while gRPC threads are busy: gRPC's fork handlers hung or
#: aborted those children, so these commands turn them off (unless the variable is set) before importing gRPC. The
#: SDK leaves gRPC's fork support on for user programs (marti/__init__.py).
RAY_COMMANDS = ("trainer", "train", "eval")

DISPATCH = {
    "broker": ("services.comm_broker.__main__", "run the comm_broker service (default port 50051)"),
    "env-server": ("services.env_server.__main__", "run the env_server service (default port 50052)"),
    "store": ("services.experience_store.__main__", "run the experience_store service (default port 50053)"),
    "trainer": ("services.trainer.__main__", "run the trainer service (default port 50054)"),
    "train": ("services.trainer.job.cli.train_cli", "run a training job from a YAML config (the main job)"),
    "eval": (
        "services.trainer.job.cli.eval_cli",
        "evaluate a checkpoint and the base models on held-out seeds",
    ),
    "top": (
        "marti.command.top",
        "live view of services: health, throughput, queues, sessions, tables, job progress",
    ),
}


def _cmd_health(argv: list[str]) -> int:
    from marti.errors import InvalidArgumentError
    from marti.rpc.client.health import check_health

    parser = argparse.ArgumentParser(prog="marti health", description="exit 0 iff the server is SERVING")
    parser.add_argument("address", help="host:port")
    parser.add_argument("service", nargs="?", default="", help="service name ('' = whole server)")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="deadline of the check, seconds")
    parser.add_argument("--token", default=os.environ.get("MARTI_TOKEN"), help="bearer token")
    parser.add_argument("--tls-ca-file", default=None, help="PEM CA for TLS servers")
    args = parser.parse_args(argv)
    try:
        status = check_health(
            args.address,
            args.service,
            timeout_s=args.timeout_s,
            token=args.token,
            tls_ca_file=args.tls_ca_file,
        )
    except InvalidArgumentError as exc:  # e.g. an address without a port: one line, like a bad flag
        print(f"marti health: error: {exc}", file=sys.stderr)
        return 2
    print(status)
    return 0 if status == "SERVING" else 1


def _up_parser() -> argparse.ArgumentParser:
    """The flags of ``marti up``."""
    parser = argparse.ArgumentParser(prog="marti up", description="run broker, env server, store and trainer")
    parser.add_argument("--data-dir", default=os.environ.get("MARTI_DATA_DIR"), help="durable data root")
    parser.add_argument("--log-dir", default=None, help="write each service's log here")
    parser.add_argument(
        "--token", default=os.environ.get("MARTI_TOKEN"), help="bearer token for every service"
    )
    parser.add_argument("--no-trainer", action="store_true", help="start broker, env server and store only")
    parser.add_argument(
        "--ephemeral-ports",
        action="store_true",
        help="bind free ports instead of each service's MARTI_<SERVICE>_PORT or default (50051-50054)",
    )
    parser.add_argument(
        "--restart",
        default="on-failure",
        choices=("on-failure", "no"),
        help="restart a service that fails (non-zero exit or killed), or stop the stack (default: on-failure)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="most restarts of one service within the window (default: 5)",
    )
    parser.add_argument(
        "--restart-window-s",
        type=float,
        default=60.0,
        help="window the restarts are counted in (default: 60)",
    )
    parser.add_argument(
        "--restart-backoff-s",
        type=float,
        default=1.0,
        help="wait before a restart, doubled per restart in the window up to 30 s (default: 1)",
    )
    parser.add_argument(
        "--health-interval-s",
        type=float,
        default=10.0,
        help="seconds between the end of one health check of a service and the next (default: 10)",
    )
    parser.add_argument(
        "--health-timeout-s",
        type=float,
        default=5.0,
        help="seconds a health check may take before it counts as failed (default: 5)",
    )
    parser.add_argument(
        "--health-failures",
        type=int,
        default=3,
        help="health checks failed in a row that make a service hung: killed and restarted as a failure "
        "(default: 3)",
    )
    parser.add_argument(
        "--health-kill-grace-s",
        type=float,
        default=5.0,
        help="seconds a hung service gets to exit after SIGTERM before SIGKILL (default: 5)",
    )
    parser.add_argument(
        "--stop-grace-s",
        type=float,
        default=15.0,
        help="on shutdown (Ctrl-C, SIGTERM), seconds the services get, all together, to exit after SIGTERM "
        "before SIGKILL (default: 15)",
    )
    return parser


def _up_refusal(args: argparse.Namespace) -> str | None:
    """Why ``marti up`` must not start with these flags (an empty path or token), or ``None``."""
    for what, value, source in (
        ("data dir", args.data_dir, "--data-dir or MARTI_DATA_DIR"),
        ("log dir", args.log_dir, "--log-dir"),
    ):
        if value == "":  # say --data-dir "$DIR" with DIR empty: it ran every service in memory, silently
            return f"{what} '' is an empty path ({source}); leave it out or give a folder"
    if args.token == "":  # --token "$T" with T unset: every service ran without authentication, silently
        return (
            "token '' is empty (--token or MARTI_TOKEN): the services would require none; leave it unset for "
            "services without authentication, or give the token"
        )
    return None


def _cmd_up(argv: list[str]) -> int:
    from marti.command.liveness import HealthProbe
    from marti.command.restart_policy import RestartPolicy
    from marti.command.stack import LocalStack
    from marti.command.stop_signals import Interrupted, StopSignals
    from marti.command.supervise import supervise
    from marti.errors import InvalidArgumentError, MartiError

    parser = _up_parser()
    args = parser.parse_args(argv)
    try:
        policy = RestartPolicy(args.restart, args.max_restarts, args.restart_window_s, args.restart_backoff_s)
        probe = HealthProbe(
            args.health_interval_s,
            args.health_timeout_s,
            args.health_failures,
            kill_grace_s=args.health_kill_grace_s,
            token=args.token,
        )
    except InvalidArgumentError as exc:
        parser.error(str(exc))
    refusal = _up_refusal(args)
    if refusal:
        print(f"marti up: error: {refusal}", file=sys.stderr, flush=True)
        return 2
    services = ("broker", "env-server", "store") + (() if args.no_trainer else ("trainer",))
    ports = (
        {} if args.ephemeral_ports else {s: None for s in services}
    )  # None: MARTI_<SERVICE>_PORT or default
    try:
        stack = LocalStack(
            services=services,
            ports=ports,
            data_dir=Path(args.data_dir) if args.data_dir else None,
            log_dir=Path(args.log_dir) if args.log_dir else None,
            token=args.token,
            stop_grace_s=args.stop_grace_s,
        )
    except InvalidArgumentError as exc:
        parser.error(str(exc))
    signals = StopSignals()
    signals.install()
    try:
        with (
            signals.interruptible()
        ):  # it went on starting every service (up to a minute each), then stopped them
            addresses = stack.start()
    except Interrupted as exc:  # start() stopped what it had started; stop() again if start() returned
        stack.stop()
        print(
            f"marti up: {exc} while starting; stopped the services started so far",
            file=sys.stderr,
            flush=True,
        )
        return 0
    except MartiError as exc:  # a service did not start (port in use, bad setting): one line, no traceback
        print(f"marti up: error: {exc}", file=sys.stderr, flush=True)
        return 2 if isinstance(exc, InvalidArgumentError) else 1  # 2: a bad --data-dir / --log-dir
    for name, address in addresses.items():
        print(f"{name:<11} SERVING at {address}", flush=True)
    print("all services SERVING; Ctrl-C stops them", flush=True)
    try:
        return supervise(
            stack,
            policy,
            signals.stopping,
            lambda line: print(line, file=sys.stderr, flush=True),
            probe=probe,
            interruptible=signals.interruptible,
        )
    finally:
        codes = stack.stop()
        if codes:
            print("stopped: " + ", ".join(f"{n}={c}" for n, c in codes.items()), flush=True)


def bench_names(root: Path) -> list[str]:
    """The benchmarks ``marti bench`` runs: the modules and packages of ``root`` (a ``benchmarks/`` folder; a
    package's docstring is its ``__init__.py``'s) whose docstring starts with ``marti bench NAME`` for their own
    name, sorted; ``[]`` when the folder is missing."""
    found = {p.stem: p for p in root.glob("*.py")} | {p.parent.name: p for p in root.glob("*/__init__.py")}
    names = []
    for name, path in found.items():
        with path.open(encoding="utf-8") as f:
            if f.readline().startswith(f'"""``marti bench {name}``'):
                names.append(name)
    return sorted(names)


def _cmd_bench(argv: list[str]) -> int:
    # add_help=False: `marti bench NAME --help` must reach the benchmark's own parser.
    parser = argparse.ArgumentParser(
        prog="marti bench", description="run a benchmark from benchmarks/", add_help=False
    )
    parser.add_argument("name", nargs="?", help="benchmark name (run `marti bench` to list them)")
    args, rest = parser.parse_known_args(argv)
    root = Path(__file__).resolve().parents[2]  # the folder holding the marti package
    names = bench_names(root / "benchmarks")
    listing = "benchmarks: " + (", ".join(names) or "none (no benchmarks/ folder beside the marti package)")
    asked = args.name == "list" or (args.name is None and rest[:1] in (["-h"], ["--help"]))
    if asked or args.name is None:
        print("usage: marti bench NAME [options]   (marti bench NAME --help for its options)\n" + listing)
        return 0 if asked else 2  # no name at all is a usage error
    if args.name not in names:
        print(f"unknown benchmark {args.name!r}; {listing}", file=sys.stderr)
        return 2
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(f"benchmarks.{args.name}")
    except ModuleNotFoundError as exc:
        print(
            f"benchmark {args.name!r} cannot start: it needs the module {exc.name!r} ({exc})", file=sys.stderr
        )
        return 2
    return _run_bench(args.name, module, rest)


def _run_bench(name: str, module: object, argv: list[str]) -> int:
    """Run benchmark ``name``'s ``main(argv)``; a :class:`~marti.errors.MartiError` it raises (a model that is not
    found, a bad argument, a service that did not start) is one line on stderr, no traceback: exit code 2 for
    bad input (InvalidArgumentError, NotFoundError), 1 otherwise."""
    from marti.errors import InvalidArgumentError, MartiError, NotFoundError

    try:
        return int(module.main(argv) or 0)  # type: ignore[attr-defined]
    except MartiError as exc:
        print(f"marti bench {name}: error: {exc}", file=sys.stderr, flush=True)
        return 2 if isinstance(exc, InvalidArgumentError | NotFoundError) else 1


LOCAL = {
    "health": (_cmd_health, "exit 0 iff ADDR reports SERVING (grpc.health.v1)"),
    "up": (_cmd_up, "start broker, env server, store and trainer as local processes"),
    "bench": (_cmd_bench, "run a benchmark and print its table"),
}


def _usage() -> str:
    lines = ["usage: marti COMMAND [ARGS...]", "", "commands:"]
    for name, (_, help_text) in {**LOCAL, **DISPATCH}.items():
        lines.append(f"  {name:<11} {help_text}")
    lines.append("")
    lines.append("Run `marti COMMAND --help` for a command's options.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``marti`` console script.

    Args:
        argv: Arguments after the program name; defaults to ``sys.argv[1:]``.

    Returns:
        The process exit code.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("--version", "version"):
        from marti import __version__

        print(f"marti-agent {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name in LOCAL:
        return LOCAL[name][0](rest)
    if name in DISPATCH:
        if name in RAY_COMMANDS:  # before the first gRPC import (see RAY_COMMANDS)
            os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
        module = importlib.import_module(DISPATCH[name][0])
        return int(module.main(rest) or 0)
    print(f"marti: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
