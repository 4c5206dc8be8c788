"""Calls whose items add up to more than one gRPC message (``max_message_bytes``) are cut into messages under it,
both ways (review s4 findings 8 and 13), over a real store on a free port whose limit is 1 MiB (64 MiB by default:
the same cuts, with smaller items)."""

from __future__ import annotations

import asyncio
import random

import pytest

from marti.clients.experience import AsyncExperienceSharingClient, ExperienceSharingClient
from marti.errors import ResourceExhaustedError
from marti.rpc.testing import serve_in_thread
from marti.types.trajectory import Trajectory, Turn
from services.experience_store.__main__ import make_spec
from services.experience_store.settings import StoreSettings

LIMIT = 1 << 20


@pytest.fixture
def address(tmp_path):
    """A running store whose messages are at most :data:`LIMIT` bytes, both ways."""
    settings = StoreSettings(port=0, data_dir=str(tmp_path / "data"), max_message_bytes=LIMIT)
    with serve_in_thread(lambda: [make_spec(settings)[0]], settings) as server:
        yield server.address


def _big(episode_id: str, tokens: int = 75_000, seed: int = 0) -> Trajectory:
    """A trajectory of about 4.5 bytes per token encoded (random token ids barely compress): ~340 KB."""
    rng = random.Random(seed)
    ids = [rng.randrange(1 << 30) for _ in range(tokens)]
    return Trajectory(
        episode_id=episode_id, agent_id="a", session="big", turns=[Turn(step=0, prompt_token_ids=ids)]
    )


def _client(address: str) -> ExperienceSharingClient:
    return ExperienceSharingClient(agent_id="a", address=address, max_message_bytes=LIMIT)


def test_an_insert_over_one_message_is_cut_by_bytes_and_every_item_goes_in(address):
    """10 items of ~340 KB (3.4 MB) with the default ``batch_items=64``: one message before the fix, refused by
    the store's transport (and, with a smaller batch_items, a stream cut after its first messages went in)."""
    with _client(address) as client:
        client.create_table("t", sampler="fifo", remover="fifo", max_size=100)
        team = [_big(f"e{i}", seed=i) for i in range(10)]
        keys = client.share_experiences(team, table="t")
        assert len(set(keys)) == 10 and client.info("t").size == 10
        assert [r.duplicate for r in client.insert("t", team)] == [True] * 10


def test_an_item_that_alone_is_over_a_message_is_refused_before_anything_is_sent(address):
    with _client(address) as client:
        client.create_table("t", sampler="fifo", remover="fifo", max_size=100)
        with pytest.raises(
            ResourceExhaustedError, match=r"item 1 of 2 \(episode 'huge'.*max_message_bytes=1048576"
        ):
            client.share_experiences([_big("small", 10), _big("huge", 300_000)], table="t")
        assert client.info("t").size == 0


def test_a_sample_and_a_read_over_one_message_come_in_several(address):
    """The store packs items by bytes as well as by ``max_batch_items``: a 10-item sample and a session read of
    3.4 MB come whole (before the fix: RESOURCE_EXHAUSTED "Sent message larger than max")."""
    with _client(address) as client:
        client.create_table("t", preset="queue", max_size=100)
        client.share_experiences([_big(f"e{i}", seed=i) for i in range(10)], table="t")
        got = client.get_items(session="big", tables=["t"])
        assert [s.trajectory.episode_id for s in got] == [f"e{i}" for i in range(10)]
        assert got[3].trajectory.turns[0].prompt_token_ids == _big("e3", seed=3).turns[0].prompt_token_ids

        async def sample():
            async with AsyncExperienceSharingClient("a", address, max_message_bytes=LIMIT) as aclient:
                return await aclient.sample("t", 10, timeout_s=5)

        sampled = asyncio.run(sample())
        assert [s.trajectory.episode_id for s in sampled] == [f"e{i}" for i in range(10)]
        assert client.info("t").size == 0


def test_an_item_that_alone_is_over_a_response_is_refused_naming_the_setting_and_stays(tmp_path):
    """A store restarted with a lower ``max_message_bytes`` than its items need: a read or a sample of such an
    item fails with an error naming the item and ``max_message_bytes (MARTI_STORE_MAX_MESSAGE_BYTES)``, and the
    sampled item is put back (not a bare transport error)."""
    data = str(tmp_path / "data")
    roomy = StoreSettings(port=0, data_dir=data, max_message_bytes=4 * LIMIT)
    with serve_in_thread(lambda: [make_spec(roomy)[0]], roomy) as server:
        with ExperienceSharingClient("a", server.address, max_message_bytes=4 * LIMIT) as client:
            client.create_table("t", preset="queue", max_size=10)
            client.share_experience(_big("two-mb", 400_000), table="t")
    small = StoreSettings(port=0, data_dir=data, max_message_bytes=LIMIT)
    with serve_in_thread(lambda: [make_spec(small)[0]], small) as server, _client(server.address) as client:
        limit = r"episode 'two-mb'.*max_message_bytes \(MARTI_STORE_MAX_MESSAGE_BYTES\)=1048576"
        with pytest.raises(ResourceExhaustedError, match=limit):
            client.get_items(session="big", tables=["t"])
        with pytest.raises(ResourceExhaustedError, match=limit):
            client.sample("t", 1, timeout_s=2)
        assert client.info("t").size == 1


def test_an_item_the_store_could_never_hand_out_is_refused_at_insert(address):
    """An item that fits in an insert message but not in a sample or read response (a client whose
    ``max_message_bytes`` is above the store's, or within a response's extra fields of the limit): the store
    took it and then failed every sample that picked it (a FIFO queue jammed behind it) and every read. Now the
    insert is refused with RESOURCE_EXHAUSTED naming the item and the setting, the table stays empty, and the
    queue goes on."""
    with (
        ExperienceSharingClient("a", address, max_message_bytes=2 * LIMIT) as roomy,
        _client(address) as client,
    ):
        client.create_table("q", preset="queue", max_size=10)
        limit = r"item 0 of 1 \(episode 'edge'.*max_message_bytes \(MARTI_STORE_MAX_MESSAGE_BYTES\)=1048576"
        with pytest.raises(ResourceExhaustedError, match=limit):
            roomy.share_experience(_big("edge", 250_000), table="q")
        assert client.info("q").size == 0
        client.share_experience(_big("next", 10), table="q")
        assert [s.trajectory.episode_id for s in client.sample("q", 1, timeout_s=5)] == ["next"]


def test_a_client_whose_max_message_bytes_is_not_the_stores_is_told_so(address):
    """A client with another ``max_message_bytes`` than the store's got gRPC's bare "Received message larger
    than max" (RESOURCE_EXHAUSTED): now the error says which side's limit it hit and to make them the same. Nothing
    is lost either way: the refused insert stored nothing, the refused sample put its item back."""
    with (
        ExperienceSharingClient("a", address, max_message_bytes=4 * LIMIT) as roomy,
        ExperienceSharingClient("a", address, max_message_bytes=LIMIT // 2) as narrow,
    ):
        roomy.create_table("q", preset="queue", max_size=10)
        with pytest.raises(
            ResourceExhaustedError,
            match="a request was larger than the server's max_message_bytes.*max_message_bytes=N of",
        ):
            roomy.share_experiences([_big(f"e{i}", seed=i) for i in range(4)], table="q")
        assert roomy.info("q").size == 0
        roomy.share_experience(_big("big", 150_000), table="q")
        with pytest.raises(
            ResourceExhaustedError,
            match="a response was larger than this client's receive limit.*max_message_bytes=N of an experience-store",
        ):
            narrow.sample("q", 1, timeout_s=5)
        assert [s.trajectory.episode_id for s in roomy.sample("q", 1, timeout_s=5)] == ["big"]
