"""SIGINT and SIGTERM for ``marti up``: a flag its supervisor polls, and sections in which a signal interrupts a
blocking wait at once (starting or restarting a service, up to a minute each)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived inside :meth:`StopSignals.interruptible` (the message is the signal's name)."""


class StopSignals:
    """Catches SIGINT and SIGTERM once :meth:`install` ran; :attr:`received` names the first one caught.

    Outside :meth:`interruptible` a signal only sets :attr:`received` (the caller polls :meth:`stopping`); inside,
    the first one also raises :class:`Interrupted` from wherever the main thread is blocked.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self._raise = False

    def install(self) -> None:
        """Handle SIGINT and SIGTERM in this process (main thread only)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def stopping(self) -> bool:
        """Whether a stop signal arrived."""
        return self.received is not None

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """A section that the first stop signal ends at once by raising :class:`Interrupted` (raised on entry when
        one arrived already); a second signal during the clean-up after it only sets the flag."""
        if self.received is not None:
            raise Interrupted(self.received)
        self._raise = True
        try:
            yield
        finally:
            self._raise = False

    def _on_signal(self, signum: int, frame: object) -> None:  # noqa: ARG002
        self.received = signal.Signals(signum).name
        if self._raise:
            self._raise = False
            raise Interrupted(self.received)
