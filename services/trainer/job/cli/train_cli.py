"""``marti train CONFIG.yaml [--set KEY=VALUE ...] [--unset KEY ...] [--broker ADDR --env ADDR --store ADDR] [launch flags]``.

With no addresses (and none in the config's ``services`` section) it starts the embedded stack (broker, env
server, store) as local processes, runs the job, and stops them. OpenRLHF-style launch flags
(``--actor_model A B C --micro_train_batch_size 4 ...``) are accepted too (see docs/config.md).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from marti.config import TrainConfig
from marti.errors import MartiError
from marti.rpc.serving.logs import LOG_FORMAT
from services.trainer.job.connections.addresses import Addresses, resolve_addresses, with_started


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``marti train``, with the launch flags listed for ``--help``.

    The OpenRLHF-style launch flags (:data:`marti.command.launch_flags.FLAG_TABLE`) are shown in one argument group per
    topic (:data:`marti.command.launch_flags.FLAG_GROUPS`), one line each; :func:`split_argv` hands them to
    :func:`marti.command.launch_flags.parse_launch_flags`, so this parser never parses them itself.
    """
    p = argparse.ArgumentParser(
        prog="marti train",
        usage="marti train [CONFIG.yaml] [--set KEY=VALUE ...] [--unset KEY ...] [--broker/--env/--store ADDR] "
        "[--token T] "
        "[--resume | --overwrite] [--no-progress] [launch flags]",
        description="run a multi-agent RL training job",
        formatter_class=lambda prog: argparse.HelpFormatter(prog, max_help_position=44, width=160),
    )
    p.add_argument(
        "config", nargs="?", help="training config YAML (optional when launch flags give the team)"
    )
    add_override_flags(p)
    add_service_flags(p)
    p.add_argument("--resume", action="store_true", help="resume from the run's newest checkpoint")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="delete the run already in the output folder and start a new one (without it such a folder is refused)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _add_launch_flag_groups(p)
    return p


def _add_launch_flag_groups(p: argparse.ArgumentParser) -> None:
    """List every launch flag under its topic group (help only: the flags are parsed by marti.command.launch_flags)."""
    from marti.command.launch_flags import FLAG_GROUPS, flag_help

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
    from marti.command.stack import LocalStack

    services = cfg.services
    addresses, missing = resolve_addresses(
        services, broker=args.broker, env=args.env, store=args.store, token=args.token
    )
    stack = None
    if missing:
        names = {"broker": "broker", "env": "env-server", "store": "store"}
        data_dir = Path(services.data_dir) if services.data_dir else cfg.run_dir / "services"
        stack = LocalStack(
            services=tuple(names[k] for k in missing),
            data_dir=data_dir,
            log_dir=cfg.run_dir / "logs",
            token=addresses.token,
        )
        print(f"starting embedded {', '.join(names[k] for k in missing)} ...", flush=True)
        started = stack.start()
        addresses = with_started(addresses, {k: started[names[k]] for k in missing})
        shown = {k: getattr(addresses, k) for k in ("broker", "env", "store")}
        print("services: " + ", ".join(f"{k}={v}" for k, v in shown.items()), flush=True)
    try:
        yield addresses
    finally:
        if stack is not None:
            stack.stop()


def add_override_flags(p: argparse.ArgumentParser) -> None:
    """The ``--set KEY=VALUE`` and ``--unset KEY`` flags shared by ``marti train`` and ``marti eval``."""
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted override, e.g. --set algorithm.kl_coef=0.01 (repeatable)",
    )
    p.add_argument(
        "--unset",
        dest="unset",
        action="append",
        default=[],
        metavar="KEY",
        help="drop a dotted key the config file sets, so it takes its default, e.g. --unset policy.lora_r with "
        "--set policy.mode=per_agent (repeatable; refused where the file does not set KEY or --set sets it too)",
    )


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


class StopNow(KeyboardInterrupt):
    """Raised in the main thread by a second SIGINT/SIGTERM: the job unwinds at once (Ray and the embedded
    services are still stopped); ``marti train`` then prints what was saved and exits ``128 + signal``.

    A :class:`KeyboardInterrupt`, so that code that checks for signals in C and handles a KeyboardInterrupt
    there unwinds as from Ctrl-C: inside ``ray.get`` Ray's signal check raises a plain KeyboardInterrupt for it
    (another exception raised there came out as a ``SystemError`` whose cause is that exception). What reaches
    :func:`main` may therefore be another exception than StopNow: :func:`main` tells the stop by the ``now``
    event that the handler sets before it raises, not by the exception's type.
    """


def _stop_on_signals(stop: threading.Event, teardown: threading.Event, now: threading.Event) -> list[int]:
    """First SIGINT/SIGTERM: finish the current step, checkpoint, write the report and exit; second: at once
    (``now`` is set and :class:`StopNow` unwinds; later signals are ignored so the teardown completes). Once
    ``teardown`` is set (the job is already stopping the gateway, its actors, Ray and the embedded services) a
    second signal only says so: interrupting that teardown half-way left Ray reconnecting to a stopped cluster
    for 60 s.

    Returns:
        The signals received, in order (filled in by the handler).
    """
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        received.append(signum)
        if stop.is_set():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if teardown.is_set():
                print("\nalready stopping: the services are being stopped", file=sys.stderr, flush=True)
                return
            now.set()
            raise StopNow
        stop.set()
        print(
            "\nstopping after the current step and saving a checkpoint (again to stop now)",
            file=sys.stderr,
            flush=True,
        )

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return received


#: ``marti train``'s own options that take a value, and its switches; every other ``--flag`` is a launch flag.
_OWN_WITH_VALUE = ("--set", "--unset", "--broker", "--env", "--store", "--token")
_OWN_SWITCHES = ("--resume", "--overwrite", "--no-progress", "-h", "--help")


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


def resume_command(argv: list[str]) -> str:
    """The ``marti train ...`` command line that resumes the job started with ``argv`` (its own arguments, with
    ``--resume`` instead of ``--overwrite``), shell-quoted."""
    args = [a for a in argv if a != "--overwrite"]
    if "--resume" not in args:
        args.append("--resume")
    return shlex.join(["marti", "train", *args])


def _check_given_services(cfg: TrainConfig, args: argparse.Namespace, data: Any = None) -> None:
    """Each service address given (flag or ``services`` section) serves its service
    (:func:`~services.trainer.job.connections.served.check_given_services`), a given store takes the job's
    tables (:func:`~services.trainer.job.run.prechecks.check_given_store_tables`) and a given env server holds
    the sessions the job opens at once (:func:`~services.trainer.job.run.env_sessions.check_given_env_sessions`,
    on the config sized to ``data``, a dataset job's rows), before the run folder."""
    from services.trainer.job.connections.addresses import SERVICES
    from services.trainer.job.connections.served import check_given_services
    from services.trainer.job.run.env_sessions import check_given_env_sessions
    from services.trainer.job.run.prechecks import check_given_store_tables, job_config

    addresses, missing = resolve_addresses(
        cfg.services, broker=args.broker, env=args.env, store=args.store, token=args.token
    )
    given = tuple(s for s in SERVICES if s not in missing)
    check_given_services(addresses, given, wait_s=cfg.services.reconnect_timeout_s)
    if "store" not in missing:
        check_given_store_tables(cfg, addresses)
    if "env" not in missing:
        check_given_env_sessions(job_config(cfg, data), addresses)


def _prepare_folder(cfg: TrainConfig, args: argparse.Namespace, data: Any = None) -> Any:
    """Lock ``cfg.run_dir`` and check it for this job (:class:`~services.trainer.job.run.run_dir.RunFolder`), before the
    embedded services write into it; a dataset job's ``cfg`` is checked sized to its rows (``data``, the
    :class:`~services.trainer.data.tasks.DatasetTasks` the pre-checks loaded: its last step). Raises what
    :meth:`RunFolder.lock` and :meth:`RunFolder.prepare` raise (the lock is released then)."""
    from services.trainer.job.run.prechecks import job_config
    from services.trainer.job.run.run_dir import RunFolder

    folder = RunFolder(cfg.run_dir)
    folder.lock()
    try:
        folder.prepare(job_config(cfg, data), resume=args.resume, overwrite=args.overwrite)
    except BaseException:
        folder.unlock()
        raise
    return folder


def _stopped_message(cfg: TrainConfig, argv: list[str], signum: int, at_once: bool, steps: int | None) -> str:
    """What an interrupted job prints: how it stopped, the checkpoint it left and the command that resumes it;
    without a checkpoint, the run directory (and ``--overwrite``, which starts again a folder that holds a run
    without one: :class:`~services.trainer.job.run.run_dir.RunFolder`)."""
    from services.trainer.job.run.run_dir import RunFolder, latest_checkpoint

    name = signal.Signals(signum).name
    how = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else name
    last = latest_checkpoint(cfg.run_dir)
    if at_once:
        head = f"stopped at once by a second {how}: the step in progress is lost"
    else:
        head = f"stopped by {how} after step {steps} of {cfg.total_steps}"
    if last is None:
        again = "; start it again with --overwrite" if RunFolder(cfg.run_dir).holds_a_run() else ""
        return f"{head}; no checkpoint was saved; run directory {cfg.run_dir}{again}"
    return f"{head}; checkpoint: {last}\nresume with: {resume_command(argv)}"


def main(argv: list[str] | None = None) -> int:
    """Run ``marti train``; returns the exit code: 0 done (or stopped by its budget: wall time, ``stop_after_steps``), 2 bad config,
    missing model or refused run folder, 1 failure, ``128 + signal`` (130 for Ctrl-C, 143 for SIGTERM) when a
    signal stopped the job before its last step (130 too for a Ctrl-C during the checks before the job starts:
    one line, nothing to resume)."""
    from marti.command.launch_flags import build_config
    from services.trainer.job.run.prechecks import check_before_the_run_folder
    from services.trainer.models.resolve import check_attn_implementation, resolve_model

    argv = list(sys.argv[1:] if argv is None else argv)
    own, launch = split_argv(argv)
    args = build_parser().parse_args(own)
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    try:
        cfg, warnings = build_config(args.config, args.overrides, launch, unset=args.unset)
        for w in warnings:
            print(f"note: {w}", file=sys.stderr)
        for agent in cfg.agents:
            for name in (agent.pretrain_model, agent.ref_model, agent.critic_model):
                if name is not None:
                    resolve_model(name)
        check_attn_implementation(cfg.policy.attn_implementation)
        data = check_before_the_run_folder(cfg, env=args.env)
        _check_given_services(cfg, args, data)
        folder = _prepare_folder(cfg, args, data)
    except MartiError as exc:
        print(f"marti train: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C during the checks: nothing was started, so nothing to resume
        print("\nmarti train: stopped by Ctrl-C (SIGINT) before the job started", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    stop, teardown, now = threading.Event(), threading.Event(), threading.Event()
    received = _stop_on_signals(stop, teardown, now)
    try:
        return _train(cfg, args, argv, folder, (stop, teardown), received, data)
    except BaseException:
        if not now.is_set():
            raise
        return _stopped_at_once(cfg, argv, received[0])  # whatever the unwind became on its way here
    finally:
        folder.unlock()


def _stopped_at_once(cfg: TrainConfig, argv: list[str], signum: int) -> int:
    """After a second signal unwound the job: write the report (once the job has its ``metrics.jsonl``), print
    what was saved and the resume command; returns ``128 + signum``."""
    from services.trainer.observe import write_report

    report = write_report(cfg.run_dir) if (cfg.run_dir / "metrics.jsonl").exists() else None
    print(_stopped_message(cfg, argv, signum, True, None), file=sys.stderr, flush=True)
    if report is not None:
        print(f"report: {report}", file=sys.stderr, flush=True)
    return 128 + signum


def _train(
    cfg: TrainConfig,
    args: argparse.Namespace,
    argv: list[str],
    folder: Any,
    events: tuple[threading.Event, threading.Event],
    received: list[int],
    data: Any = None,
) -> int:
    """Start the services, run the job in the prepared ``folder`` and print its outcome; returns the exit code.
    ``events`` are the job's stop and teardown events (:class:`~services.trainer.job.run.loop.TrainingLoop`); ``data``
    the dataset job's problems :func:`~services.trainer.job.run.prechecks.check_dataset_job` loaded (None: none)."""
    from services.trainer.job.run.loop import TrainingLoop, latest_checkpoint

    with service_addresses(cfg, args) as addresses:
        try:
            loop = TrainingLoop(
                cfg,
                addresses,
                stop_event=events[0],
                teardown_event=events[1],
                resume=args.resume,
                show_progress=not args.no_progress,
                run_folder=folder,
                data=data,
            )
            cfg = loop.cfg  # a dataset job's: its steps and seeds sized to the rows (DatasetTasks.fit)
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
    if received and summary.steps < cfg.total_steps:
        print(_stopped_message(cfg, argv, received[0], False, summary.steps), flush=True)
        print(f"report: {summary.report}", flush=True)
        return 128 + received[0]
    resumed = f" (resumed at step {summary.start_step})" if summary.start_step else ""
    print(f"done: {summary.steps} steps{resumed}; run directory {summary.run_dir}")
    if summary.epoch_limited:
        print(f"max_epochs={cfg.max_epochs} reached: {summary.epochs:g} passes over the training problems")
    print(f"report: {summary.report}")
    if summary.stopped and summary.steps < cfg.total_steps:  # budget.max_wall_time_s or stop_after_steps
        print(f"stopped by its budget after step {summary.steps} of {cfg.total_steps}; checkpoint: "
              f"{summary.last_checkpoint}\nresume with: {resume_command(argv)}")  # fmt: skip
    if cfg.rollout.source != "builtin":
        print(
            f"trained {summary.steps - summary.start_step} steps on {summary.external_episodes} external episodes"
            + untrained_note(summary.untrained_external)
        )
    return 0


def untrained_note(count: int) -> str:
    """The end of the final line about reported episodes no update took (``""`` when there are none)."""
    if not count:
        return ""
    return (
        f"; {count} reported episode{'s were' if count != 1 else ' was'} never trained (reported after the last "
        "update took its episodes, or lost as the gateway closed: see the warning above)"
    )


if __name__ == "__main__":
    sys.exit(main())
