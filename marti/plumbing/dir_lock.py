"""An exclusive, process-lifetime lock on a folder: ``fcntl.flock`` on ``<folder>/.lock``, which holds the pid.

Used by ``marti train`` for its run folder and by the broker and the store for their ``--data-dir``, so that a
second process on the same folder is refused at once (naming the folder and the holder's pid) instead of both
writing one database. The kernel drops the lock when the process ends, however it ends.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from marti.errors import FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError

LOCK_FILE = ".lock"


def ensure_folder(folder: str | Path, what: str = "folder") -> Path:
    """Create ``folder`` and its parents if missing (a folder that exists is fine).

    Args:
        folder: The folder.
        what: How the error names it, e.g. ``"store data dir"``.

    Returns:
        ``folder`` as a Path.

    Raises:
        InvalidArgumentError: It cannot be a folder, e.g. ``store data dir /tmp/f is not a folder (a file of that
            name exists)``, ``... cannot be created: /tmp/f is a file``, or ``... cannot be created: Permission
            denied``.
    """
    path = Path(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(f"{what} {path} {_why_not_a_folder(path, exc)}") from None
    return path


def _why_not_a_folder(path: Path, exc: OSError) -> str:
    """The end of the message of :func:`ensure_folder` for the ``mkdir`` error ``exc``."""
    if path.exists() and not path.is_dir():
        return "is not a folder (a file of that name exists)"
    for parent in path.parents:
        if parent.exists() and not parent.is_dir():
            return f"cannot be created: {parent} is a file"
    return f"cannot be created: {exc.strerror or exc}"


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
            InvalidArgumentError: The folder cannot be created (:func:`ensure_folder`: a file of that name, a
                parent that is a file, no permission), or its lock file cannot be opened for writing (a read-only
                folder or file system).
            FailedPreconditionError: Another process (or another lock in this one) holds it; the folder and the
                holder's pid are named.
        """
        ensure_folder(self.folder, self.what)
        try:
            fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a read-only folder (or lock file): was a PermissionError traceback
            raise InvalidArgumentError(
                f"{self.what} {self.folder} cannot be written ({LOCK_FILE}: {exc.strerror or exc}); give a "
                f"writable folder"
            ) from None
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


@contextlib.contextmanager
def opening_database(path: str | Path, what: str, lock: DirLock) -> Iterator[None]:
    """Turn an error while a service opens its SQLite database in its data dir (a folder made read-only after the
    database was made, a file that is not a database, a full disk) into one :class:`InvalidArgumentError` naming the
    file, instead of an ``sqlite3.OperationalError`` traceback; on any error the data dir's lock is released.

    Args:
        path: The database file.
        what: How the message names it, e.g. ``"store database"``.
        lock: The data dir's lock, taken before.

    Raises:
        InvalidArgumentError: ``{what} {path} cannot be opened ({sqlite's reason}): ...``.
    """
    try:
        yield
    except BaseException as exc:
        lock.unlock()
        if not isinstance(exc, sqlite3.Error | OSError):
            raise
        raise InvalidArgumentError(
            f"{what} {path} cannot be opened ({exc}); its folder and file must be writable (SQLite writes its "
            f"-wal and -shm files beside it) and hold a database this service wrote"
        ) from None


def is_storage_full(exc: BaseException) -> bool:
    """Whether ``exc`` is what a full disk gives a write: SQLite's ``SQLITE_FULL`` ("database or disk is full",
    also raised when a database reaches its ``max_page_count``), or an ``OSError`` ``ENOSPC`` / ``EDQUOT``."""
    if isinstance(exc, sqlite3.Error):
        return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_FULL
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def storage_full_error(
    what: str, path: str | Path, exc: BaseException, outcome: str
) -> ResourceExhaustedError:
    """The error a write refused by a full disk gets (RESOURCE_EXHAUSTED, not INTERNAL), naming the database and
    saying what became of the write.

    Args:
        what: What was written, e.g. ``"store database"`` or ``"broker database"``.
        path: The database file.
        exc: The error of the write (:func:`is_storage_full` is true for it).
        outcome: What became of the call's data, e.g. ``"nothing of this call was stored"``.
    """
    return ResourceExhaustedError(f"{what} {path} is full ({exc}): {outcome}; free space on its disk")
