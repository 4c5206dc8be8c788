"""``marti trainer``: run the trainer service (TrainerService on port 50054 by default)."""

from __future__ import annotations

import os
import sys

# Ray's processes start by fork-then-exec while gRPC threads are busy; gRPC's fork handlers hung or aborted those
# children (docs/operations.md): off for this process, unless set, before the first gRPC import.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from marti.api.trainer.v1 import trainer_service_pb2_grpc
from marti.rpc.serving.server import ServiceSpec, run_server
from marti.rpc.settings import given_flags, load_settings, settings_parser
from services.trainer.job.connections.addresses import resolve_addresses
from services.trainer.job.service.jobs import JobManager
from services.trainer.job.service.servicer import TrainerServicer
from services.trainer.job.service.settings import TrainerSettings

SERVICE_NAME = "marti.api.trainer.v1.TrainerService"


def build_specs(settings: TrainerSettings) -> list[ServiceSpec]:
    """The trainer's gRPC service spec for :func:`marti.rpc.serving.server.start_server`."""
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
    """Parse flags (one per :class:`TrainerSettings` field, over ``MARTI_TRAINER_*`` env vars) and serve until
    SIGTERM; a bad setting exits with code 2 and one line naming it (:func:`marti.rpc.settings.load_settings`).
    ``--token`` is also the token jobs send to the services unless ``--service-token`` is given."""
    args = settings_parser(TrainerSettings, "marti trainer", "run the trainer service").parse_args(argv)
    overrides = given_flags(args)
    if "token" in overrides:
        overrides.setdefault("service_token", overrides["token"])
    settings = load_settings(TrainerSettings, overrides, "marti trainer")
    if settings.token and not settings.service_token:
        settings = settings.model_copy(update={"service_token": settings.token})
    return run_server(build_specs(settings), settings)


if __name__ == "__main__":
    sys.exit(main())
