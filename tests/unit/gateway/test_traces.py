"""Trace capture: calls become turns with exact ids and masks, episodes and groups are released or dropped whole."""

from __future__ import annotations

import pytest

from marti.errors import FailedPreconditionError, InvalidArgumentError, ResourceExhaustedError
from marti.inference import Generation
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
    t.record("e", "a", "c2", gen([1, 2, 3, 4, 9, 9], [5]))  # tokens 9, 9: a tool's output between the calls
    (ep,) = t.finish("e", {"a": 1.0}).episodes
    (turn,) = ep["a"].turns
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
    dropped = t.finish("e3", {}, failed=True)
    assert dropped.episodes == [] and dropped.dropped == 3
    t.record("e4", "a", "c4", gen([1], [2]), group_id="g")  # a late member of the dead group
    assert t.finish("e4", {"a": 1.0}, group_size=3).dropped == 1
    assert t.counters["failed"] == 1 and t.counters["dropped"] == 4 and t.counters["released"] == 0


def test_complete_group_is_released_with_group_metadata():
    t = tracker()
    for e in ("e1", "e2"):
        t.record(e, "b", f"c{e}", gen([1], [2]))
    assert t.finish("e1", {"b": 1.0}, group_id="q7", group_size=2).episodes == []
    eps = t.finish("e2", {"b": 0.0}, group_id="q7", group_size=2).episodes
    assert [ep["b"].episode_return for ep in eps] == [1.0, 0.0]
    assert all(ep[a].group_id == "q7" and ep[a].metadata["group_size"] == 2 for ep in eps for a in "ab")


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
    with pytest.raises(FailedPreconditionError, match="e2"):
        t.finish("e2", {"a": 1.0})


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
    t.finish("e1", {})
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
