"""A checkpoint's every failure is the store's typed error naming the snapshot, never a raw sqlite3 or OS error
(opening its connection, removing a partial snapshot after a failure, removing old snapshots); the periodic
snapshot thread outlives any exception; and a snapshot is synced before its rename and its folder after it, so
the rename cannot reach the disk before the data in a power loss."""

from __future__ import annotations

import logging
import os
import sqlite3
import time

import pytest

from marti.errors import InternalError
from services.experience_store.core import storage as storage_module
from services.experience_store.core.storage import SqliteStorage
from services.experience_store.core.store import ExperienceStore

from .helpers import item


@pytest.fixture
def storage(tmp_path):
    """A SQLite storage on ``tmp_path`` holding one committed item, keeping one snapshot."""
    s = ExperienceStore(SqliteStorage(tmp_path / "data", keep_snapshots=1))
    s.insert("default", [item()], 0)
    yield s.storage
    s.close()


def test_a_connection_that_cannot_open_is_internal_naming_the_snapshot(storage, monkeypatch):
    def refuse(*args, **kwargs):
        raise sqlite3.OperationalError("unable to open database file")

    monkeypatch.setattr(storage, "_connect", refuse)
    with pytest.raises(InternalError, match=r"store snapshot .*snapshot-\d+\.sqlite failed \(unable to open"):
        storage.checkpoint()


def test_a_partial_snapshot_that_cannot_be_removed_does_not_hide_the_error(storage, caplog):
    """A partial snapshot the checkpoint cannot remove (a folder by that name): the removal failed again in the
    error path, and that raw IsADirectoryError escaped in place of the store's error."""
    stuck = storage.snapshot_dir / "snapshot-1.sqlite.partial-journal"
    (stuck / "x").mkdir(parents=True)
    with caplog.at_level(logging.WARNING), pytest.raises(InternalError, match=r"store snapshot .* failed"):
        storage.checkpoint()
    assert "could not remove what the failed checkpoint of" in caplog.text
    assert [p.name for p in storage.snapshot_dir.glob("snapshot-*.sqlite")] == []


def test_old_snapshots_that_cannot_be_removed_are_internal_saying_the_snapshot_was_written(storage):
    (storage.snapshot_dir / "snapshot-0.sqlite" / "x").mkdir(parents=True)  # the oldest, and not removable
    with pytest.raises(InternalError, match=r"the snapshot was written and is complete, but older snapshots"):
        storage.checkpoint()
    (written,) = [p for p in storage.snapshot_dir.glob("snapshot-*.sqlite") if p.is_file()]
    assert sqlite3.connect(written).execute("SELECT COUNT(*) FROM items").fetchone() == (1,)


def test_a_snapshot_is_synced_before_its_rename_and_its_folder_after_it(storage, monkeypatch):
    """``VACUUM INTO`` does not sync what it writes; without an ``fsync`` of the partial file before the rename and
    of the folder after it, a power loss could keep the rename and lose the data."""
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        synced.append((path, sorted(p.name for p in storage.snapshot_dir.iterdir())))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    target = storage.checkpoint().path
    name = os.path.basename(target)
    ours = [
        (path, names) for path, names in synced if path in (target + ".partial", str(storage.snapshot_dir))
    ]
    assert ours == [
        (target + ".partial", [name + ".partial"]),  # the data, before the rename
        (str(storage.snapshot_dir), [name]),  # the rename, after it
    ], synced


def test_the_snapshot_thread_outlives_an_unexpected_exception(tmp_path, monkeypatch, caplog):
    """The periodic snapshot loop caught MartiError only: any other exception ended the thread, and no snapshot
    was taken again. Now it is logged with its traceback and the next interval snapshots."""
    store = ExperienceStore(SqliteStorage(tmp_path / "data"))
    real_checkpoint = store.storage.checkpoint
    calls = []

    def fail_once():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in the first checkpoint")
        return real_checkpoint()

    monkeypatch.setattr(store.storage, "checkpoint", fail_once)
    try:
        with caplog.at_level(logging.ERROR):
            store.start_snapshots(0.05)
            deadline = time.monotonic() + 20
            while (
                not list(store.storage.snapshot_dir.glob("snapshot-*.sqlite")) and time.monotonic() < deadline
            ):
                time.sleep(0.05)
        assert list(store.storage.snapshot_dir.glob("snapshot-*.sqlite")), "no snapshot after the failed one"
        assert "periodic checkpoint failed unexpectedly" in caplog.text
        assert "RuntimeError: a bug in the first checkpoint" in caplog.text
    finally:
        store.close()


def test_a_folder_sync_that_fails_after_the_rename_leaves_no_snapshot(storage, monkeypatch):
    """The error says no snapshot was written: a snapshot renamed into place whose folder could not be synced (so
    its name may not survive a power loss) is removed again, not left as if complete."""
    real = storage_module.fsync_path

    def refuse_folders(path):
        if os.path.isdir(path):
            raise OSError(5, "Input/output error")
        real(path)

    monkeypatch.setattr(storage_module, "fsync_path", refuse_folders)
    with pytest.raises(InternalError, match=r"Input/output error.*no snapshot was written"):
        storage.checkpoint()
    assert list(storage.snapshot_dir.iterdir()) == []
