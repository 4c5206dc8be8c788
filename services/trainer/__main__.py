"""``marti trainer``: run the trainer service (TrainerService on port 50054 by default)."""

from __future__ import annotations

import argparse
import os
import sys

# Ray's processes start by fork-then-exec while gRPC threads are busy; gRPC's fork handlers hung or aborted those
# children (docs/operations.md): off for this process, unless set, before the first gRPC import.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from marti.api.trainer.v1 import trainer_service_pb2_grpc
from marti.rpc.server import ServiceSpec, run_server
from marti.rpc.settings import load_settings
from services.trainer.job.addresses import resolve_addresses
from services.trainer.job.jobs import JobManager
from services.trainer.job.servicer import TrainerServicer
from services.trainer.job.settings import TrainerSettings

SERVICE_NAME = "marti.api.trainer.v1.TrainerService"


def build_specs(settings: TrainerSettings) -> list[ServiceSpec]:
    """The trainer's gRPC service spec for :func:`marti.rpc.server.start_server`."""
    addresses, _ = resolve_addresses(
        broker=settings.broker, env=settings.env, store=settings.store, token=settings.service_token
    )
    jobs = JobManager(addresses, settings.max_concurrent_jobs, allow_user_code=settings.allow_user_code)
    servicer = TrainerServicer(jobs, settings.stream_poll_s)
    return [
        ServiceSpec(
            SERVICE_NAME, lambda s: trainer_service_pb2_grpc.add_TrainerServiceServicer_to_server(servicer, s)
        )
    ]


def main(argv: list[str] | None = None) -> int:
    """Parse flags (over ``MARTI_TRAINER_*`` env vars) and serve until SIGTERM; a bad setting exits with code 2
    and one line naming it (:func:`marti.rpc.settings.load_settings`)."""
    p = argparse.ArgumentParser(prog="marti trainer", description="run the trainer service")
    p.add_argument("--host", default=None)
    p.add_argument(
        "--port", type=int, default=None, help="TCP port (default 50054 via MARTI_TRAINER_PORT; 0 = any)"
    )
    p.add_argument("--broker", default=None, help="comm_broker host:port for jobs")
    p.add_argument("--env", default=None, help="env_server host:port for jobs")
    p.add_argument("--store", default=None, help="experience_store host:port for jobs")
    p.add_argument("--token", default=None, help="bearer token required by this service (and sent to others)")
    p.add_argument("--metrics-port", type=int, default=None, help="Prometheus HTTP port")
    p.add_argument("--max-concurrent-jobs", type=int, default=None)
    p.add_argument(
        "--allow-user-code",
        action="store_true",
        default=None,
        help="let submitted configs import user code (custom envs, workflow functions); off by default",
    )
    args = p.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    if "token" in overrides:
        overrides["service_token"] = overrides["token"]
    settings = load_settings(TrainerSettings, overrides, "marti trainer")
    if settings.token and not settings.service_token:
        settings = settings.model_copy(update={"service_token": settings.token})
    return run_server(build_specs(settings), settings)


if __name__ == "__main__":
    sys.exit(main())
