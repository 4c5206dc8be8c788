"""A table's ``max_policy_lag``: items staler than the sampler's version are removed in place of being returned,
take their slot in the sample, and are counted; the counter survives a restart."""

from __future__ import annotations

import itertools

import pytest

from marti.errors import DeadlineExceededError, InvalidArgumentError
from marti.types.experience import parse_table_config
from services.experience_store.core.storage import MemoryStorage
from services.experience_store.core.table import Table

from .helpers import item


def _queue(lag=1, storage=None, counters=None):
    cfg = parse_table_config({"name": "q", "preset": "queue", "max_size": 10, "max_policy_lag": lag})
    keys, seqs = itertools.count(1), itertools.count(1)
    return Table(cfg, storage or MemoryStorage(), keys.__next__, seqs.__next__, seed=0, counters=counters)


def test_stale_items_are_removed_in_fifo_order_and_take_their_slot():
    t = _queue(lag=1)
    t.insert([item(version=v, episode=f"e{v}") for v in (0, 1, 2, 2)], 0)
    got = t.sample(3, 0, current_policy_version=2)  # bound: version >= 1
    assert [(s.record.policy_version, s.stale) for s in got] == [(0, True), (1, False), (2, False)]
    assert got[0].payload == b"" and got[1].payload
    assert len(t) == 1 and t.counters()["stale_removed"] == 1


def test_the_bound_is_inclusive_and_needs_the_callers_version():
    t = _queue(lag=2)
    t.insert([item(version=1)], 0)
    assert not t.sample(1, 0, current_policy_version=3)[0].stale  # lag 2 == bound: kept
    t.insert([item(version=1)], 0)
    assert not t.sample(1, 0)[0].stale  # no version stated: no check
    t.insert([item(version=0)], 0)
    assert t.sample(1, 0, current_policy_version=3)[0].stale  # lag 3 > 2


def test_a_sample_of_only_stale_items_returns_at_once_and_then_waits():
    t = _queue(lag=0)
    t.insert([item(version=0), item(version=0)], 0)
    assert [s.stale for s in t.sample(5, 10.0, current_policy_version=1)] == [True, True]
    with pytest.raises(DeadlineExceededError):
        t.sample(1, 0.05, current_policy_version=1)


def test_no_lag_setting_means_no_removal():
    cfg = parse_table_config({"name": "q", "preset": "queue", "max_size": 10})
    assert cfg.max_policy_lag is None
    t = Table(cfg, MemoryStorage(), itertools.count(1).__next__, itertools.count(1).__next__)
    t.insert([item(version=0)], 0)
    assert not t.sample(1, 0, current_policy_version=100)[0].stale


def test_bad_values_are_refused():
    with pytest.raises(InvalidArgumentError, match="current_policy_version"):
        _queue().sample(1, 0, current_policy_version=-1)
    with pytest.raises(ValueError, match="max_policy_lag"):
        parse_table_config({"name": "q", "max_policy_lag": -1})


def test_the_counter_survives_a_restart(tmp_path):
    from marti.types.trajectory import summarize
    from services.experience_store.core.storage import SqliteStorage
    from services.experience_store.core.store import ExperienceStore
    from services.experience_store.core.table_records import NewItem

    from .helpers import make_traj

    cfg = parse_table_config({"name": "q", "preset": "queue", "max_size": 10, "max_policy_lag": 0})
    store = ExperienceStore(SqliteStorage(str(tmp_path / "db")), tables=[cfg], default_table=None)
    store.insert("q", [NewItem(b"x", summarize(make_traj(version=0)))], 0)
    assert store.sample("q", 1, 0, current_policy_version=5)[0].stale
    store.close()
    again = ExperienceStore(SqliteStorage(str(tmp_path / "db")), default_table=None)
    info = again.table("q").info()
    assert info["counters"]["stale_removed"] == 1 and info["size"] == 0
    assert again.table("q").config.max_policy_lag == 0
    again.close()


def test_an_item_without_turns_is_never_stale():
    t = _queue(lag=0)
    t.insert([item(version=0, steps=())], 0)  # an agent that did not act in the episode
    (got,) = t.sample(1, 0, current_policy_version=9)
    assert not got.stale and got.payload
