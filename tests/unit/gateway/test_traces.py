"""Trace capture: calls become turns with exact ids and masks, episodes and groups are released or dropped whole."""

from __future__ import annotations

import dataclasses

import pytest

from marti.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError, ResourceExhaustedError
from marti.types.inference import Generation
from services.gateway.core.traces import EpisodeTracker


def gen(prompt: list[int], resp: list[int], version: int = 0) -> Generation:
    """A generation with log-probs -0.1, -0.2, ... per response token."""
    return Generation(prompt, resp, [-0.1 * (i + 1) for i in range(len(resp))], "x", "stop", version, "a")


class Clock:
    """A settable monotonic clock."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def tracker(**kw) -> EpisodeTracker:
    args = {"episode_timeout_s": 10.0, "max_open_episodes": 100, "max_calls_per_episode": 10}
    args.update(kw)
    return EpisodeTracker(["a", "b"], **args)


def test_calls_extending_the_previous_prefix_merge_into_one_turn_with_masked_gap():
    t = tracker()
    t.record("e", "a", "c1", gen([1, 2], [3, 4]))
    second = gen([1, 2, 3, 4, 9, 9], [5])  # tokens 9, 9: a tool's output between the calls
    t.record("e", "a", "c2", dataclasses.replace(second, finish_reason="length"))
    (ep,) = t.finish("e", {"a": 1.0}).episodes
    (turn,) = ep["a"].turns
    assert turn.info["finish_reason"] == "length"  # where the last merged call ended
    assert turn.prompt_token_ids == [1, 2]
    assert turn.response_token_ids == [3, 4, 9, 9, 5]
    assert turn.response_mask == [1, 1, 0, 0, 1]
    assert turn.response_logprobs == pytest.approx([-0.1, -0.2, 0.0, 0.0, -0.1])
    assert ep["a"].episode_return == 1.0 and ep["b"].turns == [] and ep["b"].episode_return == 0.0


def test_a_call_that_does_not_extend_or_changes_version_is_a_new_turn():
    t = tracker()
    t.record("e", "a", "c1", gen([1, 2], [3]))
    t.record("e", "a", "c2", gen([1, 7], [4]))  # a different history
    t.record("e", "a", "c3", gen([1, 7, 4, 8], [5], version=1))  # extends c2 but a newer policy sampled it
    (ep,) = t.finish("e", {}, call_rewards={"c1": 0.5, "c3": 2.0}).episodes
    turns = ep["a"].turns
    assert [x.response_token_ids for x in turns] == [[3], [4], [5]]
    assert [x.policy_version for x in turns] == [0, 0, 1]
    assert [x.reward for x in turns] == [0.5, None, 2.0]
    assert ep["a"].episode_return is None and ep["a"].outcome_reward == 2.5
    assert ep["a"].policy_version == 0 and turns[-1].terminated


def test_group_waits_until_complete_and_a_failed_member_drops_it_whole():
    t = tracker()
    for e in ("e1", "e2", "e3"):
        t.record(e, "a", f"c{e}", gen([1], [2]), group_id="g")
    assert t.finish("e1", {"a": 1.0}, group_size=3).episodes == []
    assert t.finish("e2", {"a": 0.0}, group_size=3).episodes == []
    t.record("e4", "a", "c4", gen([1], [2]), group_id="g")  # open when the group dies
    dropped = t.finish("e3", {}, failed=True)
    assert dropped.episodes == [] and dropped.dropped == 3
    assert t.finish("e4", {"a": 1.0}, group_size=3).dropped == 1  # a late member of the dead group
    assert t.counters["failed"] == 1 and t.counters["dropped"] == 4 and t.held == 0


def test_complete_group_is_released_with_group_metadata():
    t = tracker()
    t.record("e1", "b", "ce1", gen([1], [2]), group_id="q7")
    t.record("e2", "b", "ce2", gen([1], [2]))  # its report gives the group the calls of e1 carried
    assert t.finish("e1", {"b": 1.0}, group_id="q7", group_size=2).episodes == []
    eps = t.finish("e2", {"b": 0.0}, group_id="q7", group_size=2).episodes
    assert [ep["b"].episode_return for ep in eps] == [1.0, 0.0]
    assert all(ep[a].group_id == "q7" and ep[a].group_size == 2 for ep in eps for a in "ab")  # typed field


def test_silent_episode_is_abandoned_with_its_group_never_trained():
    clock = Clock()
    t = tracker(clock=clock)
    t.record("e1", "a", "c1", gen([1], [2]), group_id="g")
    t.record("e2", "a", "c2", gen([1], [2]), group_id="g")
    assert t.finish("e1", {"a": 1.0}, group_size=2).episodes == []
    clock.t = 9.9
    assert t.sweep().dropped == 0
    clock.t = 10.0
    assert t.sweep().dropped == 2  # e2 abandoned, e1 held in its group
    assert t.counters["abandoned"] == 1 and t.open_episodes == 0
    with pytest.raises(
        FailedPreconditionError, match=r"'e2' was abandoned .*, external\.episode_timeout_s\)"
    ):
        t.finish("e2", {"a": 1.0})
    with pytest.raises(FailedPreconditionError, match="'e2' was abandoned"):
        t.begin_call("e2", "a", 1)


def test_limits_are_enforced_at_their_edge():
    t = tracker(max_open_episodes=2, max_calls_per_episode=2)
    t.record("e1", "a", "c1", gen([1], [2]))
    t.record("e1", "a", "c2", gen([1], [2]))
    with pytest.raises(InvalidArgumentError, match="max_calls_per_episode"):
        t.check_can_record("e1", "a")
    t.check_can_record("e1", "b")  # the limit is per agent
    t.record("e2", "a", "c3", gen([1], [2]))
    with pytest.raises(ResourceExhaustedError, match="max_open_episodes"):
        t.check_can_record("e3", "a")
    t.finish("e1", {"a": 0.0})
    t.check_can_record("e3", "a")  # a report frees a slot


def test_bad_reports_are_refused_by_name():
    t = tracker()
    t.record("e", "a", "c1", gen([1], [2]))
    with pytest.raises(InvalidArgumentError, match="'zed'"):
        t.finish("e", {"zed": 1.0})
    with pytest.raises(InvalidArgumentError, match="'nope'"):
        t.finish("e", {}, call_rewards={"nope": 1.0})
    with pytest.raises(InvalidArgumentError, match="group_size"):
        t.finish("e", {}, group_size=-1)
    with pytest.raises(InvalidArgumentError, match="finite"):
        t.finish("e", {"a": float("nan")})
    with pytest.raises(InvalidArgumentError, match="finite"):
        t.finish("e", {}, call_rewards={"c1": float("inf")})
    t.finish("e", {"a": 1.0})
    with pytest.raises(FailedPreconditionError, match="already reported"):
        t.finish("e", {"a": 1.0})


def test_a_report_that_forgets_an_agent_that_made_calls_is_refused_naming_it():
    """An agent that made calls needs a reward (in rewards, or through its calls' call_rewards): left out, it
    would train as reward 0 without a word. A failed report needs none."""
    t = tracker()
    for agent, call in (("a", "c1"), ("b", "c2")):
        t.record("e", agent, call, gen([1], [2]))
    with pytest.raises(InvalidArgumentError, match=r"gives no reward to \['b'\], which made calls"):
        t.finish("e", {"a": 1.0})
    t.finish("e", {"a": 1.0}, call_rewards={"c2": 0.5})  # b's reward is its call's
    t.record("f", "b", "c3", gen([1], [2]))
    t.finish("f", {}, failed=True)


def test_a_report_or_call_naming_another_group_than_the_calls_is_refused_naming_both():
    t = tracker()
    t.begin_call("e", "a", 1, group_id="A")
    t.record("e", "a", "c1", gen([1], [2]), group_id="A")
    t.end_call("e", "a", 1)
    with pytest.raises(FailedPreconditionError, match=r"this call names group 'B' .* under group 'A'"):
        t.begin_call("e", "b", 1, group_id="B")
    with pytest.raises(FailedPreconditionError, match=r"names group 'B' .* under group 'A'"):
        t.record("e", "b", "c2", gen([1], [2]), group_id="B")
    for failed in (False, True):  # a failed report must not kill another group either
        with pytest.raises(
            FailedPreconditionError, match=r"the report names group 'C' .*episode 'e' .*group 'A'"
        ):
            t.finish("e", {"a": 1.0}, group_id="C", failed=failed)
    t.record("e", "a", "c3", gen([1], [2]))  # a call without a group keeps the episode's
    (ep,) = t.finish("e", {"a": 1.0}, group_id="A").episodes  # the same group, or none, is fine
    assert ep["a"].group_id == "A" and len(ep["a"].turns) == 2
    t.record("f", "a", "c4", gen([1], [2]))  # no group with the calls: the report gives one a call carried
    (ep,) = t.finish("f", {"a": 1.0}, group_id="A").episodes
    assert ep["a"].group_id == "A"


def test_a_report_naming_a_group_no_call_carried_is_refused_naming_it_and_changes_nothing():
    t = tracker()
    t.record("g1", "a", "c1", gen([1], [2]), group_id="q-7")
    t.record("g2", "a", "c2", gen([1], [2]))
    for failed in (False, True):  # a typo ("q7") would be a group of its own, never complete, or one of one
        with pytest.raises(NotFoundError, match=r"group_id 'q7' names no group this gateway served") as e:
            t.finish("g2", {"a": 1.0}, group_id="q7", group_size=2, failed=failed)
        assert e.value.param == "group_id"
    assert t.open_episodes == 2 and t.held == 0
    assert t.finish("g2", {"a": 1.0}, group_id="q-7", group_size=2).episodes == []  # held with its group
    assert len(t.finish("g1", {"a": 0.0}, group_size=2).episodes) == 2


def test_a_group_calls_still_carry_stays_known_past_the_remembered_limit():
    """The served groups forget the oldest first; a group the calls keep carrying is the newest again, not
    forgotten after ``REMEMBERED_IDS`` other groups went by (its later report would be refused as a typo)."""
    t = tracker()
    t._served_groups.cap = 2
    t.record("e1", "a", "c1", gen([1], [2]), group_id="long")
    t.record("e2", "a", "c2", gen([1], [2]), group_id="g1")
    t.record("e3", "a", "c3", gen([1], [2]), group_id="long")  # carried again: the newest
    t.record("e4", "a", "c4", gen([1], [2]), group_id="g2")
    t.record("e5", "a", "c5", gen([1], [2]))  # no group with its calls: the report names one
    (ep,) = t.finish("e5", {"a": 1.0}, group_id="long").episodes
    assert ep["a"].group_id == "long"


def test_a_reward_for_an_agent_that_made_no_call_is_refused_naming_the_agents_that_did():
    t = tracker()
    t.record("e", "a", "c1", gen([1], [2]))
    with pytest.raises(InvalidArgumentError, match=r"agent 'b', which made no recorded call .*did: \['a'\]"):
        t.finish("e", {"a": 1.0, "b": 0.0})
    assert t.open_episodes == 1  # refused: nothing changed
    t.begin_call("e", "b", 1)  # a call of b that ends unrecorded (its client went away) does not count
    t.end_call("e", "b", 1)
    with pytest.raises(InvalidArgumentError, match="'b', which made no recorded call"):
        t.finish("e", {"b": 0.0})
    assert t.finish("e", {"b": 0.0}, failed=True).dropped == 1  # a failed report drops it all the same
    t.record("f", "a", "c2", gen([1], [2]))
    (ep,) = t.finish("f", {"a": 1.0}).episodes  # b gets its empty item without a reward
    assert ep["b"].turns == [] and ep["b"].episode_return == 0.0


def test_a_dead_group_id_is_free_again_for_episodes_that_start_after_it_died():
    t = tracker()
    for e in ("e1", "e2"):
        t.record(e, "a", f"c{e}", gen([1], [2]), group_id="q")
    assert t.finish("e1", {}, failed=True).dropped == 1
    t.record("e3", "a", "c3", gen([1], [2]), group_id="q")  # the next round of the same problem
    t.record("e4", "a", "c4", gen([1], [2]), group_id="q")
    assert t.finish("e2", {"a": 1.0}, group_size=2).dropped == 1  # open when q died: dropped
    assert t.finish("e3", {"a": 1.0}, group_size=2).episodes == []
    eps = t.finish("e4", {"a": 0.0}, group_size=2).episodes  # a new group q, released whole
    assert [ep["a"].episode_id for ep in eps] == ["e3", "e4"]
    # a doomed member that fails or is abandoned does not kill the new group of the same id
    t.record("e5", "a", "c5", gen([1], [2]), group_id="r")
    t.record("e6", "a", "c6", gen([1], [2]), group_id="r")
    t.finish("e5", {}, failed=True)  # e6 doomed
    t.record("e7", "a", "c7", gen([1], [2]), group_id="r")
    assert t.finish("e6", {}, failed=True).dropped == 1
    assert len(t.finish("e7", {"a": 1.0}, group_size=1).episodes) == 1


def test_a_call_in_flight_keeps_its_episode_open_and_from_being_abandoned():
    clock = Clock()
    t = tracker(clock=clock, max_open_episodes=1)
    t.begin_call("e1", "a", 1, group_id="g")
    assert t.open_episodes == 1
    with pytest.raises(ResourceExhaustedError, match="max_open_episodes"):  # the running call opened e1
        t.begin_call("e2", "a", 1)
    clock.t = 50.0  # the engine is slow: far beyond the timeout
    assert t.sweep().dropped == 0 and t.counters["abandoned"] == 0
    t.record("e1", "a", "c1", gen([1], [2]), group_id="g")
    t.end_call("e1", "a", 1)  # refreshes last_seen
    clock.t = 59.9
    assert t.sweep().dropped == 0
    clock.t = 60.0
    assert t.sweep().dropped == 1 and t.counters["abandoned"] == 1
    with pytest.raises(FailedPreconditionError, match="abandoned .*10 s"):
        t.check_can_record("e1", "a")


def test_a_call_that_failed_leaves_no_open_episode_behind():
    clock = Clock()
    t = tracker(clock=clock)
    t.begin_call("e1", "a", 2, group_id="g")
    t.end_call("e1", "a", 2)  # the engine failed: nothing recorded
    assert t.open_episodes == 0
    clock.t = 100.0
    assert t.sweep().dropped == 0 and t.counters["abandoned"] == 0


def test_n_choices_are_checked_against_the_call_budget_with_the_running_calls():
    t = tracker(max_calls_per_episode=4)
    t.record("e", "a", "c1", gen([1], [2]))
    t.check_can_record("e", "a", 3)  # 1 + 3 = 4: exactly the limit
    with pytest.raises(InvalidArgumentError, match="has 1 calls .* adds 4.*max_calls_per_episode"):
        t.begin_call("e", "a", 4)
    t.begin_call("e", "a", 2)  # running: 1 recorded + 2 reserved
    with pytest.raises(InvalidArgumentError, match="has 3 calls .* adds 2"):
        t.begin_call("e", "a", 2)
    t.record("e", "a", "c2", gen([1], [3]))  # the reserved calls are recorded without tripping the limit
    t.record("e", "a", "c3", gen([1], [4]))
    t.end_call("e", "a", 2)
    t.check_can_record("e", "a", 1)
    with pytest.raises(InvalidArgumentError, match="max_calls_per_episode"):
        t.check_can_record("e", "a", 2)


def test_a_report_without_recorded_calls_or_with_calls_running_is_refused_and_changes_nothing():
    t = tracker()
    with pytest.raises(NotFoundError, match="'ghost' has no recorded calls"):
        t.finish("ghost", {"a": 1.0})
    with pytest.raises(NotFoundError, match="'ghost'"):
        t.finish("ghost", {}, failed=True)
    t.begin_call("e", "a", 1)
    with pytest.raises(FailedPreconditionError, match="1 calls of episode 'e' are still running"):
        t.finish("e", {"a": 1.0})
    t.record("e", "a", "c1", gen([1], [2]))
    t.begin_call("e", "b", 1)
    with pytest.raises(FailedPreconditionError, match="still running"):
        t.finish("e", {"a": 1.0}, failed=True)
    t.end_call("e", "a", 1)
    t.end_call("e", "b", 1)
    assert t.counters["failed"] == 0 and t.counters["finished"] == 0 and t.open_episodes == 1
    assert len(t.finish("e", {"a": 1.0}).episodes) == 1
    t.record("ghost", "a", "c2", gen([1], [2]))  # a refused report did not close the id
    assert len(t.finish("ghost", {"a": 1.0}).episodes) == 1


def test_an_incomplete_held_group_expires_after_the_timeout_from_its_last_finish():
    clock = Clock()
    t = tracker(clock=clock, episode_timeout_s=10.0)
    for e in ("e1", "e2", "e3"):
        t.record(e, "a", f"c{e}", gen([1], [2]), group_id="g")
    t.finish("e1", {"a": 1.0}, group_size=4)
    clock.t = 5.0
    t.finish("e2", {"a": 1.0}, group_size=4)
    assert t.held == 2
    clock.t = 12.0
    t.record("e3", "a", "c3b", gen([1], [2]))  # e3 stays active
    clock.t = 14.9
    assert t.sweep().dropped == 0 and t.held == 2
    clock.t = 15.0
    assert t.sweep().dropped == 2
    assert t.held == 0 and t.counters["expired_groups"] == 1 and t.counters["dropped"] == 2
    assert t.counters["abandoned"] == 0
    assert t.finish("e3", {"a": 1.0}, group_size=4).dropped == 1  # open when its group expired
    t.record("e4", "a", "c4", gen([1], [2]), group_id="g")  # a new group g
    assert t.finish("e4", {"a": 1.0}, group_size=4).episodes == [] and t.held == 1


def test_a_report_with_another_group_size_than_its_group_is_refused_and_changes_nothing():
    t = tracker()
    for e in ("e1", "e2"):
        t.record(e, "a", f"c{e}", gen([1], [2]), group_id="g")
    t.finish("e1", {"a": 1.0}, group_size=2)
    for size, text in ((3, "group_size 3"), (0, "no group_size")):
        with pytest.raises(InvalidArgumentError, match=f"opened with group_size 2 .* gives {text}$"):
            t.finish("e2", {"a": 0.0}, group_size=size)
    assert t.held == 1 and t.open_episodes == 1 and t.counters["finished"] == 1
    assert len(t.finish("e2", {"a": 0.0}, group_size=2).episodes) == 2


def test_a_group_size_other_than_a_member_reported_while_it_was_open_is_refused_naming_both():
    """A member reported without group_size is released at once; a member open then that gives group_size 2
    would wait forever for its group (refused, naming the group and both sizes), and so would the reverse. A
    member that opens after the report is in a new group of the same id, with its own size."""
    t = tracker()
    for e in ("k1", "k2", "k3"):
        t.record(e, "a", f"c{e}", gen([1], [2]), group_id="KG")
    assert len(t.finish("k1", {"a": 1.0}).episodes) == 1
    for e in ("k2", "k3"):
        with pytest.raises(
            InvalidArgumentError,
            match=f"group 'KG': episode 'k1' of it was reported with no group_size while episode '{e}' was open, "
            f"and this report of '{e}' gives group_size 2",
        ):
            t.finish(e, {"a": 0.0}, group_size=2)
    assert t.held == 0 and t.open_episodes == 2 and t.counters["finished"] == 1
    for e in ("k2", "k3"):
        assert len(t.finish(e, {"a": 0.0}).episodes) == 1
    for e in ("k4", "k5"):  # open after KG's members were reported: a new group KG of 2
        t.record(e, "a", f"c{e}", gen([1], [2]), group_id="KG")
    assert t.finish("k4", {"a": 0.0}, group_size=2).episodes == []
    assert len(t.finish("k5", {"a": 1.0}, group_size=2).episodes) == 2
    t2 = tracker()
    for e in ("h1", "h2"):
        t2.record(e, "a", f"c{e}", gen([1], [2]), group_id="HG")
    t2.finish("h1", {"a": 1.0}, group_size=1)  # a complete group of 1: released
    with pytest.raises(InvalidArgumentError, match="reported with group_size 1 .* gives no group_size"):
        t2.finish("h2", {"a": 0.0})


def test_a_member_reported_without_its_group_size_or_its_reward_is_named_for_the_group_size():
    """A fresh user's report that forgot both ``group_size`` and a reward: the error names ``group_size`` and its
    value (the group's size is what the client got wrong), not only the missing reward."""
    t = tracker()
    for e in ("e1", "e2"):
        t.record(e, "a", f"c{e}", gen([1], [2]), group_id="g")
    t.finish("e1", {"a": 1.0}, group_size=2)
    with pytest.raises(InvalidArgumentError, match="opened with group_size 2 .* gives no group_size$"):
        t.finish("e2", {}, group_size=0)
    with pytest.raises(InvalidArgumentError, match=r"gives no reward to \['a'\]"):
        t.finish("e2", {}, group_size=2)  # its group size right: the missing reward is named
    assert t.held == 1 and t.open_episodes == 1


def test_a_reward_beyond_the_bound_is_refused_naming_it_and_changes_nothing():
    """Float32 advantages of rewards around 1e200 are all zero, around 1e308 infinite: refused at the report."""
    t = tracker()
    t.record("e", "a", "c1", gen([1], [2]))
    with pytest.raises(
        InvalidArgumentError, match=r"rewards\['a'\]: the reward is 1e\+200, beyond \+-1e\+20"
    ):
        t.finish("e", {"a": 1e200})
    with pytest.raises(InvalidArgumentError, match=r"call_rewards\['c1'\]: the reward is -1e\+308"):
        t.finish("e", {}, call_rewards={"c1": -1e308})
    assert t.open_episodes == 1 and len(t.finish("e", {"a": 1e20}).episodes) == 1


def test_a_group_size_without_a_group_id_or_above_the_limit_is_refused_and_changes_nothing():
    """An episode without a group is a group of one: group_size > 1 could never complete (it would be held until
    the timeout and dropped), so it is refused; so is a group_size above max_group_size."""
    t = tracker(max_group_size=8)
    t.record("e1", "a", "c1", gen([1], [2]))
    with pytest.raises(InvalidArgumentError, match="group_size is 4 but episode 'e1' has no group_id"):
        t.finish("e1", {"a": 1.0}, group_size=4)
    for size in (9, 10**9, 2**64):
        with pytest.raises(InvalidArgumentError, match=rf"group_size is {size}; .*max_group_size\) is 8"):
            t.finish("e1", {"a": 1.0}, group_id="g", group_size=size)
    assert t.held == 0 and t.open_episodes == 1 and t.counters["finished"] == 0
    assert len(t.finish("e1", {"a": 1.0}, group_size=1).episodes) == 1  # a group of one is complete at once
    t.record("e2", "a", "c2", gen([1], [2]), group_id="g")  # a group sent with the calls counts
    assert t.finish("e2", {"a": 1.0}, group_size=2).episodes == [] and t.held == 1
