"""Typed runtime settings shared by every marti server (pydantic-settings, env prefix ``MARTI_``)."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import sys
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from marti.errors import InvalidArgumentError, MartiError

#: Default largest message a server accepts or sends, in bytes (64 MiB). Client and server use the same value.
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


#: Settings whose value an error message never shows (a refused one is shown as ``<hidden>``).
SECRET_SETTINGS = frozenset({"token", "service_token"})

#: Settings that name a file or folder (TLS files; a service's ``data_dir`` and the store's tables ``config``):
#: unset (None) or a non-empty path.
PATH_SETTINGS = ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "data_dir", "config")

#: Accepted ``log_level`` values.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

S = TypeVar("S", bound=BaseSettings)


#: Largest value gRPC takes for a server option (a C ``int``): the message size, rpc cap and keepalive settings.
C_INT_MAX = 2**31 - 1


class ServerSettings(BaseSettings):
    """Settings every gRPC server understands.

    Each service subclasses this with its own env prefix (``MARTI_BROKER_``, ``MARTI_ENV_``,
    ``MARTI_STORE_``, ``MARTI_TRAINER_``) and its own limits. Values come from keyword arguments, then
    environment variables, then these defaults.
    """

    model_config = SettingsConfigDict(env_prefix="MARTI_", extra="ignore")

    host: str = Field("127.0.0.1", description="Interface to bind; 0.0.0.0 for all interfaces.")
    port: int = Field(0, ge=0, le=65535, description="TCP port; 0 asks the OS for a free one.")
    grace_s: float = Field(5.0, ge=0, description="Seconds in-flight calls may finish after SIGTERM.")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Prometheus HTTP port; None = off.")
    token: str | None = Field(None, description="Bearer token required on every call when set.")
    tls_cert_file: str | None = Field(None, description="PEM server certificate; enables TLS with key file.")
    tls_key_file: str | None = Field(None, description="PEM private key of the server certificate.")
    tls_client_ca_file: str | None = Field(
        None, description="PEM CA; when set clients must present a cert (mTLS)."
    )
    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES, gt=0, le=C_INT_MAX, description="Largest message received or sent, bytes."
    )
    max_concurrent_rpcs: int | None = Field(
        None, gt=0, le=C_INT_MAX, description="Cap on concurrently served rpcs."
    )
    keepalive_time_ms: int = Field(
        30_000, gt=0, le=C_INT_MAX, description="Interval between keepalive pings, ms."
    )
    keepalive_timeout_ms: int = Field(
        10_000, gt=0, le=C_INT_MAX, description="Wait for a keepalive ack before closing, ms."
    )
    log_level: str = Field("INFO", description="Python logging level of the service.")

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        """A Python logging level name (any case), stored upper-case."""
        level = str(value).upper()
        if level not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return level

    @field_validator(*PATH_SETTINGS, check_fields=False)
    @classmethod
    def _path_given(cls, value: str | None) -> str | None:
        """A path setting is a path or unset (None): ``""`` (say ``--data-dir "$DIR"`` with ``DIR`` empty) read
        as unset and ran the broker in memory, served plaintext or created no tables, silently."""
        if value == "":
            raise ValueError(
                "an empty path names no file or folder; leave the setting unset for its default (none), or give a "
                "path"
            )
        return value

    @field_validator("token")
    @classmethod
    def _sendable_token(cls, value: str | None) -> str | None:
        """A token a client can send: non-empty printable ASCII (see :func:`_check_sendable`)."""
        return None if value is None else _check_sendable(value, "token")

    @model_validator(mode="after")
    def _shared_token(self) -> ServerSettings:
        """Fall back to ``MARTI_TOKEN`` (shared by every service) when no service-specific token is set."""
        if self.token is None and os.environ.get("MARTI_TOKEN"):
            self.token = _check_sendable(os.environ["MARTI_TOKEN"], "MARTI_TOKEN")
        return self


def _check_sendable(token: str, source: str) -> str:
    """``token`` when a client can send it as ``authorization: Bearer <token>``.

    Raises:
        ValueError: ``token`` is empty (a client's ``token=""`` sends none, so every call would be refused) or
            holds a character gRPC metadata cannot carry (its position named, never the token).
    """
    from marti.rpc.client.channel import check_token  # channel imports this module

    if not token:
        raise ValueError(
            "an empty token can never be sent by a client, so every call would be refused; leave the setting "
            "unset for a server without authentication"
        )
    try:
        check_token(token, source)
    except InvalidArgumentError as exc:
        raise ValueError(f"{exc.message}, so no client could send it") from None
    return token


def _flag_kind(annotation: Any) -> Any:
    """What a flag for a field of this annotation parses its value as: ``bool`` (``--x/--no-x``), ``list``
    (``--x A B``), ``int``, ``float`` or ``str``; ``X | None`` as ``X``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else str
    if typing.get_origin(annotation) is list:
        return list
    return annotation if annotation in (bool, int, float) else str


def settings_parser(cls: type[BaseSettings], prog: str, description: str) -> argparse.ArgumentParser:
    """A service command's parser: one flag per field of its settings class (``max_sessions`` ->
    ``--max-sessions``), each with the field's description and default in its help, and every default ``None``
    so that :func:`load_settings` sees only the flags given (the rest come from the environment, then defaults).

    Args:
        cls: The service's settings class (a :class:`ServerSettings` subclass).
        prog: The command (``"marti store"``).
        description: The command's one-line description.

    Returns:
        The parser; ``{k: v for k, v in vars(args).items() if v is not None}`` are the flags for
        :func:`load_settings`.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for name, field in cls.model_fields.items():
        flag = "--" + name.replace("_", "-")
        default = field.get_default(call_default_factory=True)
        help_text = f"{field.description or name} (default: {default})".replace("%", "%%")
        kind = _flag_kind(field.annotation)
        if kind is bool:
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif kind is list:
            parser.add_argument(flag, dest=name, nargs="+", default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=name, type=kind, default=None, help=help_text)
    return parser


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags a :func:`settings_parser` parser was given (those not ``None``), for :func:`load_settings`."""
    return {k: v for k, v in vars(args).items() if v is not None}


def _source(cls: type[BaseSettings], name: str, flags: Mapping[str, Any]) -> str:
    """Where a setting's value came from: its flag when given, else its environment variable."""
    if name in flags:
        return "--" + name.replace("_", "-")
    return str(cls.model_config.get("env_prefix", "")) + name.upper()


def settings_error_line(cls: type[BaseSettings], flags: Mapping[str, Any], exc: Exception) -> str:
    """One line naming each bad setting, where it came from (flag or environment variable) and its value.

    Args:
        cls: The settings class that refused.
        flags: The values given as command-line flags (the rest came from the environment or defaults).
        exc: The ``pydantic.ValidationError`` or ``pydantic_settings.SettingsError`` raised.

    Returns:
        E.g. ``setting port (MARTI_BROKER_PORT) = 'abc': Input should be a valid integer, ...``.
    """
    if isinstance(exc, SettingsError):  # a complex value (list, dict) in the environment that is not JSON
        match = re.search(r'field "(\w+)"', str(exc))
        name = match.group(1) if match else "?"
        variable = _source(cls, name, {})
        value = os.environ.get(variable)
        return f"setting {name} ({variable}) = {value!r}: not valid JSON ({exc.__cause__ or exc})"
    parts = []
    for error in exc.errors() if isinstance(exc, ValidationError) else ():
        loc = error.get("loc") or ()
        if not loc:
            parts.append(str(error.get("msg", "")))
            continue
        name = str(loc[0])
        value = error.get("input")
        shown = "<hidden>" if name in SECRET_SETTINGS and value else repr(value)
        parts.append(f"setting {name} ({_source(cls, name, flags)}) = {shown}: {error.get('msg')}")
    return "; ".join(parts) or str(exc)


def load_settings(cls: type[S], flags: Mapping[str, Any], prog: str) -> S:
    """Build a service's settings from its flags (over its ``MARTI_<SERVICE>_*`` variables and defaults); a bad
    value ends the process with one line naming it, like a bad flag does.

    Args:
        cls: The service's settings class (a :class:`ServerSettings` subclass).
        flags: The values given as flags (``None`` values already dropped).
        prog: The command, for the message (``"marti broker"``).

    Returns:
        The settings.

    Raises:
        SystemExit: Exit code 2 after printing ``PROG: error: setting NAME (FLAG or VARIABLE) = VALUE: WHY``
            on stderr (no traceback).

    A ``MARTI_<SERVICE>_*`` variable that names no setting is a warning line on stderr (:func:`unknown_variables`).
    """
    for line in unknown_variables(cls):
        print(f"{prog}: warning: {line}", file=sys.stderr, flush=True)
    try:
        return cls(**flags)
    except (ValidationError, SettingsError) as exc:
        print(f"{prog}: error: {settings_error_line(cls, flags, exc)}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


#: Variables under a service's prefix that other commands read (``marti train``'s service addresses), not settings.
NOT_SETTINGS = frozenset({"MARTI_BROKER_ADDR", "MARTI_ENV_ADDR", "MARTI_STORE_ADDR"})


def unknown_variables(cls: type[BaseSettings]) -> list[str]:
    """The variables of the environment under ``cls``'s prefix (``MARTI_STORE_``) that name none of its settings (a
    misspelt ``MARTI_STORE_SQLITE_SYNCRONOUS`` was ignored without a word), each as a line naming it and the
    closest setting's variable, sorted; :data:`NOT_SETTINGS` are left out."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    known = [prefix + name.upper() for name in cls.model_fields]
    lines = []
    for var in sorted(os.environ):
        if var.startswith(prefix) and var.upper() not in known and var not in NOT_SETTINGS:
            close = difflib.get_close_matches(var.upper(), known, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            lines.append(f"{var} is not a setting of this service and is ignored{hint}")
    return lines


@contextlib.contextmanager
def refusals_exit(prog: str) -> Iterator[None]:
    """Turn a :class:`~marti.errors.MartiError` raised while a service starts (its data dir in use, a bad tables
    file) into one line on stderr and exit code 2, like a bad setting (:func:`load_settings`).

    Args:
        prog: The command, for the message (``"marti store"``).

    Raises:
        SystemExit: Exit code 2 after printing ``PROG: error: MESSAGE`` on stderr (no traceback).
    """
    try:
        yield
    except MartiError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
