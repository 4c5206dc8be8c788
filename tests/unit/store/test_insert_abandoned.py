"""An insert waiting for room (a full queue under the block policy, or a rate limiter that does not admit it)
whose caller went away (``abandoned`` set): the wait ends at once, the waiting item and the ones after it are
not inserted, and the items inserted before it, and the rest of the table, stay as they were."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from marti.errors import UnavailableError
from marti.types.experience import parse_table_config
from services.experience_store.core.storage import MemoryStorage
from services.experience_store.core.table import Table

from .helpers import item

#: The waiting insert's timeout: far longer than the test may take, so only the abandon can end the wait.
TIMEOUT_S = 600.0

FULL_QUEUE = {"preset": "queue", "max_size": 2}
#: samples_per_insert 1, error_buffer 1: max_diff 2, so a third insert waits for a sample; no max_size.
RATE_LIMITED = {
    "rate_limiter": {
        "kind": "sample_to_insert_ratio",
        "samples_per_insert": 1,
        "min_size_to_sample": 1,
        "error_buffer": 1,
    },
    "sampler": "fifo",
    "max_times_sampled": 1,
}


def _table(cfg: dict) -> Table:
    keys, seqs = itertools.count(1), itertools.count(1)
    return Table(parse_table_config({"name": "t", **cfg}), MemoryStorage(), keys.__next__, seqs.__next__, 0)


def _waiting_insert(t: Table, n_items: int, abandoned: threading.Event) -> tuple[threading.Thread, list]:
    """Start ``t.insert`` of ``n_items`` items in a thread and return once it waits; the list gets its result."""
    out: list = []
    items = [item(float(p)) for p in range(n_items)]
    thread = threading.Thread(target=lambda: out.append(t.insert(items, TIMEOUT_S, abandoned)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while t.info()["waiting_inserts"] != 1:
        assert time.monotonic() < deadline and thread.is_alive(), f"the insert never waited: {out}"
        time.sleep(0.01)
    return thread, out


@pytest.mark.parametrize("cfg", [FULL_QUEUE, RATE_LIMITED], ids=["full_queue", "rate_limiter"])
def test_an_abandoned_waiting_insert_ends_at_once_and_inserts_nothing_more(cfg):
    t = _table(cfg)
    before = t.insert([item(9.0)], 0)
    abandoned = threading.Event()
    thread, out = _waiting_insert(t, 3, abandoned)  # the first goes in, the second waits, the third after it
    t0 = time.monotonic()
    abandoned.set()
    t.notify()
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - t0 < 5
    first, waited, after = out[0]
    assert isinstance(first, int)
    assert isinstance(waited, UnavailableError) and after is waited
    assert "abandoned: its caller went away" in str(waited)
    info = t.info()
    assert (info["size"], info["waiting_inserts"], info["counters"]["inserts"]) == (2, 0, 2)
    assert [s.record.key for s in t.sample(5, 0)] == [*before, first]


@pytest.mark.parametrize("cfg", [FULL_QUEUE, RATE_LIMITED], ids=["full_queue", "rate_limiter"])
def test_an_abandoned_insert_woken_by_room_does_not_take_it(cfg):
    """The caller went away, then a sample made room (and woke the insert) before anyone called ``notify``:
    the insert still gives up, and the room stays free for the next one."""
    t = _table(cfg)
    t.insert([item(), item()], 0)
    abandoned = threading.Event()
    thread, out = _waiting_insert(t, 1, abandoned)
    abandoned.set()
    assert len(t.sample(1, 0)) == 1  # its commit wakes the waiting insert
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(out[0][0], UnavailableError)
    assert len(t) == 1 and t.info()["waiting_inserts"] == 0
    assert isinstance(t.insert([item()], 0)[0], int)  # the room is there for the next caller
