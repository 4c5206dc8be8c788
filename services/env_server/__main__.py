"""``marti env-server`` / ``python -m services.env_server``: run the env server.

Every setting is a flag (``--max-sessions 64``) and an environment variable (``MARTI_ENV_MAX_SESSIONS``);
flags win.
"""

from __future__ import annotations

import argparse

from marti.rpc.serving.server import run_server
from marti.rpc.settings import given_flags, load_settings, refusals_exit, settings_parser
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: one flag per :class:`EnvServerSettings` field."""
    return settings_parser(EnvServerSettings, "marti env-server", "run the env_server service")


def settings_from_args(argv: list[str] | None = None) -> EnvServerSettings:
    """Parse flags into :class:`EnvServerSettings` (flags override ``MARTI_ENV_*`` variables); a bad value exits
    with code 2 and one line naming it (:func:`marti.rpc.settings.load_settings`)."""
    args = build_parser().parse_args(argv)
    return load_settings(EnvServerSettings, given_flags(args), "marti env-server")


def main(argv: list[str] | None = None) -> int:
    """Run the env server until SIGINT/SIGTERM; returns the exit code. Settings its session core refuses
    together (``idempotency_results`` over ``idempotency_window``) exit with code 2 and one line, as a bad
    setting does (:func:`marti.rpc.settings.refusals_exit`)."""
    settings = settings_from_args(argv)
    with refusals_exit("marti env-server"):
        spec = env_service(settings)
    return run_server([spec], settings)


if __name__ == "__main__":
    raise SystemExit(main())
