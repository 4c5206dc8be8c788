"""Rate limiters at their edges, table limits, priority updates, signatures, concurrency."""

from __future__ import annotations

import itertools
import math
import threading
import time

import pytest

from marti.errors import DeadlineExceededError, InvalidArgumentError, ResourceExhaustedError
from marti.types.experience import SampleFilter, parse_table_config, parse_tables_yaml
from marti.types.trajectory import summarize
from services.experience_store.core import rate_limiter as rl
from services.experience_store.core.storage import MemoryStorage
from services.experience_store.core.table import Table

from .helpers import item, make_traj


def table(**cfg):
    cfg.setdefault("name", "t")
    keys, seqs = itertools.count(1), itertools.count(1)
    return Table(parse_table_config(cfg), MemoryStorage(), keys.__next__, seqs.__next__, seed=0)


def test_min_size_edge():
    t = table(rate_limiter={"kind": "min_size", "min_size_to_sample": 3})
    t.insert([item(), item()], 0)
    with pytest.raises(DeadlineExceededError, match="min_size_to_sample=3"):
        t.sample(1, 0.05)
    t.insert([item()], 0)
    assert len(t.sample(1, 0)) == 1


def test_sample_to_insert_ratio_edges():
    # spi=2, min_size=2, error_buffer=2: offset 4, min_diff 2, max_diff 6
    cfg = rl.sample_to_insert_ratio(2.0, 2, 2.0)
    assert (cfg.min_diff, cfg.max_diff) == (2.0, 6.0)
    lim = rl.RateLimiter(cfg)
    assert lim.can_insert(0) and lim.can_insert(1)  # still filling up
    lim.state.inserts = 2  # diff = 4
    assert lim.can_insert(2)  # 4 + 2 <= 6: exactly at the edge
    lim.state.inserts = 3  # diff = 6
    assert lim.can_sample(3)  # 6 - 1 >= 2
    assert not lim.can_insert(3)  # 6 + 2 > 6
    lim.state.samples = 4  # diff = 2
    assert not lim.can_sample(3)  # 2 - 1 < 2
    assert lim.can_insert(3)  # 2 + 2 <= 6
    assert not lim.can_sample(1)  # below min size


def test_ratio_table_blocks_inserts_until_samples():
    t = table(
        rate_limiter={
            "kind": "sample_to_insert_ratio",
            "samples_per_insert": 1,
            "min_size_to_sample": 1,
            "error_buffer": 1,
        }
    )  # fmt: skip  offset 1: min_diff 0, max_diff 2
    assert all(isinstance(k, int) for k in t.insert([item(), item()], 0))
    (res,) = t.insert([item()], 0.05)
    assert isinstance(res, DeadlineExceededError)
    threading.Timer(0.1, lambda: t.sample(1, 1)).start()
    (res,) = t.insert([item()], 5)
    assert isinstance(res, int)


@pytest.mark.parametrize(
    ("spi", "min_diff", "max_diff", "ok"),
    [
        (1, 0, 0, False),
        (1, 0, 1, True),
        (2, 0, 1.5, False),
        (2, 0, 2, True),
        (1.5, 0, 2.4, False),
        (1.5, 0, 2.5, True),
    ],
)
def test_deadlock_rejected_at_creation(spi, min_diff, max_diff, ok):
    cfg = rl.RateLimiterConfig(spi, 1, min_diff, max_diff)
    if ok:
        cfg.validate()
    else:
        with pytest.raises(InvalidArgumentError, match="could deadlock"):
            cfg.validate()


def test_table_level_deadlocks_rejected():
    with pytest.raises(InvalidArgumentError, match="min_size_to_sample=10 exceeds max_size=5"):
        parse_table_config(
            {"name": "x", "max_size": 5, "rate_limiter": {"kind": "min_size", "min_size_to_sample": 10}}
        )
    with pytest.raises(InvalidArgumentError, match="full_policy=block"):
        parse_table_config({"name": "x", "full_policy": "block"})
    with pytest.raises(InvalidArgumentError, match="samples_per_insert"):
        rl.RateLimiterConfig(math.nan).validate()


def test_queue_preset_blocks_when_full_and_is_fifo():
    t = table(preset="queue", max_size=2)
    assert t.config.sampler == "fifo" and t.config.max_times_sampled == 1
    k = t.insert([item(), item()], 0)
    (res,) = t.insert([item()], 0.05)
    assert isinstance(res, DeadlineExceededError)
    assert [s.record.key for s in t.sample(5, 0)] == k
    with pytest.raises(DeadlineExceededError):
        t.sample(1, 0.05)


def test_stack_preset_is_lifo():
    t = table(preset="stack", max_size=3)
    k = t.insert([item(), item(), item()], 0)
    assert [s.record.key for s in t.sample(3, 0)] == k[::-1]


def test_evict_by_size_and_bytes_with_remover():
    t = table(max_size=3, remover="fifo")
    keys = t.insert([item() for _ in range(5)], 0)
    assert sorted(r.key for r in t.records()) == keys[2:]
    b = table(max_bytes=100, remover="min_heap")
    k = b.insert([item(5.0, 40), item(1.0, 40), item(9.0, 40)], 0)
    assert [r.key for r in b.records()] == [k[0], k[2]] and b.num_bytes == 80
    assert b.counters()["evictions"] == 1


def test_item_over_byte_cap_refused_and_table_kept():
    t = table(max_bytes=100)
    t.insert([item(nbytes=60)], 0)
    (res,) = t.insert([item(nbytes=101)], 0)
    assert isinstance(res, ResourceExhaustedError) and "max_bytes=100" in str(res)
    assert len(t) == 1


def test_bad_priorities_refused():
    t = table()
    res = t.insert([item(math.nan), item(math.inf), item(-1.0), item(0.0)], 0)
    assert [type(r).__name__ for r in res[:3]] == ["InvalidArgumentError"] * 3
    assert isinstance(res[3], int)
    with pytest.raises(InvalidArgumentError, match="priority of key"):
        t.update_priorities({res[3]: -2.0})


def test_update_removed_key_is_counted_noop():
    t = table(max_times_sampled=1, sampler="fifo")
    (k1, k2) = t.insert([item(), item()], 0)
    t.sample(1, 0)  # removes k1
    assert t.update_priorities({k1: 3.0, k2: 4.0}) == (1, 1)
    (k3,) = t.insert([item()], 0)
    assert k3 not in (k1, k2)  # keys are never reused
    assert [r.priority for r in t.records()] == [4.0, 1.0]
    assert t.counters()["priority_updates_missing"] == 1


def test_signature_names_field():
    t = table(signature={"agent_ids": ["a1"], "max_response_tokens": 1, "require_rewards": True})
    (res,) = t.insert([item(agent="zz")], 0)
    assert "trajectory.agent_id 'zz'" in str(res)
    (res,) = t.insert([item()], 0)
    assert "turns[0].response_token_ids has 2 tokens" in str(res)
    tr = make_traj()
    tr.turns[0].reward = None
    t2 = table(signature={"require_rewards": True})
    (res,) = t2.insert([type(item())(b"x", summarize(tr), 1.0)], 0)
    assert "turns[0].reward is missing" in str(res)


def test_filter_by_agent_role_version_recency():
    t = table()
    now = time.time()
    t.insert(
        [
            item(agent="a", version=1, created_at=now - 100),
            item(agent="b", version=5, role="q", created_at=now),
        ],
        0,
    )
    assert {
        t.sample(1, 0, SampleFilter(agent_ids=frozenset({"b"})))[0].record.agent_id for _ in range(20)
    } == {"b"}
    assert {t.sample(1, 0, SampleFilter(min_policy_version=2))[0].record.agent_id for _ in range(20)} == {"b"}
    assert {t.sample(1, 0, SampleFilter(roles=frozenset({"r"})))[0].record.agent_id for _ in range(20)} == {
        "a"
    }
    assert {t.sample(1, 0, SampleFilter(max_age_s=10))[0].record.agent_id for _ in range(20)} == {"b"}
    with pytest.raises(DeadlineExceededError):
        t.sample(1, 0.02, SampleFilter(min_policy_version=6))


def test_concurrent_writers_and_samplers_keep_counts_consistent():
    t = table(preset="queue", max_size=50)
    got: list[int] = []
    lock = threading.Lock()

    def writer():
        for _ in range(200):
            (r,) = t.insert([item()], 5)
            assert isinstance(r, int)

    def sampler():
        while True:
            try:
                items = t.sample(7, 0.5)
            except DeadlineExceededError:
                return
            with lock:
                got.extend(s.record.key for s in items)

    threads = [threading.Thread(target=writer) for _ in range(4)] + [
        threading.Thread(target=sampler) for _ in range(3)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert len(got) == 800 and len(set(got)) == 800  # every item exactly once
    c = t.counters()
    assert (c["inserts"], c["samples"], c["deletes"], len(t)) == (800, 800, 800, 0)


def test_tables_yaml():
    text = """
tables:
  - {name: agent_1, preset: queue, max_size: 10}
  - name: replay
    sampler: prioritized
    priority_exponent: 0.6
    rate_limiter: {kind: sample_to_insert_ratio, samples_per_insert: 4, min_size_to_sample: 10, error_buffer: 8}
"""
    a, b = parse_tables_yaml(text)
    assert a.rate_limiter.size == 10 and b.rate_limiter.build().max_diff == 48
    with pytest.raises(InvalidArgumentError, match="tables"):
        parse_tables_yaml("tablez: []")
    with pytest.raises(InvalidArgumentError, match="duplicate"):
        parse_tables_yaml("tables: [{name: a}, {name: a}]")
    with pytest.raises(InvalidArgumentError, match="samplr"):
        parse_tables_yaml("tables: [{name: a, samplr: fifo}]")


@pytest.mark.parametrize(
    ("spi", "min_diff", "max_diff", "bad"),
    [
        (1e6, -math.inf, math.inf, None),
        (1e6 * (1 + 1e-9), -math.inf, math.inf, "samples_per_insert"),
        (1e-6, -1.0, 1.0 + 1e-6, None),
        (1e-6 * (1 - 1e-9), -1.0, 2.0, "samples_per_insert"),
        (1.0, -(2.0**50), 2.0**50, None),
        (1.0, -(2.0**50) * 2, 0.0, "min_diff"),
        (1.0, 0.0, 1e308, "max_diff"),
    ],
)
def test_settings_past_float64_precision_are_refused_at_their_edge(spi, min_diff, max_diff, bad):
    """spi 1e308 with max_diff 1e308 admitted one insert, then none ever again (1e308 - 1 == 1e308: samples no
    longer moved the diff); each bound is accepted at its edge and refused just past it, naming the setting."""
    cfg = rl.RateLimiterConfig(spi, 1, min_diff, max_diff)
    if bad is None:
        cfg.validate()
    else:
        with pytest.raises(InvalidArgumentError, match=rf"{bad} .* out of range"):
            cfg.validate()
