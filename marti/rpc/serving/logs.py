"""The log format every marti service prints (``2026-12-06 22:54:43,439 INFO name: message``), set up once per
process by :func:`configure_logging`."""

from __future__ import annotations

import logging

#: The format of a service's log lines: time, level, logger name, message.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(log_level: str) -> None:
    """Send the process's log lines to stderr in :data:`LOG_FORMAT` at ``log_level`` (a level name such as
    ``"INFO"``; an unknown name reads as INFO), with the access log (``marti.access``) at WARNING unless the
    level is DEBUG. The first call in a process sets the format (:func:`logging.basicConfig`): a service that
    logs while it opens its data, before :func:`~marti.rpc.serving.server.run_server`, calls it first."""
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO), format=LOG_FORMAT)
    logging.getLogger("marti.access").setLevel(logging.WARNING if log_level != "DEBUG" else logging.DEBUG)
