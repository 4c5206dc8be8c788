"""The store's request limits at their edge, over real gRPC: ``max_sample_items`` (a Sample's batch_size) and
``max_wait_ms`` (an Insert's or Sample's timeout). A value at the limit is served; one past it is refused with
OutOfRangeError naming the SDK argument, before anything is taken or inserted (a huge batch_size used to be
taken with replacement item by item, growing the store and the client without bound)."""

from __future__ import annotations

import time

import pytest

import marti
from marti.errors import InvalidArgumentError, OutOfRangeError
from marti.rpc.testing import serve_in_thread
from services.experience_store.__main__ import make_spec
from services.experience_store.settings import StoreSettings

MAX_ITEMS, MAX_WAIT_MS = 4, 30_000  # a wait of MAX_WAIT_MS is far longer than any refusal takes


@pytest.fixture
def client(tmp_path):
    """A store limited to ``MAX_ITEMS`` items per sample and ``MAX_WAIT_MS`` per wait, with a uniform table
    ``u`` holding one item; yields a client of it."""
    settings = StoreSettings(
        port=0,
        data_dir=str(tmp_path),
        max_sample_items=MAX_ITEMS,
        max_wait_ms=MAX_WAIT_MS,
        default_timeout_ms=1000,
    )
    with serve_in_thread(lambda: [make_spec(settings)[0]], settings) as server:
        with marti.ExperienceSharingClient("a1", server.address, timeout_s=10.0) as store:
            store.create_table("u", preset="uniform")  # samples with replacement: any batch can fill
            store.share_experience(marti.Trajectory(episode_id="e", agent_id="a1"), table="u")
            yield store


@pytest.mark.parametrize("allow_partial", [True, False])
def test_batch_size_past_max_sample_items_is_refused_before_any_take(client, allow_partial: bool) -> None:
    assert len(client.sample("u", MAX_ITEMS, timeout_s=1.0, allow_partial=allow_partial)) == MAX_ITEMS
    samples = client.info("u").samples
    with pytest.raises(OutOfRangeError, match=r"batch_size.*max_sample_items 4"):
        client.sample("u", MAX_ITEMS + 1, timeout_s=1.0, allow_partial=allow_partial)
    assert client.info("u").samples == samples  # nothing taken


def test_wait_past_max_wait_ms_is_refused(client) -> None:
    edge, past = MAX_WAIT_MS / 1000, MAX_WAIT_MS / 1000 + 0.001
    assert len(client.sample("u", 1, timeout_s=edge)) == 1
    client.share_experience(marti.Trajectory(episode_id="e2", agent_id="a1"), table="u", timeout_s=edge)
    with pytest.raises(OutOfRangeError, match=rf"timeout_s.*max_wait_ms {MAX_WAIT_MS}"):
        client.sample("u", 1, timeout_s=past)
    with pytest.raises(OutOfRangeError, match=rf"timeout_s.*max_wait_ms {MAX_WAIT_MS}"):
        client.share_experience(marti.Trajectory(episode_id="e3", agent_id="a1"), table="u", timeout_s=past)
    assert client.info("u").size == 2  # e and e2, not e3


def test_defaults_are_finite() -> None:
    """Every deployment has the limits, not only a configured one."""
    s = StoreSettings(port=0)
    assert 0 < s.max_sample_items <= 1 << 20 and 0 < s.max_wait_ms <= 86_400_000


def test_an_item_past_max_item_bytes_is_refused_naming_that_setting(tmp_path) -> None:
    """An item larger than ``max_item_bytes`` (uncompressed) is refused naming that setting and its variable, not
    a table's ``max_bytes`` (the per-table cap, unset here)."""
    settings = StoreSettings(port=0, data_dir=str(tmp_path), max_item_bytes=4096)
    turn = marti.Turn(step=0, prompt_token_ids=list(range(5000)), response_token_ids=[1])
    with serve_in_thread(lambda: [make_spec(settings)[0]], settings) as server:
        with marti.ExperienceSharingClient("a1", server.address, timeout_s=5.0) as store:
            with pytest.raises(InvalidArgumentError) as err:
                store.share_experience(marti.Trajectory(episode_id="big", agent_id="a1", turns=[turn]))
    assert "max_item_bytes (MARTI_STORE_MAX_ITEM_BYTES)=4096" in str(err.value)


def test_a_whole_batch_larger_than_a_queue_can_hold_is_refused_at_once(client) -> None:
    """``sample(batch_size=4)`` on a queue of ``max_size`` 3 (each item sampled once) can never be filled: it waited
    its whole ``timeout_s`` (30 s by default, up to a day) and then raised DeadlineExceededError. It is now refused
    at once with OutOfRangeError naming the batch size, the table, ``max_size`` and ``max_times_sampled``;
    nothing is taken. ``allow_partial`` still returns what there is, and a batch the table can hold is served."""
    client.create_table("q", preset="queue", max_size=3)
    client.share_experiences(
        [marti.Trajectory(episode_id=f"q{i}", agent_id="a1") for i in range(3)], table="q"
    )
    started = time.monotonic()
    with pytest.raises(OutOfRangeError, match=r"batch_size 4 .*'q'.*max_size 3.*max_times_sampled 1"):
        client.sample("q", 4, timeout_s=MAX_WAIT_MS / 1000)
    assert time.monotonic() - started < MAX_WAIT_MS / 2000  # at once: a wait takes the whole 30 s
    assert (client.info("q").size, client.info("q").samples) == (3, 0)
    assert len(client.sample("q", 4, timeout_s=1.0, allow_partial=True)) == 3
    client.share_experiences(
        [marti.Trajectory(episode_id=f"r{i}", agent_id="a1") for i in range(3)], table="q"
    )
    assert len(client.sample("q", 3, timeout_s=1.0)) == 3


def test_allow_partial_with_nothing_in_time_raises_deadline_exceeded(client) -> None:
    """``allow_partial=True`` returns what came within ``timeout_s``, at least one item: a sample of an empty
    table raises DeadlineExceededError once ``timeout_s`` passed (the docs said "what came is returned", which
    read as an empty list)."""
    client.create_table("empty", preset="queue", max_size=3)
    started = time.monotonic()
    with pytest.raises(marti.errors.DeadlineExceededError, match="'empty' timed out"):
        client.sample("empty", 2, timeout_s=0.5, allow_partial=True)
    assert 0.5 <= time.monotonic() - started < 5


def test_a_rate_limiter_past_float64_precision_is_refused_by_client_and_server(tmp_path) -> None:
    """spi 1e308 and max_diff 1e308 let one insert in and none after (a sample no longer moved the diff): the
    client refuses it before sending, and the store refuses the same config sent raw (INVALID_ARGUMENT)."""
    import grpc

    from marti.api.experience.v1 import experience_pb2 as pb
    from marti.api.experience.v1 import experience_service_pb2 as spb
    from marti.api.experience.v1 import experience_service_pb2_grpc as sgrpc

    limiter = {"kind": "custom", "samples_per_insert": 1e308, "min_size_to_sample": 1, "max_diff": 1e308}
    raw = pb.TableConfig(name="huge", rate_limiter=pb.RateLimiterConfig(**limiter))
    settings = StoreSettings(port=0, data_dir=str(tmp_path))
    with serve_in_thread(lambda: [make_spec(settings)[0]], settings) as server:
        with marti.ExperienceSharingClient("a1", server.address, timeout_s=10.0) as store:
            with pytest.raises(InvalidArgumentError, match=r"samples_per_insert 1e\+308 is out of range"):
                store.create_table("huge", rate_limiter=limiter)
        with grpc.insecure_channel(server.address) as channel:
            with pytest.raises(grpc.RpcError) as err:
                sgrpc.ExperienceServiceStub(channel).CreateTable(
                    spb.CreateTableRequest(config=raw), timeout=10
                )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "samples_per_insert 1e+308 is out of range" in err.value.details()
