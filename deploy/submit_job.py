"""Submit a training config to a running trainer service and wait for the job to end.

Used by ``deploy/bring_up.sh`` to prove the containerised stack trains end to end (a tiny job on the Ray head
inside the trainer container), and usable against any deployment::

    python deploy/submit_job.py 127.0.0.1:50054 examples/tiny.yaml --set ray.address=auto --timeout-s 600

Exit code 0 iff the job ends SUCCEEDED; the job's final state, step count, run directory (inside the trainer
container) and last metrics record are printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import grpc

from marti.api.trainer.v1 import trainer_pb2, trainer_service_pb2, trainer_service_pb2_grpc
from marti.errors import DeadlineExceededError
from marti.rpc.channel import DEFAULT_TIMEOUT_S, make_channel
from marti.rpc.errors import from_rpc_error

#: Job states after which a job never changes again.
TERMINAL_STATES = frozenset(
    {trainer_pb2.JOB_STATE_SUCCEEDED, trainer_pb2.JOB_STATE_FAILED, trainer_pb2.JOB_STATE_STOPPED}
)


def submit_and_wait(
    address: str,
    config_yaml: str,
    overrides: list[str],
    *,
    timeout_s: float,
    poll_s: float = 2.0,
    token: str | None = None,
) -> tuple[trainer_pb2.Job, list[trainer_pb2.MetricsRecord]]:
    """Submit a job, wait until it reaches a terminal state, and collect its metrics records.

    Args:
        address: Trainer service ``host:port``.
        config_yaml: The training config as YAML text.
        overrides: Dotted ``key=value`` overrides (``ray.address=auto`` to use the container's Ray head).
        timeout_s: Longest wait for the job to end, seconds (must be > 0).
        poll_s: Interval between GetJob polls, seconds.
        token: Bearer token of the trainer service, if it requires one.

    Returns:
        ``(job, records)``: the final ``Job`` message and every ``MetricsRecord`` it streamed.

    Raises:
        InvalidArgumentError: the trainer rejected the config (the message names the bad key).
        DeadlineExceededError: the job did not end within ``timeout_s`` (it is asked to stop first).
        MartiError: any other error of the trainer service, mapped from its status code.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    channel = make_channel(address, token=token)
    stub = trainer_service_pb2_grpc.TrainerServiceStub(channel)
    try:
        job = stub.SubmitJob(
            trainer_service_pb2.SubmitJobRequest(config_yaml=config_yaml, overrides=overrides),
            timeout=DEFAULT_TIMEOUT_S,
        ).job
        print(f"submitted job {job.job_id} ({job.training_name}, {job.max_steps} steps)", flush=True)
        deadline = time.monotonic() + timeout_s
        last_step = -1
        while job.state not in TERMINAL_STATES:
            if time.monotonic() > deadline:
                stub.StopJob(trainer_service_pb2.StopJobRequest(job_id=job.job_id), timeout=DEFAULT_TIMEOUT_S)
                raise DeadlineExceededError(f"job {job.job_id} did not end within timeout_s={timeout_s}")
            time.sleep(poll_s)
            job = stub.GetJob(
                trainer_service_pb2.GetJobRequest(job_id=job.job_id), timeout=DEFAULT_TIMEOUT_S
            ).job
            if job.step != last_step:
                last_step = job.step
                state = trainer_pb2.JobState.Name(job.state)
                print(f"  {state} step {job.step}/{job.max_steps}", flush=True)
        stream = stub.StreamMetrics(
            trainer_service_pb2.StreamMetricsRequest(job_id=job.job_id), timeout=DEFAULT_TIMEOUT_S
        )
        records = [resp.record for resp in stream]
        return job, records
    except grpc.RpcError as err:
        raise from_rpc_error(err) from None
    finally:
        channel.close()


def main(argv: list[str] | None = None) -> int:
    """Command line: ``submit_job.py ADDRESS CONFIG [--set k=v ...] [--timeout-s S]``; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="trainer host:port")
    parser.add_argument("config", type=Path, help="training config YAML")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="dotted key=value")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="longest wait for the job, seconds")
    parser.add_argument("--token", default=os.environ.get("MARTI_TOKEN") or None, help="bearer token")
    args = parser.parse_args(argv)
    started = time.monotonic()
    job, records = submit_and_wait(
        args.address, args.config.read_text(), args.overrides, timeout_s=args.timeout_s, token=args.token
    )
    state = trainer_pb2.JobState.Name(job.state)
    print(
        f"job {job.job_id}: {state} after {time.monotonic() - started:.1f}s, step {job.step}/{job.max_steps}"
    )
    print(f"run_dir (in the trainer container): {job.run_dir}; last checkpoint: {job.last_checkpoint or '-'}")
    if job.error:
        print(f"error: {job.error}")
    if records:
        last = records[-1]
        shown = ", ".join(f"{k}={v:.4g}" for k, v in sorted(last.values.items())[:12])
        print(f"{len(records)} metrics records; last ({last.kind}, step {last.step}): {shown}")
    return 0 if job.state == trainer_pb2.JOB_STATE_SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
