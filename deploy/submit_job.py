"""Submit a training config to a running trainer service and wait for the job to end.

Used by ``deploy/bring_up.sh`` to prove the containerised stack trains end to end (a tiny job on the Ray head
inside the trainer container), and usable against any deployment::

    python deploy/submit_job.py 127.0.0.1:50054 examples/tiny.yaml --set ray.address=auto --timeout-s 600

``--unset KEY`` drops a key the file sets before the text is sent (as ``marti train --unset``), e.g. ``--set
policy.mode=per_agent --unset policy.lora_r --unset policy.lora_alpha`` on a LoRA config.

Exit code 0 iff the job ends SUCCEEDED; the job's final state, step count, run directory (inside the trainer
container) and last metrics record are printed. A marti error (a job the trainer refuses: a bad config, user
code, a run folder that holds a run; a trainer that cannot be reached; a job that does not end within
``--timeout-s``) is one line on stderr naming it, exit code 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

from marti.clients.trainer import JobInfo, MetricsRecord, TrainerClient
from marti.config import raw_config_from_text, unset_keys
from marti.errors import DeadlineExceededError, MartiError
from marti.rpc.client.channel import DEFAULT_TIMEOUT_S


def without_keys(text: str, keys: list[str], overrides: list[str], source: str) -> str:
    """The config ``text`` (YAML) less the dotted ``keys`` (``--unset``), as YAML text; ``text`` itself when
    ``keys`` is empty.

    Raises:
        InvalidArgumentError: ``text`` is not YAML, or a key is unknown, not set by ``text``, or set by one of
            ``overrides`` too (:func:`marti.config.unset_keys`).
    """
    if not keys:
        return text
    return yaml.safe_dump(unset_keys(raw_config_from_text(text, source), keys, overrides), sort_keys=False)


def submit_and_wait(
    address: str,
    config_yaml: str,
    overrides: list[str],
    *,
    timeout_s: float,
    poll_s: float = 2.0,
    token: str | None = None,
) -> tuple[JobInfo, list[MetricsRecord]]:
    """Submit a job, wait until it reaches a terminal state, and collect its metrics records.

    Args:
        address: Trainer service ``host:port``.
        config_yaml: The training config as YAML text.
        overrides: Dotted ``key=value`` overrides (``ray.address=auto`` to use the container's Ray head).
        timeout_s: Longest wait for the job to end, seconds (must be > 0).
        poll_s: Interval between GetJob polls, seconds.
        token: Bearer token of the trainer service; ``None`` reads ``MARTI_TRAINER_TOKEN``, then ``MARTI_TOKEN``.

    Returns:
        ``(job, records)``: the job's final :class:`JobInfo` and every :class:`MetricsRecord` it streamed.

    Raises:
        InvalidArgumentError: the trainer rejected the config (the message names the bad key).
        DeadlineExceededError: the job did not end within ``timeout_s`` (it is asked to stop first).
        MartiError: any other error of the trainer service, mapped from its status code.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    with TrainerClient(address, token=token, timeout_s=DEFAULT_TIMEOUT_S) as client:
        job = client.submit_job(config_yaml, overrides)
        print(f"submitted job {job.job_id} ({job.training_name}, {job.max_steps} steps)", flush=True)
        deadline = time.monotonic() + timeout_s
        last_step = -1
        while not job.done:
            if time.monotonic() > deadline:
                client.stop_job(job.job_id)
                raise DeadlineExceededError(f"job {job.job_id} did not end within timeout_s={timeout_s}")
            time.sleep(poll_s)
            job = client.get_job(job.job_id)
            if job.step != last_step:
                last_step = job.step
                print(f"  {job.state} step {job.step}/{job.max_steps}", flush=True)
        return job, list(client.stream_metrics(job.job_id))


def main(argv: list[str] | None = None) -> int:
    """Command line: ``submit_job.py ADDRESS CONFIG [--set k=v ...] [--unset k ...] [--timeout-s S]``; returns the
    exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="trainer host:port")
    parser.add_argument("config", type=Path, help="training config YAML")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="dotted key=value")
    parser.add_argument(
        "--unset", action="append", default=[], metavar="KEY", help="drop a dotted key the config file sets"
    )
    parser.add_argument("--timeout-s", type=float, default=900.0, help="longest wait for the job, seconds")
    parser.add_argument(
        "--token", default=None, help="bearer token (default: MARTI_TRAINER_TOKEN, MARTI_TOKEN)"
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        text = args.config.read_text()
    except (OSError, UnicodeDecodeError) as exc:  # a mistyped path: one line, not a traceback
        why = getattr(exc, "strerror", None) or exc
        print(f"submit_job.py: error: cannot read the config {str(args.config)!r}: {why}", file=sys.stderr)
        return 2
    try:
        text = without_keys(text, args.unset, args.overrides, str(args.config))
        job, records = submit_and_wait(
            args.address, text, args.overrides, timeout_s=args.timeout_s, token=args.token
        )
    except MartiError as exc:  # a refused job: one line, as marti's own commands print it
        print(f"submit_job.py: error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2
    print(
        f"job {job.job_id}: {job.state} after {time.monotonic() - started:.1f}s, step {job.step}/{job.max_steps}"
    )
    print(f"run_dir (in the trainer container): {job.run_dir}; last checkpoint: {job.last_checkpoint or '-'}")
    if job.error:
        print(f"error: {job.error}")
    if records:
        last = records[-1]
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(last.values.items())[:12])
        print(f"{len(records)} metrics records; last ({last.kind}, step {last.step}): {shown}")
    return 0 if job.state == "SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main())
