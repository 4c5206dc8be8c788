"""``marti broker`` / ``python -m services.comm_broker``: run the comm_broker service.

Every setting is a flag (``--max-mailbox-messages 1000``) and an environment variable
(``MARTI_BROKER_MAX_MAILBOX_MESSAGES``); flags win.
"""

from __future__ import annotations

import argparse

from marti.rpc.server import run_server

from .servicer import broker_service
from .settings import BrokerSettings


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: server flags, storage flags and one flag per limit (from BrokerSettings)."""
    parser = argparse.ArgumentParser(prog="marti broker", description="run the comm_broker service")
    for name, field in BrokerSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        annotation = field.annotation
        help_text = f"{field.description or name} (default: {field.default})"
        if annotation is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            kind = {int: int, float: float}.get(annotation, str)
            if name in ("metrics_port", "max_concurrent_rpcs"):
                kind = int
            parser.add_argument(flag, dest=name, type=kind, default=None, help=help_text)
    return parser


def settings_from_args(argv: list[str] | None = None) -> BrokerSettings:
    """Parses flags into :class:`BrokerSettings` (flags override ``MARTI_BROKER_*`` environment variables).

    Raises:
        pydantic.ValidationError: A value breaks its constraint (the message names the field).
    """
    args = build_parser().parse_args(argv)
    given = {k: v for k, v in vars(args).items() if v is not None}
    return BrokerSettings(**given)


def main(argv: list[str] | None = None) -> int:
    """Runs the broker until SIGINT/SIGTERM.

    Returns:
        The process exit code (0 after a clean shutdown).
    """
    settings = settings_from_args(argv)
    return run_server([broker_service(settings)], settings)


if __name__ == "__main__":
    raise SystemExit(main())
