"""The store owns exactly-once (issue 30, item 1): an insert idempotent by ``(table, episode_id)`` (a retry after a
lost answer adds no second copy), a delete by episode ids, and a take of whole groups, over a real gRPC store."""

from __future__ import annotations

import asyncio

import pytest

from marti.clients.experience import AsyncExperienceSharingClient, ExperienceSharingClient
from marti.errors import UnavailableError
from marti.trajectory import Trajectory, Turn


def _traj(episode_id: str, group_id: str = "", group_size: int = 0, version: int = 0) -> Trajectory:
    turn = Turn(step=0, prompt_token_ids=[1], response_token_ids=[2], response_logprobs=[-0.5])
    return Trajectory(
        episode_id=episode_id, agent_id="a", policy_version=version, turns=[turn], group_id=group_id,
        group_size=group_size,
    )  # fmt: skip


@pytest.fixture
def store(store_server):
    addr, servicer = store_server
    with ExperienceSharingClient(agent_id="a", address=addr) as client:
        client.create_table("q", preset="queue", max_policy_lag=0)
        yield client, servicer


def _episodes(batch) -> list[str]:
    return [s.trajectory.episode_id for s in batch.items]


def test_an_idempotent_insert_of_an_episode_the_table_holds_or_took_adds_no_copy(store):
    client, _ = store
    (first,) = client.insert("q", [_traj("e1")])
    assert not first.duplicate
    (again,) = client.insert("q", [_traj("e1")])
    assert again.duplicate and again.key == first.key
    assert client.info("q").size == 1
    assert _episodes(client.sample_batch("q", 1)) == ["e1"]
    (after_take,) = client.insert("q", [_traj("e1")])
    assert after_take.duplicate and after_take.key == 0
    assert client.info("q").size == 0
    # the plain insert is unchanged: a second copy goes in
    client.share_experience(_traj("e2"), table="q")
    client.share_experience(_traj("e2"), table="q")
    assert client.info("q").size == 2


def test_a_retried_insert_after_a_lost_answer_is_not_duplicated(store, monkeypatch):
    """The store commits the batch, then its answer is lost (the stream fails with UNAVAILABLE, as when a proxy
    drops it): the caller cannot know the item went in, retries, and the table still holds one copy."""
    client, servicer = store
    original, lost = servicer._insert_batch, []

    def answer_lost_once(req):
        resp = original(req)  # committed
        if not lost:
            lost.append(resp)
            raise UnavailableError("the answer was lost on its way back")
        return resp

    monkeypatch.setattr(servicer, "_insert_batch", answer_lost_once)
    with pytest.raises(UnavailableError):
        client.insert("q", [_traj("e1"), _traj("e2")])
    assert client.info("q").size == 2  # it did go in
    retried = client.insert("q", [_traj("e1"), _traj("e2")])
    assert [r.duplicate for r in retried] == [True, True]
    assert [r.key for r in retried] == [c.key for c in lost[0].confirmations]
    assert client.info("q").size == 2
    assert _episodes(client.sample_batch("q", 2)) == ["e1", "e2"]


def test_delete_by_episode_ids_returns_the_count_and_refuses_a_late_insert(store):
    client, _ = store
    client.insert("q", [_traj(f"e{i}") for i in range(3)])
    assert client.delete("q", ["e0", "e2", "never-inserted"]) == 2
    assert client.info("q").size == 1
    assert client.insert("q", [_traj("e0")])[0].duplicate  # a failed attempt's late retry stays out
    assert _episodes(client.sample_batch("q", 1)) == ["e1"]


def test_a_group_take_takes_whole_groups_and_passes_over_one_missing_members(store):
    client, _ = store
    client.insert("q", [_traj("a1", "A", 2), _traj("b1", "B", 2), _traj("a2", "A", 2), _traj("c", "", 0)])
    got = client.sample_batch("q", 1, whole_groups=True)
    assert _episodes(got) == ["a1", "a2"]  # the whole group, past batch_size
    got = client.sample_batch("q", 1, whole_groups=True, allow_partial=True)
    assert _episodes(got) == ["c"]  # B still misses a member: passed over, kept
    client.insert("q", [_traj("b2", "B", 2)])
    assert _episodes(client.sample_batch("q", 2, whole_groups=True)) == ["b1", "b2"]


def test_a_group_with_a_stale_member_is_dropped_whole_with_its_late_members(store):
    client, _ = store
    client.insert("q", [_traj("g1", "G", 3, version=0), _traj("g2", "G", 3, version=1), _traj("f", "", 0, 1)])
    got = client.sample_batch("q", 3, whole_groups=True, allow_partial=True, current_policy_version=1)
    assert _episodes(got) == ["f"]
    assert (got.stale_episode_ids, got.dropped_episode_ids) == (["g1"], ["g2"])
    assert got.consumed == 3
    client.insert("q", [_traj("g3", "G", 3, version=1)])  # the late member of the dropped group
    late = client.sample_batch("q", 1, whole_groups=True, current_policy_version=1)
    assert (late.items, late.dropped_episode_ids) == ([], ["g3"])
    assert client.info("q").size == 0


def test_the_async_client_inserts_once_deletes_and_takes_groups(store_server):
    addr, _ = store_server

    async def run():
        async with AsyncExperienceSharingClient(agent_id="a", address=addr) as client:
            await client.create_table("q", preset="queue")
            assert not (await client.insert("q", [_traj("x1", "X", 2)]))[0].duplicate
            assert (await client.insert("q", [_traj("x1", "X", 2)]))[0].duplicate
            await client.insert("q", [_traj("x2", "X", 2), _traj("y", "", 0)])
            assert await client.delete("q", ["y"]) == 1
            got = await client.sample_batch("q", 1, whole_groups=True)
            return [s.trajectory.episode_id for s in got.items]

    assert asyncio.run(run()) == ["x1", "x2"]
