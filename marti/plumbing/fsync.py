"""``fsync`` of a file or folder by its path: what makes a write, or a rename, outlive a power loss."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: str | Path) -> None:
    """``fsync`` the file or folder at ``path`` (opened read-only): a file's data, or a folder's entries (names
    created, renamed or removed in it), reach the disk before this returns.

    Raises:
        OSError: ``path`` cannot be opened, or the disk refused the sync.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
