"""``marti env-server`` / ``python -m services.env_server``: run the env server.

Every setting is a flag (``--max-sessions 64``) and an environment variable (``MARTI_ENV_MAX_SESSIONS``);
flags win.
"""

from __future__ import annotations

import argparse

from marti.rpc.server import run_server
from marti.rpc.settings import load_settings
from services.env_server.servicer import env_service
from services.env_server.settings import EnvServerSettings


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: one flag per :class:`EnvServerSettings` field."""
    parser = argparse.ArgumentParser(prog="marti env-server", description="run the env_server service")
    for name, field in EnvServerSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        help_text = f"{field.description or name} (default: {field.get_default(call_default_factory=True)})"
        if field.annotation is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif name == "allowed_modules":
            parser.add_argument(flag, dest=name, nargs="+", default=None, help=help_text)
        else:
            kind = {int: int, float: float}.get(field.annotation, str)
            if name in ("metrics_port", "max_concurrent_rpcs"):
                kind = int
            parser.add_argument(flag, dest=name, type=kind, default=None, help=help_text)
    return parser


def settings_from_args(argv: list[str] | None = None) -> EnvServerSettings:
    """Parse flags into :class:`EnvServerSettings` (flags override ``MARTI_ENV_*`` variables); a bad value exits
    with code 2 and one line naming it (:func:`marti.rpc.settings.load_settings`)."""
    args = build_parser().parse_args(argv)
    given = {k: v for k, v in vars(args).items() if v is not None}
    return load_settings(EnvServerSettings, given, "marti env-server")


def main(argv: list[str] | None = None) -> int:
    """Run the env server until SIGINT/SIGTERM; returns the exit code."""
    settings = settings_from_args(argv)
    return run_server([env_service(settings)], settings)


if __name__ == "__main__":
    raise SystemExit(main())
