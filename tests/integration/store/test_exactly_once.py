"""The store owns exactly-once (issue 30, item 1): an insert idempotent by ``(table, episode_id, agent_id)`` (a retry
after a lost answer adds no second copy; a team's agents each insert their own trajectory of the episode), a delete by episode ids, and a take of whole groups, over a real gRPC store."""

from __future__ import annotations

import asyncio
import time

import pytest

from marti.clients.experience import AsyncExperienceSharingClient, ExperienceSharingClient
from marti.errors import NotFoundError, OutOfRangeError, UnavailableError
from marti.types.trajectory import Trajectory, Turn


def _traj(
    episode_id: str, group_id: str = "", group_size: int = 0, version: int = 0, agent_id: str = "a"
) -> Trajectory:
    turn = Turn(step=0, prompt_token_ids=[1], response_token_ids=[2], response_logprobs=[-0.5])
    return Trajectory(
        episode_id=episode_id, agent_id=agent_id, policy_version=version, turns=[turn], group_id=group_id,
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


def test_a_teams_trajectories_of_one_episode_all_go_in_and_each_agents_retry_is_a_duplicate(store):
    """Review s4 finding 7: the agents of a team share the episode id; each agent's trajectory is its own item, in
    one table, and "once" holds per agent (while the table holds them, and after a take)."""
    client, _ = store
    team = [_traj("ep7", agent_id=a) for a in ("agent_1", "agent_2", "agent_3")]
    first = client.insert("q", team)
    assert [r.duplicate for r in first] == [False, False, False]
    assert len({r.key for r in first}) == 3 and client.info("q").size == 3
    got = client.get_trajectories(episode_id="ep7", tables=["q"])
    assert sorted(t.agent_id for t in got) == ["agent_1", "agent_2", "agent_3"]
    retried = client.insert("q", team[1:])
    assert [(r.duplicate, r.key) for r in retried] == [(True, first[1].key), (True, first[2].key)]
    assert sorted(s.trajectory.agent_id for s in client.sample_batch("q", 3).items) == [
        "agent_1", "agent_2", "agent_3",
    ]  # fmt: skip
    assert [r.duplicate for r in client.insert("q", team)] == [True, True, True]  # taken: still once
    assert not client.insert("q", [_traj("ep7", agent_id="agent_4")])[0].duplicate
    assert client.delete("q", ["ep7"]) == 1
    assert client.insert("q", [_traj("ep7", agent_id="agent_5")])[0].duplicate  # deleted: for every agent


def test_a_retried_insert_after_a_lost_answer_is_not_duplicated(store, monkeypatch):
    """The store commits the batch, then its answer is lost (the stream fails with UNAVAILABLE, as when a proxy
    drops it): the caller cannot know the item went in, retries, and the table still holds one copy."""
    client, servicer = store
    original, lost = servicer._insert_batch, []

    def answer_lost_once(req, abandoned):
        resp = original(req, abandoned)  # committed
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


def test_an_insert_stream_that_breaks_carries_the_keys_the_store_confirmed_before(store, monkeypatch):
    """Review s4 finding 8: a stream error (here UNAVAILABLE on the second message, as a broken connection) says
    which items went in, as a partly refused insert does, so the caller knows what is stored."""
    client, servicer = store
    original, calls = servicer._insert_batch, []

    def second_message_fails(req, abandoned):
        calls.append(req)
        if len(calls) == 2:
            raise UnavailableError("the connection broke")
        return original(req, abandoned)

    monkeypatch.setattr(servicer, "_insert_batch", second_message_fails)
    with pytest.raises(UnavailableError, match=r"2 of the 4 items were inserted") as err:
        client.share_experiences([_traj(f"e{i}") for i in range(4)], table="q", batch_items=2)
    keys = [int(k) for k in err.value.metadata["inserted_keys"].split(",")]
    assert err.value.metadata["inserted"] == "2" and len(keys) == 2
    assert sorted(s.key for s in client.get_items(episode_id="e0", tables=["q"])) == keys[:1]


def test_delete_by_episode_ids_returns_the_count_and_refuses_a_late_insert(store):
    client, _ = store
    client.insert("q", [_traj(f"e{i}") for i in range(3)])
    assert client.delete("q", ["e0", "e2", "never-inserted"]) == 2
    assert client.info("q").size == 1
    assert client.insert("q", [_traj("e0")])[0].duplicate  # a failed attempt's late retry stays out
    assert _episodes(client.sample_batch("q", 1)) == ["e1"]


def test_deleting_unsampled_items_of_a_queue_gives_their_room_back(store):
    """A rollout attempt's episodes deleted from a full queue (never sampled) leave it as roomy as before: the
    queue's rate limiter does not keep counting them as waiting, so a replayed attempt's inserts go in at once."""
    client, _ = store
    client.create_table("small", preset="queue", max_size=2)
    for attempt in range(3):
        client.insert("small", [_traj(f"a{attempt}"), _traj(f"b{attempt}")], timeout_s=5.0)
        assert client.delete("small", [f"a{attempt}", f"b{attempt}"]) == 2
    client.insert("small", [_traj("a"), _traj("b")], timeout_s=5.0)  # RateLimitedError without the withdrawal
    assert _episodes(client.sample_batch("small", 2)) == ["a", "b"]
    assert client.info("small").rate_limiter_diff == 0


def test_a_group_take_takes_whole_groups_and_passes_over_one_missing_members(store):
    client, _ = store
    client.insert("q", [_traj("a1", "A", 2), _traj("b1", "B", 2), _traj("a2", "A", 2), _traj("c", "", 0)])
    got = client.sample_batch("q", 1, whole_groups=True)
    assert _episodes(got) == ["a1", "a2"]  # the whole group, past batch_size
    got = client.sample_batch("q", 1, whole_groups=True, allow_partial=True)
    assert _episodes(got) == ["c"]  # B still misses a member: passed over, kept
    client.insert("q", [_traj("b2", "B", 2)])
    assert _episodes(client.sample_batch("q", 2, whole_groups=True)) == ["b1", "b2"]


def test_a_group_larger_than_the_table_is_refused_at_once_not_waited_for(store):
    """A group of 3 in a queue of max_size 2 can never be in it whole: a whole-groups sample says so at once
    (it used to wait its timeout while the writer of the third member waited for room), and leaves the items."""
    client, _ = store
    client.create_table("small", preset="queue", max_size=2)
    client.insert("small", [_traj("a1", "A", 3), _traj("a2", "A", 3)])
    start = time.monotonic()
    with pytest.raises(OutOfRangeError, match=r"group 'A' has group_size 3 .* max_size 2 .* max_size >= 3"):
        client.sample_batch("small", 1, whole_groups=True, timeout_s=60)
    assert time.monotonic() - start < 30  # refused, not the 60 s wait
    assert client.info("small").size == 2
    assert _episodes(client.sample_batch("small", 2)) == ["a1", "a2"]  # without whole_groups: taken


def test_a_table_that_evicts_passes_a_group_bigger_than_it_over(store):
    """On a FIFO table that evicts (max_size 4), a group of 5 comes and goes, never whole: a whole-groups sample
    takes the whole group beside it (the review's case: the queue's refusal must not reach tables that evict)."""
    client, _ = store
    client.create_table("t", sampler="fifo", remover="fifo", max_size=4)
    client.insert("t", [_traj("a1", "A", 5), _traj("a2", "A", 5), _traj("b1", "B", 2), _traj("b2", "B", 2)])
    assert _episodes(client.sample_batch("t", 2, whole_groups=True, timeout_s=5)) == ["b1", "b2"]


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


def test_a_group_id_used_again_is_a_new_group_after_a_dropped_one_and_beside_a_waiting_one(store):
    """Group ids recur: the trainer's seeds wrap (a finite problem set) and a client reuses a problem's id for its
    next group. A dropped group takes only its own late member with it, not the next group of the same id; two
    groups of one id in the table are taken one at a time."""
    client, _ = store
    client.insert("q", [_traj("g1", "G", 2, version=0)])
    got = client.sample_batch("q", 1, whole_groups=True, allow_partial=True, current_policy_version=1)
    assert got.stale_episode_ids == ["g1"]  # G dropped, one member still to come
    client.insert("q", [_traj("g2", "G", 2, version=1)])  # its late member: dropped
    client.insert("q", [_traj(f"n{i}", "G", 2, version=1) for i in range(4)])  # two later groups of id G
    got = client.sample_batch("q", 3, whole_groups=True, current_policy_version=1)
    assert (got.dropped_episode_ids, _episodes(got)) == (["g2"], ["n0", "n1"])
    assert _episodes(client.sample_batch("q", 1, whole_groups=True, current_policy_version=1)) == ["n2", "n3"]


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
            assert await client.reset("q") == 0
            assert not (await client.insert("q", [_traj("x1", "X", 2)]))[0].duplicate  # a new job's scope
            return [s.trajectory.episode_id for s in got.items]

    assert asyncio.run(run()) == ["x1", "x2"]


def _job(client, episodes: list[Trajectory]) -> list[str]:
    """One job's use of its table: claim it (reset), insert its episodes idempotently, take them in one batch."""
    client.reset("q")
    assert not any(r.duplicate for r in client.insert("q", episodes))
    return _episodes(client.sample_batch("q", len(episodes), whole_groups=True))


def test_a_second_job_that_reuses_episode_and_group_ids_is_not_answered_duplicate(store):
    """The scope of "once" is one job: the trainer resets its tables when a job starts, so a second job of the same
    training_name whose external clients count episode ids (and groups) from 0 again gets every episode in, while a
    retry within the second job is still a duplicate. The first job also left an item in the table and had a group
    dropped for staleness: the second job's group of the same id is taken, not dropped."""
    client, _ = store
    first = [_traj("e0", "G", 2), _traj("e1", "G", 2)]
    assert _job(client, first) == ["e0", "e1"]
    client.insert("q", [_traj("late", "H", 2, version=0), _traj("h2", "H", 2, version=1)])
    got = client.sample_batch("q", 2, whole_groups=True, current_policy_version=1)
    assert got.dropped_episode_ids == ["h2"]  # group H dropped whole: remembered by the table
    client.insert("q", [_traj("left")])  # the first job stops with an item left in its table
    assert client.reset("q") == 1
    info = client.info("q")
    assert (info.size, info.inserts, info.samples, info.deletes, info.stale_removed) == (0, 0, 0, 0, 0)
    second = [_traj("e0", "G", 2), _traj("e1", "G", 2), _traj("h1", "H", 2, 1), _traj("h2", "H", 2, 1)]
    assert _job(client, second) == ["e0", "e1", "h1", "h2"]
    assert client.insert("q", [_traj("e0", "G", 2)])[0].duplicate  # a retry within the second job


def test_a_reset_table_admits_as_many_inserts_as_a_new_one(store):
    """Reset starts the queue's rate limiter over: a table emptied by reset (not by sampling) takes max_size
    inserts again without waiting, and a queue of items inserted after the reset is sampled in order."""
    client, _ = store
    client.create_table("small", preset="queue", max_size=2)
    client.insert("small", [_traj("a"), _traj("b")])
    assert client.reset("small") == 2
    client.insert("small", [_traj("a"), _traj("b")], timeout_s=5.0)  # would wait (RateLimitedError) unreset
    assert _episodes(client.sample_batch("small", 2)) == ["a", "b"]
    assert client.reset("small") == 0


def test_reset_of_an_unknown_table_is_not_found_naming_it(store_server):
    addr, _ = store_server
    with (
        ExperienceSharingClient(agent_id="a", address=addr) as client,
        pytest.raises(NotFoundError, match="nope"),
    ):
        client.reset("nope")
