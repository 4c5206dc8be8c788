"""A reward_fn that returns a key which is not an agent (a typo, a "judge") is refused naming the key and the
team, in the workflow and in a played episode, instead of being credited as an extra agent."""

from __future__ import annotations

import pytest

from marti.errors import InvalidArgumentError
from marti.team.workflow import EpisodeView, RewardAllocation, Workflow


def _view():
    return EpisodeView(["agent_1", "agent_2"], [], {"agent_1": 0.0, "agent_2": 0.0}, {}, {}, 0)


@pytest.mark.parametrize("key", ["Agent_1", "judge"])
def test_a_reward_key_that_is_not_an_agent_is_refused_naming_it_and_the_agents(key):
    wf = Workflow.env(
        reward_fn=lambda ep: {key: 1.0, "agent_2": 0.0}, allocation=RewardAllocation(team_share=0.5)
    )
    with pytest.raises(InvalidArgumentError, match=rf"\['{key}'\].*agents are \['agent_1', 'agent_2'\]"):
        wf.rewards(_view())


def test_a_reward_fn_that_leaves_an_agent_out_credits_it_0():
    wf = Workflow.env(reward_fn=lambda ep: {"agent_1": 1.0}, allocation=RewardAllocation(team_share=0.5))
    assert wf.rewards(_view()) == pytest.approx({"agent_1": 0.75, "agent_2": 0.25})
