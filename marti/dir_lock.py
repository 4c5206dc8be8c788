"""An exclusive, process-lifetime lock on a folder: ``fcntl.flock`` on ``<folder>/.lock``, which holds the pid.

Used by ``marti train`` for its run folder and by the broker and the store for their ``--data-dir``, so that a
second process on the same folder is refused at once (naming the folder and the holder's pid) instead of both
writing one database. The kernel drops the lock when the process ends, however it ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from marti.errors import FailedPreconditionError

LOCK_FILE = ".lock"


class DirLock:
    """Exclusive lock on ``folder`` (created if missing) for this process.

    Args:
        folder: The folder to lock.
        what: How the refusal names the folder and its holder, e.g. ``"run folder"``.
        holder: What the refusal calls the holder, e.g. ``"job"``.
        advice: Sentence appended to the refusal (what to do instead).
    """

    def __init__(
        self, folder: str | Path, what: str = "folder", holder: str = "process", advice: str = ""
    ) -> None:
        self.folder = Path(folder)
        self.what, self.holder, self.advice = what, holder, advice
        self._fd: int | None = None

    def lock(self) -> None:
        """Take the lock (released by :meth:`unlock` or when the process ends).

        Raises:
            FailedPreconditionError: Another process (or another lock in this one) holds it; the folder and the
                holder's pid are named.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            advice = f"; {self.advice}" if self.advice else ""
            raise FailedPreconditionError(
                f"{self.what} {self.folder} is in use by another {self.holder} (pid {pid}){advice}"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def unlock(self) -> None:
        """Release the lock (idempotent)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
