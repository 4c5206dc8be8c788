"""The store over real gRPC: SDK calls, error codes, credits, sharing semantics."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest

from marti.clients.experience import AsyncExperienceSharingClient, ExperienceSharingClient
from marti.errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    RateLimitedError,
    ResourceExhaustedError,
)
from marti.types.trajectory import Trajectory, Turn


def traj(agent="a1", episode="ep1", steps=(0,), version=0, role="planner", n_resp=3, reward=1.0, session="s"):
    turns = [
        Turn(step=s, prompt_token_ids=[1, 2, 3], response_token_ids=list(range(n_resp)),
             response_logprobs=[-0.5] * n_resp, reward=reward, info={"k": s}, response_text=f"{agent}@{s}")
        for s in steps
    ]  # fmt: skip
    return Trajectory(
        episode_id=episode, agent_id=agent, session=session, role=role, policy_version=version, turns=turns
    )


def test_share_sample_roundtrip(store_server):
    addr, _ = store_server
    with ExperienceSharingClient("a1", addr) as c:
        t = traj(steps=(0, 1))
        key = c.share_experience(t)
        (item,) = c.sample("default", 1)
        assert item.key == key and item.probability == pytest.approx(1.0) and item.times_sampled == 1
        got = item.trajectory
        assert got.turns[1].response_logprobs == pytest.approx([-0.5] * 3)
        assert got.turns[0].info == {"k": 0} and got.turns[1].response_text == "a1@1"
        assert (got.episode_id, got.agent_id, got.role, got.session) == ("ep1", "a1", "planner", "s")
        info = c.info("default")
        assert (info.size, info.inserts, info.samples) == (1, 1, 1)


def test_get_all_experiences_merges_agents_by_step(store_server):
    addr, _ = store_server
    a, b = ExperienceSharingClient("a1", addr), ExperienceSharingClient("a2", addr)
    a.create_table("a1", preset="uniform")
    a.share_experience(traj("a1", steps=(0, 1, 2)), table="a1")
    b.share_experience(traj("a2", steps=(0, 2)))
    b.share_experience(traj("a2", episode="other", steps=(0,)))
    merged = a.get_all_experiences(episode_id="ep1")
    assert [(m.turn.step, m.agent_id) for m in merged] == [
        (0, "a1"),
        (0, "a2"),
        (1, "a1"),
        (2, "a1"),
        (2, "a2"),
    ]
    assert len(a.get_all_experiences(session="s")) == 6
    assert len(a.get_trajectories(policy_version=0)) == 3
    with pytest.raises(InvalidArgumentError):
        a.get_all_experiences()


def test_error_codes(store_server):
    addr, _ = store_server
    c = ExperienceSharingClient("a1", addr)
    with pytest.raises(NotFoundError, match="nope"):
        c.sample("nope", 1)
    with pytest.raises(NotFoundError):
        c.share_experience(traj(), table="nope")
    with pytest.raises(InvalidArgumentError, match="min_size_to_sample"):  # unknown field, named
        c.create_table("small", max_bytes=2000, min_size_to_sample=1)
    c.create_table("tiny", preset="uniform", max_bytes=300)
    c.share_experience(traj(n_resp=5), table="tiny")
    with pytest.raises(ResourceExhaustedError, match="max_bytes=300"):
        c.share_experience(traj(n_resp=5000), table="tiny")
    assert c.info("tiny").size == 1  # the table keeps its items
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(InvalidArgumentError, match="priority"):
            c.share_experience(traj(), priority=bad)
    c.create_table("sig", signature={"require_logprobs": True, "roles": ["planner"]})
    t = traj()
    t.turns[0].response_logprobs = []
    with pytest.raises(InvalidArgumentError, match=r"turns\[0\].response_logprobs"):
        c.share_experience(t, table="sig")
    with pytest.raises(InvalidArgumentError, match="trajectory.role"):
        c.share_experience(traj(role="critic"), table="sig")
    with pytest.raises(AlreadyExistsError):
        c.create_table("sig", preset="queue")
    with pytest.raises(InvalidArgumentError, match="deadlock"):
        c.create_table("dead", rate_limiter={"kind": "sample_to_insert_ratio", "samples_per_insert": 2,
                                             "min_size_to_sample": 1, "error_buffer": 0.5})  # fmt: skip


def test_min_size_wait_then_deadline(store_server):
    addr, _ = store_server
    c = ExperienceSharingClient("a1", addr)
    c.create_table("m", rate_limiter={"kind": "min_size", "min_size_to_sample": 2})
    c.share_experience(traj(), table="m")
    with pytest.raises(DeadlineExceededError):
        c.sample("m", 1, timeout_s=0.3)
    threading.Timer(0.2, lambda: c.share_experience(traj(), table="m")).start()
    assert len(c.sample("m", 1, timeout_s=5)) == 1


def test_an_insert_into_a_full_table_is_rate_limited_not_a_plain_deadline(store_server):
    """The insert wait running out on a full queue table comes back over gRPC as RateLimitedError (reason
    RATE_LIMITED, still a DeadlineExceededError) naming the table and its size; an empty sample's wait stays a
    plain DeadlineExceededError."""
    addr, _ = store_server
    c = ExperienceSharingClient("a1", addr)
    c.create_table("full", preset="queue", max_size=2)
    c.share_experiences([traj(), traj()], table="full")
    with pytest.raises(RateLimitedError) as info:
        c.share_experience(traj(), table="full", timeout_s=0.2)
    err = info.value
    assert isinstance(err, DeadlineExceededError) and type(err).reason == "RATE_LIMITED"
    assert (err.table, err.size, err.max_size) == ("full", 2, 2)
    assert err.metadata == {  # the server's facts, and the client's naming of the item
        "table": "full",
        "size": "2",
        "max_size": "2",
        "item": "0",
        "episode_id": "ep1",
        "inserted": "0",
        "inserted_keys": "",
    }
    assert "'full'" in str(err) and "size=2/2" in str(err)
    c.create_table("empty", preset="queue", max_size=2)
    with pytest.raises(DeadlineExceededError) as info:
        c.sample("empty", 1, timeout_s=0.2)
    assert type(info.value) is DeadlineExceededError


def test_credits_bound_items_and_priorities(store_server):
    addr, _ = store_server
    c = ExperienceSharingClient("a1", addr)
    c.create_table("p", preset="prioritized", priority_exponent=1.0)
    keys = c.share_experiences([traj(steps=(i,)) for i in range(10)], table="p", priorities=[1.0] * 10)
    items = c.sample("p", 7)
    assert len(items) == 7  # exactly the credits granted
    assert c.info("p").samples == 7
    assert c.update_priorities("p", {keys[0]: 5.0, 10**9: 1.0}) == (1, 1)
    assert c.info("p").priority_updates_missing == 1
    with pytest.raises(InvalidArgumentError):
        c.update_priorities("p", {keys[0]: math.nan})
    ck = c.checkpoint()
    assert ck.num_bytes > 0 and ck.path.endswith(".sqlite")
    assert {t.name for t in c.list_tables()} >= {"p", "default"}


def test_filters(store_server):
    addr, _ = store_server
    c = ExperienceSharingClient("a1", addr)
    c.share_experiences([traj("a1", version=1), traj("a2", version=3, role="critic")])
    for _ in range(5):
        (item,) = c.sample("default", 1, agent_ids=["a2"])
        assert item.trajectory.agent_id == "a2" and item.table_size == 1
    assert {i.trajectory.agent_id for i in c.sample("default", 20, min_policy_version=2)} == {"a2"}
    assert {i.trajectory.role for i in c.sample("default", 20, roles=["planner"])} == {"planner"}
    with pytest.raises(DeadlineExceededError):
        c.sample("default", 1, min_policy_version=9, timeout_s=0.2)


async def test_async_client(store_server):
    addr, _ = store_server
    async with AsyncExperienceSharingClient("a1", addr) as c:
        await c.create_table("q", preset="queue", max_size=4)
        keys = await asyncio.gather(*(c.share_experience(traj(steps=(i,)), table="q") for i in range(4)))
        assert len(set(keys)) == 4
        items = await c.sample("q", 4)
        assert sorted(i.trajectory.turns[0].step for i in items) == [0, 1, 2, 3]
        assert (await c.info("q")).size == 0
        assert len(await c.get_all_experiences(episode_id="ep1")) == 0


def test_batch_items_below_one_and_priority_count_are_refused_before_anything_is_sent(store_server):
    addr, _ = store_server
    with ExperienceSharingClient("a1", addr) as c:
        c.create_table("bi", preset="queue", max_size=100)
        for bad in (0, -1, 1.5, "4", True):
            with pytest.raises(
                InvalidArgumentError, match=f"batch_items must be an integer >= 1, got {bad!r}"
            ):
                c.share_experiences([traj()], table="bi", batch_items=bad)
        with pytest.raises(InvalidArgumentError, match="priority 1 is 'a', not a number"):
            c.share_experiences([traj(), traj()], table="bi", priorities=[1.0, "a"])
        bad_id = traj()
        bad_id.turns[0].prompt_token_ids[2] = 2**31
        with pytest.raises(
            InvalidArgumentError, match=r"turns\[0\].prompt_token_ids holds 2147483648, not an int"
        ):
            c.share_experiences([traj(), bad_id], table="bi")
        with pytest.raises(InvalidArgumentError, match="1 priorities for 2 trajectories"):
            c.share_experiences([traj(), traj()], table="bi", priorities=[1.0])
        assert c.info("bi").size == 0
        assert len(c.share_experiences([traj(steps=(i,)) for i in range(3)], table="bi", batch_items=1)) == 3

    async def run():
        async with AsyncExperienceSharingClient("a1", addr) as ac:
            with pytest.raises(InvalidArgumentError, match="batch_items must be an integer >= 1, got 0"):
                await ac.share_experiences([traj()], table="bi", batch_items=0)
            return await ac.share_experiences([traj(), traj()], table="bi", batch_items=1)

    assert len(asyncio.run(run())) == 2
    with ExperienceSharingClient("a1", addr) as c:
        assert c.info("bi").size == 5


@pytest.mark.parametrize("bad", [0, 0.0, -1, math.nan, math.inf, 5e9, "5", True])
def test_bad_waits_are_refused_naming_the_value_never_replaced_by_the_default(store_server, bad):
    addr, _ = store_server
    with ExperienceSharingClient("a1", addr) as c:
        c.create_table("w", preset="queue", max_size=100)
        with pytest.raises(InvalidArgumentError, match="timeout_s must be"):
            c.share_experience(traj(), table="w", timeout_s=bad)
        with pytest.raises(InvalidArgumentError, match="timeout_s must be"):
            c.sample("w", 1, timeout_s=bad)
        assert c.info("w").size == 0
    with pytest.raises(InvalidArgumentError, match="timeout_s must be"):
        ExperienceSharingClient("a1", addr, timeout_s=bad)
    with pytest.raises(InvalidArgumentError, match="timeout_s must be"):
        AsyncExperienceSharingClient("a1", addr, timeout_s=bad)


def test_the_longest_wait_the_protocol_carries_is_accepted(store_server):
    """By a store whose max_wait_ms allows it (the default, 1 day, refuses it: test_store_limits.py)."""
    from marti.clients.experience import MAX_TIMEOUT_S

    addr, servicer = store_server
    servicer.settings = servicer.settings.model_copy(update={"max_wait_ms": 2**32 - 1})
    with ExperienceSharingClient("a1", addr) as c:
        c.create_table("w2", preset="queue", max_size=100)
        assert len(c.share_experiences([traj()], table="w2", timeout_s=MAX_TIMEOUT_S)) == 1
        with pytest.raises(InvalidArgumentError, match=f"<= {MAX_TIMEOUT_S}, got"):
            c.share_experiences([traj()], table="w2", timeout_s=MAX_TIMEOUT_S * 1.001)


@pytest.mark.parametrize("key", [2**64, -1, 1.5, "3"])
def test_priority_updates_refuse_keys_outside_uint64(store_server, key):
    addr, _ = store_server
    with ExperienceSharingClient("a1", addr) as c:
        c.create_table("k", preset="prioritized", priority_exponent=1.0)
        with pytest.raises(InvalidArgumentError, match=r"item keys are integers in \[0, 2\*\*64\), got"):
            c.update_priorities("k", {key: 1.0})
        assert c.update_priorities("k", {2**64 - 1: 1.0}) == (0, 1)


def test_a_bad_item_in_a_batch_is_named_and_the_others_keys_are_given(store_server):
    addr, _ = store_server
    bad = traj(episode="bad-ep")
    bad.turns[0].response_logprobs[1] = math.nan
    with ExperienceSharingClient("a1", addr) as c:
        c.create_table("m", preset="queue", max_size=100)
        batch = [traj(episode="e0"), bad, traj(episode="e2"), bad]
        with pytest.raises(InvalidArgumentError) as info:
            c.share_experiences(batch, table="m", batch_items=2)
        err = info.value
        assert str(err).startswith("item 1 of 4 (episode 'bad-ep', agent 'a1'): trajectory.turns[0]")
        assert "2 of the other 3 items were inserted" in str(err)
        assert err.metadata["item"] == "1" and err.metadata["episode_id"] == "bad-ep"
        keys = [int(k) for k in err.metadata["inserted_keys"].split(",")]
        assert err.metadata["inserted"] == "2" and len(keys) == 2
        got = {item.key: item.trajectory.episode_id for item in c.sample("m", 2)}
        assert got == dict(zip(keys, ["e0", "e2"], strict=True))
        with pytest.raises(
            InvalidArgumentError, match=r"^item 0 of 1 \(episode 'bad-ep', agent 'a1'\): [^;]*$"
        ):
            c.share_experience(bad, table="m")


def test_numpy_numbers_are_accepted_where_python_numbers_are(store_server):
    np = pytest.importorskip("numpy")
    addr, _ = store_server
    with ExperienceSharingClient("a1", addr, timeout_s=np.float32(30)) as c:
        c.create_table("np", preset="prioritized", priority_exponent=1.0)
        keys = c.share_experiences(
            [traj(), traj()], table="np", priorities=np.array([1.0, 2.0]), batch_items=np.int64(1)
        )
        assert len(keys) == 2
        assert (
            len(
                c.share_experiences([traj()], table="np", priorities=[np.float32(1.0)], timeout_s=np.int64(5))
            )
            == 1
        )
        assert c.update_priorities("np", {np.uint64(keys[0]): np.float64(3.0)}) == (1, 0)
        with pytest.raises(InvalidArgumentError, match="the priority of key 5 is 'x', not a number"):
            c.update_priorities("np", {5: "x"})
        with pytest.raises(InvalidArgumentError, match="timeout_s must be finite, > 0"):
            c.share_experiences([traj()], table="np", timeout_s=10**400)
        bad = traj()
        bad.turns[0].response_token_ids = np.array([1, 2**40])
        with pytest.raises(InvalidArgumentError, match=r"response_token_ids holds np.int64\(1099511627776\)"):
            c.share_experiences([bad], table="np")


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda c: c.update_priorities("nf", {2**63: math.nan}),
            r"the priority of key 9223372036854775808 is nan",
        ),
        (
            lambda c: c.update_priorities("nf", {3: -2.0}),
            r"the priority of key 3 is -2.0, not >= 0 \(argument priorities\[3\]\)",
        ),
        (
            lambda c: c.update_priorities("nf", [(1, 1.0)]),
            r"priorities must be a mapping of item key to priority",
        ),
        (
            lambda c: c.share_experiences([traj()], table="nf", priorities=[math.inf]),
            r"priority 0 is inf, not",
        ),
        (lambda c: c.share_experiences([traj()], table="nf", priorities=5), r"priorities must be a sequence"),
        (lambda c: c.share_experience(traj(), table="nf", priority=-math.inf), r"priority 0 is -inf, not"),
        (
            lambda c: c.share_experiences([traj()], table="nf", priorities=[-1]),
            r"priority 0 is -1, not >= 0 \(argument priorities\[0\]\)",
        ),
        (lambda c: c.share_experience(traj(), table="nf", priority=-0.5), r"priority 0 is -0.5, not >= 0"),
    ],
)
def test_priorities_are_refused_by_their_own_check_naming_the_item(store_server, call, match):
    """One check per argument: the store client's own (naming the key or position), never a generic one."""
    addr, _ = store_server
    with ExperienceSharingClient("a1", addr) as c:
        c.create_table("nf", preset="prioritized", priority_exponent=1.0)
        with pytest.raises(InvalidArgumentError, match=match):
            call(c)
        assert c.info("nf").size == 0
        assert c.update_priorities("nf", {2**63: 2.0}) == (0, 1)  # a uint64 key past int64 is valid
