"""Store-level behaviour: SQLite restore, checkpoint concurrency, codec, sharing semantics."""

from __future__ import annotations

import re
import threading
import time

import pytest

from marti.codec.chunks import (
    JsonTrajectoryCodec,
    compress_chunks,
    decode_payload,
    decompress_chunks,
    encode_payload,
    pack_chunks,
    unpack_chunks,
)
from marti.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError
from marti.types.experience import parse_table_config
from marti.types.trajectory import Trajectory, Turn, merge_by_step, summarize
from services.experience_store.core.storage import SqliteStorage
from services.experience_store.core.store import ExperienceStore, LocalExperienceClient
from services.experience_store.core.table_records import NewItem

from .helpers import item, make_traj


def test_codec_roundtrip_chunks():
    raw = bytes(range(256)) * 1000
    chunks = compress_chunks(raw, chunk_bytes=10_000)
    assert len(chunks) == 26
    assert decompress_chunks(unpack_chunks(pack_chunks(chunks))) == raw
    with pytest.raises(InvalidArgumentError, match="max_bytes"):
        decompress_chunks(chunks, max_bytes=1000)
    with pytest.raises(InvalidArgumentError, match="truncated"):
        unpack_chunks(pack_chunks(chunks)[:-1])
    t = make_traj(steps=(0, 1))
    t.turns[0].info = {"a": [1, 2]}
    assert decode_payload(encode_payload(t, JsonTrajectoryCodec()), JsonTrajectoryCodec()) == t


def test_sqlite_restore_keeps_items_priorities_counts_and_never_reuses_keys(tmp_path):
    cfgs = [parse_table_config({"name": "p", "preset": "prioritized"})]
    s = ExperienceStore(SqliteStorage(tmp_path), cfgs, seed=0)
    keys = s.insert("p", [item(float(i + 1)) for i in range(20)], 0)
    s.sample("p", 5, 0)
    s.update_priorities("p", {keys[0]: 42.0, 10**6: 1.0})
    before = {r.key: (r.priority, r.times_sampled) for r in s.table("p").records()}
    info = s.table("p").info()
    s.storage.close()  # no clean shutdown of the store: only what was committed counts
    s2 = ExperienceStore(SqliteStorage(tmp_path), cfgs, seed=0)
    assert {r.key: (r.priority, r.times_sampled) for r in s2.table("p").records()} == before
    assert s2.table("p").info()["counters"] == info["counters"]
    (k,) = s2.insert("p", [item()], 0)
    assert k > max(keys)
    s2.close()


def test_checkpoint_does_not_stop_inserts(tmp_path):
    s = ExperienceStore(SqliteStorage(tmp_path), seed=0)
    s.insert("default", [item(nbytes=20_000) for _ in range(3000)], 0)  # ~60 MB to snapshot
    done = threading.Event()
    result = {}

    def ckpt():
        result["r"] = s.checkpoint()
        done.set()

    th = threading.Thread(target=ckpt)
    th.start()
    inserted_during = 0
    while not done.is_set():
        s.insert("default", [item()], 0)
        s.sample("default", 1, 0)
        inserted_during += 1
    th.join()
    assert result["r"].num_bytes > 50_000_000
    assert inserted_during >= 5, (
        f"only {inserted_during} inserts during a {result['r'].duration_s:.2f}s checkpoint"
    )
    s.close()


def test_tables_create_get_errors():
    s = ExperienceStore()
    cfg = parse_table_config({"name": "x", "preset": "queue"})
    assert s.create_table(cfg) is s.create_table(cfg)
    with pytest.raises(AlreadyExistsError):
        s.create_table(parse_table_config({"name": "x"}))
    with pytest.raises(NotFoundError, match="'nope'"):
        s.sample("nope", 1, 0)


def test_sharing_semantics_in_process():
    s = ExperienceStore(seed=0)
    a, b = LocalExperienceClient("a", s), LocalExperienceClient("b", s)
    a.share_experience(Trajectory("ep", "", session="run", turns=[Turn(0), Turn(1), Turn(3)]))
    b.share_experience(Trajectory("ep", "", session="run", turns=[Turn(0), Turn(2)]))
    b.share_experience(Trajectory("ep2", "", session="run", turns=[Turn(0)]))
    merged = a.get_all_experiences(episode_id="ep")
    assert [(m.turn.step, m.agent_id) for m in merged] == [(0, "a"), (0, "b"), (1, "a"), (2, "b"), (3, "a")]
    assert [m.episode_id for m in a.get_all_experiences(session="run")] == ["ep"] * 5 + ["ep2"]
    (x,) = a.sample("default", 1)
    assert x.trajectory.episode_id in ("ep", "ep2")


def test_merge_by_step_keeps_each_agent_order():
    t1 = Trajectory("e", "a", turns=[Turn(0, response_text="a0"), Turn(0, response_text="a0b"), Turn(2)])
    t2 = Trajectory("e", "b", turns=[Turn(1)])
    out = merge_by_step([t1, t2])
    assert [(m.agent_id, m.turn.step, m.turn.response_text) for m in out] == [
        ("a", 0, "a0"), ("a", 0, "a0b"), ("b", 1, ""), ("a", 2, ""),
    ]  # fmt: skip


def test_trajectory_validate_names_field():
    t = make_traj()
    t.turns[0].response_logprobs = [0.1]
    with pytest.raises(InvalidArgumentError, match=r"turns\[0\].response_logprobs"):
        t.validate()
    with pytest.raises(InvalidArgumentError, match="policy_version"):
        make_traj(version=-1).validate()
    for name in ("prompt_token_ids", "response_token_ids"):
        t = make_traj()
        setattr(t.turns[0], name, [3, -5])
        with pytest.raises(InvalidArgumentError, match=rf"turns\[0\]\.{name} holds the negative token id -5"):
            t.validate()
    assert time.time() - Trajectory("e", "a").created_at < 5


def test_close_ends_waiting_samples_and_inserts_at_once(tmp_path):
    """A sampler waiting on an empty table (and an insert waiting for room) must not outlive the store: the
    executor thread it runs in would otherwise keep the process from exiting until its deadline."""
    from marti.errors import UnavailableError

    cfgs = [
        parse_table_config({"name": "q", "preset": "queue", "max_size": 1}),
        parse_table_config({"name": "e", "preset": "queue"}),
    ]
    s = ExperienceStore(SqliteStorage(tmp_path), cfgs, seed=0)
    s.insert("q", [item(1.0)], 0)
    errors: list[BaseException] = []

    def run(fn) -> None:
        try:
            out = fn()
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            errors.append(e)
        else:  # an insert answers each item in-band
            errors.extend(x for x in out if isinstance(x, BaseException))

    waiters = [
        threading.Thread(target=run, args=(lambda: s.sample("e", 1, 600.0),)),
        threading.Thread(target=run, args=(lambda: s.insert("q", [item(2.0)], 600.0),)),
    ]
    for w in waiters:
        w.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    s.close()
    for w in waiters:
        w.join(10)
    assert time.monotonic() - t0 < 5 and not any(w.is_alive() for w in waiters)
    assert len(errors) == 2 and all(isinstance(e, UnavailableError) for e in errors), errors
    assert all("shutting down" in str(e) for e in errors)


def test_restart_with_a_smaller_max_size_evicts_the_excess_at_open_in_remover_order(tmp_path, caplog):
    """A store reopened with a smaller ``max_size`` kept the extra items until the next insert evicted them all
    at once, silently; now the excess goes at open (fifo remover: the oldest), counted, committed and logged."""
    big = [parse_table_config({"name": "t", "preset": "uniform", "max_size": 10})]
    s = ExperienceStore(SqliteStorage(tmp_path), big, seed=0)
    keys = s.insert("t", [item(episode=f"e{i}") for i in range(10)], 0)
    s.close()
    small = [parse_table_config({"name": "t", "preset": "uniform", "max_size": 4})]
    with caplog.at_level("WARNING"):
        s2 = ExperienceStore(SqliteStorage(tmp_path), small, seed=0)
    assert sorted(r.key for r in s2.table("t").records()) == keys[6:]
    assert s2.table("t").info()["counters"]["evictions"] == 6
    assert "table 't' held 10 items over its limits (max_size 4" in caplog.text and "evicted 6" in caplog.text
    s2.close()
    s3 = ExperienceStore(SqliteStorage(tmp_path), small, seed=0)  # the evictions were committed
    assert sorted(r.key for r in s3.table("t").records()) == keys[6:]
    s3.close()


def test_restart_of_a_block_table_over_its_max_size_is_refused_naming_it(tmp_path):
    """A ``block`` table never drops items to make room, so a smaller ``max_size`` at open is refused, not obeyed
    by evicting; the stored items stay for a start with the old config."""
    s = ExperienceStore(SqliteStorage(tmp_path), [parse_table_config({"name": "q", "preset": "queue"})])
    s.insert("q", [item(episode=f"e{i}") for i in range(5)], 0)
    s.close()
    storage = SqliteStorage(tmp_path)
    small = [parse_table_config({"name": "q", "preset": "queue", "max_size": 3})]
    with pytest.raises(InvalidArgumentError, match=r"table 'q' holds 5 items .* max_size 3 .* block"):
        ExperienceStore(storage, small)
    storage.close()
    s2 = ExperienceStore(SqliteStorage(tmp_path))
    assert len(s2.table("q")) == 5
    s2.close()


def _fill_the_disk(storage: SqliteStorage) -> None:
    """Let the database grow no further: SQLite then refuses a write with ``SQLITE_FULL`` ("database or disk is
    full"), the error a full disk gives (``PRAGMA max_page_count``, so no real disk has to fill up)."""
    pages = storage._wconn.execute("PRAGMA page_count").fetchone()[0]
    storage._wconn.execute(f"PRAGMA max_page_count = {pages}")


def test_an_insert_that_cannot_be_committed_leaves_the_table_and_can_be_sent_again(tmp_path):
    """A full disk was an INTERNAL error ("storage commit failed") whose items stayed in the table's memory: an
    idempotent retry was answered Duplicate for items a restart lost. Now RESOURCE_EXHAUSTED naming the table and
    the database, the items leave the table (not sampled, not counted), and the same call sent again once there is
    room inserts them durably."""
    from marti.errors import ResourceExhaustedError

    s = ExperienceStore(SqliteStorage(tmp_path), seed=0)
    s.create_table(parse_table_config({"name": "t", "preset": "uniform"}))
    s.insert("t", [item(episode="before")], 0)
    counters = s.table("t").info()["counters"]
    _fill_the_disk(s.storage)
    big = [
        NewItem(b"x" * 200_000, summarize(make_traj(episode=f"e{i}")), 1.0, idempotent=True) for i in range(4)
    ]
    said = r"table 't': store database .*store\.sqlite.* is full \(database or disk is full\): this commit did not reach"
    results = s.insert("t", big, 0)
    assert all(isinstance(r, ResourceExhaustedError) for r in results)
    assert re.search(said + r".*inserted items leave the table again", str(results[0]))
    assert [r.episode_id for r in s.table("t").records()] == ["before"]
    assert s.table("t").info()["counters"] == counters
    s.storage._wconn.execute("PRAGMA max_page_count = 1073741823")  # room again
    assert all(isinstance(k, int) for k in s.insert("t", big, 0))  # inserted, not Duplicate
    s.close()
    s2 = ExperienceStore(SqliteStorage(tmp_path), seed=0)
    assert sorted(r.episode_id for r in s2.table("t").records()) == ["before", "e0", "e1", "e2", "e3"]
    s2.close()


def test_an_item_taken_while_its_insert_fails_does_not_come_back_when_the_take_is_released(tmp_path):
    """A queue item a sampler took before its insert's commit failed is not in the table when the insert withdraws
    its items; a release of that take (the sampler went away) must not put the never-stored item back in the
    table: a retry of the insert would be a Duplicate of an item a restart loses."""
    from marti.errors import ResourceExhaustedError

    s = ExperienceStore(SqliteStorage(tmp_path), seed=0)
    s.create_table(parse_table_config({"name": "q", "preset": "queue"}))
    table, storage = s.table("q"), s.storage
    counters = table.info()["counters"]
    _fill_the_disk(storage)
    big = NewItem(b"x" * 200_000, summarize(make_traj(episode="e0")), 1.0, idempotent=True)
    errors, takes = [], []
    storage._write_lock.acquire()  # the writer holds the insert until the sampler took its item
    inserter = threading.Thread(target=lambda: errors.extend(table.insert([big], 0)))
    inserter.start()
    while not len(table):
        time.sleep(0.01)
    sampler = threading.Thread(target=lambda: takes.append(table.take(1, 5)))
    sampler.start()
    while len(table):
        time.sleep(0.01)
    storage._write_lock.release()
    inserter.join(10)
    sampler.join(10)
    assert errors and isinstance(errors[0], ResourceExhaustedError), "the insert should have failed"
    for take in takes:
        table.release(take)
    assert len(table) == 0 and table.info()["counters"] == counters
    storage._wconn.execute("PRAGMA max_page_count = 1073741823")  # room again
    assert all(isinstance(k, int) for k in s.insert("q", [big], 0))  # inserted, not Duplicate
    s.close()


def test_a_frame_without_a_declared_size_over_the_limit_is_said_to_be_over_it():
    """A valid zstd frame whose header declares no content size (a streaming compressor's) and that inflates past
    the limit is refused as over the limit, not as 'not a valid zstd frame' (zstd's own 'did not decompress full
    frame' at max_output_size); after a first chunk that fills the limit exactly, the next is over it too; a
    damaged frame is still said to be invalid."""
    import zstandard

    stream = zstandard.ZstdCompressor(write_content_size=False)
    big = stream.compress(b"x" * 5000)
    with pytest.raises(InvalidArgumentError) as over:
        decompress_chunks([big], max_bytes=4000, limit="max_item_bytes")
    assert str(over.value) == (
        "payload chunk 0 decompresses to more than the 4000 bytes left under max_item_bytes=4000"
    )
    with pytest.raises(InvalidArgumentError) as over:
        decompress_chunks([stream.compress(b"y" * 3000), big], max_bytes=3000, limit="max_item_bytes")
    assert (
        str(over.value)
        == "payload chunk 1 decompresses to more than the 0 bytes left under max_item_bytes=3000"
    )
    with pytest.raises(InvalidArgumentError, match="^payload chunk 0 is not a valid zstd frame"):
        decompress_chunks([big[:-3]], max_bytes=4000)
    assert decompress_chunks([big], max_bytes=5000) == b"x" * 5000
