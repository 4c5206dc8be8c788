"""``marti train CONFIG.yaml [--set KEY=VALUE ...] [--broker ADDR --env ADDR --store ADDR] [launch flags]``.

With no addresses (and none in the config's ``services`` section) it starts the embedded stack (broker, env
server, store) as local processes, runs the job, and stops them. OpenRLHF-style launch flags
(``--actor_model A B C --micro_train_batch_size 4 ...``) are accepted too (see docs/config.md).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from marti.config import TrainConfig
from marti.errors import MartiError
from services.trainer.loop import Addresses


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``marti train``, with the launch flags listed for ``--help``.

    The OpenRLHF-style launch flags (:data:`marti.launch_flags.FLAG_TABLE`) are shown in one argument group per
    topic (:data:`marti.launch_flags.FLAG_GROUPS`), one line each; :func:`split_argv` hands them to
    :func:`marti.launch_flags.parse_launch_flags`, so this parser never parses them itself.
    """
    p = argparse.ArgumentParser(
        prog="marti train",
        usage="marti train [CONFIG.yaml] [--set KEY=VALUE ...] [--broker/--env/--store ADDR] [--token T] "
        "[--resume] [--no-progress] [launch flags]",
        description="run a multi-agent RL training job",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=44, width=160),
    )
    p.add_argument(
        "config", nargs="?", help="training config YAML (optional when launch flags give the team)"
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted override, e.g. --set algorithm.kl_coef=0.01 (repeatable)",
    )
    add_service_flags(p)
    p.add_argument("--resume", action="store_true", help="resume from the run's newest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _add_launch_flag_groups(p)
    return p


def _add_launch_flag_groups(p: argparse.ArgumentParser) -> None:
    """List every launch flag under its topic group (help only: the flags are parsed by marti.launch_flags)."""
    from marti.launch_flags import FLAG_GROUPS, flag_help

    for title, names in FLAG_GROUPS.items():
        group = p.add_argument_group(f"launch flags: {title}")
        for name in names:
            metavar, text = flag_help(name)
            if metavar:
                group.add_argument(f"--{name}", dest=f"_launch_{name}", metavar=metavar, help=text)
            else:
                group.add_argument(f"--{name}", dest=f"_launch_{name}", action="store_true", help=text)


@contextlib.contextmanager
def service_addresses(cfg: TrainConfig, args: argparse.Namespace) -> Iterator[Addresses]:
    """Addresses from flags, then the config's ``services`` section; services with neither are started
    locally (the embedded stack, data under ``<run_dir>/services``, logs under ``<run_dir>/logs``) and stopped
    on exit. ``services.tls_ca_file`` applies to the services whose address was given, not the embedded ones."""
    from marti.stack import LocalStack

    services = cfg.services
    token = args.token or services.token
    addrs = {
        "broker": args.broker or services.broker,
        "env": args.env or services.env,
        "store": args.store or services.store,
    }
    from marti.clients.env_addresses import is_env_pool

    is_env_pool(addrs["env"])  # several env servers: every entry host:port (InvalidArgumentError, named)
    missing = [k for k, v in addrs.items() if not v]
    stack = None
    if missing:
        names = {"broker": "broker", "env": "env-server", "store": "store"}
        data_dir = Path(services.data_dir) if services.data_dir else cfg.run_dir / "services"
        stack = LocalStack(
            services=tuple(names[k] for k in missing),
            data_dir=data_dir,
            log_dir=cfg.run_dir / "logs",
            token=token,
        )
        print(f"starting embedded {', '.join(names[k] for k in missing)} ...", flush=True)
        started = stack.start()
        for k in missing:
            addrs[k] = started[names[k]]
        print("services: " + ", ".join(f"{k}={v}" for k, v in addrs.items()), flush=True)
    try:
        yield Addresses(
            addrs["broker"],
            addrs["env"],
            addrs["store"],
            token,
            tls_ca_file=services.tls_ca_file,
            tls_services=frozenset(k for k in addrs if k not in missing),  # the embedded stack is plaintext
        )
    finally:
        if stack is not None:
            stack.stop()


def add_service_flags(p: argparse.ArgumentParser) -> None:
    """The ``--broker/--env/--store/--token`` flags shared by ``marti train`` and ``marti eval``."""
    p.add_argument("--broker", default=os.environ.get("MARTI_BROKER_ADDR"), help="comm_broker host:port")
    p.add_argument(
        "--env",
        default=os.environ.get("MARTI_ENV_ADDR"),
        help="env_server host:port; several: host:port,host:port or dns:///name:port (sessions spread over them)",
    )
    p.add_argument("--store", default=os.environ.get("MARTI_STORE_ADDR"), help="experience_store host:port")
    p.add_argument("--token", default=os.environ.get("MARTI_TOKEN"), help="bearer token for the services")


def _stop_on_signals(stop: threading.Event) -> None:
    """First SIGINT/SIGTERM: finish the current step, checkpoint, write the report and exit; second: at once
    (KeyboardInterrupt unwinds, so the embedded services and Ray are still stopped)."""

    def handler(signum: int, frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print("\nstopping after the current step (again to stop now)", file=sys.stderr, flush=True)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


#: ``marti train``'s own options that take a value, and its switches; every other ``--flag`` is a launch flag.
_OWN_WITH_VALUE = ("--set", "--broker", "--env", "--store", "--token")
_OWN_SWITCHES = ("--resume", "--no-progress", "-h", "--help")


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate ``marti train``'s own arguments from OpenRLHF-style launch flags.

    argparse alone cannot: ``parse_known_args`` hands the values of an unknown flag (``--actor_model A B``)
    to the positional CONFIG. A bare token belongs to the launch flag before it, else it is CONFIG.

    Returns:
        ``(own, launch)``: arguments for :func:`build_parser`, and launch-flag tokens in their order.
    """
    own: list[str] = []
    launch: list[str] = []
    current = own
    i = 0
    while i < len(argv):
        tok = argv[i]
        name = tok.split("=", 1)[0]
        if name in _OWN_WITH_VALUE:
            own.append(tok)
            if "=" not in tok and i + 1 < len(argv):
                own.append(argv[i + 1])
                i += 1
            current = own
        elif name in _OWN_SWITCHES:
            own.append(tok)
            current = own
        elif tok.startswith("--"):
            launch.append(tok)
            current = launch
        else:
            current.append(tok)
        i += 1
    return own, launch


def main(argv: list[str] | None = None) -> int:
    """Run ``marti train``; returns the exit code (0 success, 2 bad config or missing model, 1 failure)."""
    from marti.launch_flags import build_config
    from services.trainer.loop import TrainingLoop, latest_checkpoint
    from services.trainer.models import check_attn_implementation, resolve_model

    own, launch = split_argv(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(own)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg, warnings = build_config(args.config, args.overrides, launch)
        for w in warnings:
            print(f"note: {w}", file=sys.stderr)
        for agent in cfg.agents:
            for name in (agent.pretrain_model, agent.ref_model, agent.critic_model):
                if name is not None:
                    resolve_model(name)
        check_attn_implementation(cfg.policy.attn_implementation)
    except MartiError as exc:
        print(f"marti train: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    _stop_on_signals(stop)
    with service_addresses(cfg, args) as addresses:
        try:
            loop = TrainingLoop(
                cfg, addresses, stop_event=stop, resume=args.resume, show_progress=not args.no_progress
            )
            summary = loop.run()
        except MartiError as exc:
            print(f"marti train: {exc}", file=sys.stderr)
            return 2
        except FloatingPointError as exc:
            last = latest_checkpoint(cfg.run_dir)
            print(
                f"marti train: stopped: {exc}. The last good checkpoint is {last or '(none yet)'}; lower the "
                "learning rate or check the rewards, then resume with --resume.",
                file=sys.stderr,
            )
            return 1
    resumed = f" (resumed at step {summary.start_step})" if summary.start_step else ""
    print(f"done: {summary.steps} steps{resumed}; run directory {summary.run_dir}")
    if summary.epoch_limited:
        print(f"max_epochs={cfg.max_epochs} reached: {summary.epochs:g} passes over the training problems")
    print(f"report: {summary.report}")
    if cfg.rollout.source != "builtin":
        print(
            f"trained {summary.steps - summary.start_step} steps on {summary.external_episodes} external episodes"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
