"""A reward that is not finite, or so large that float32 advantages overflow, is refused naming where it came from
(a fresh-user review: rewards around 1e200 trained on all-zero advantages with no warning, and two turn rewards of
-1e308 logged a ``-inf`` return). Found where each kind of reward enters: a reward function's scores, a trajectory
in the learner's batch (env rewards, gateway reports, inserted trajectories), a gateway report."""

from __future__ import annotations

from typing import get_args

import pytest
import torch

from marti.config import AlgorithmConfig
from marti.errors import InvalidArgumentError
from marti.rewards import RewardFunction
from marti.rewards.base import MAX_ABS_REWARD
from marti.types.trajectory import Trajectory, Turn
from services.trainer.learn.algo import compute_advantages
from services.trainer.learn.experience import collate
from tests.trainer_data import one_turn


def test_the_bound_still_gives_grpo_advantages():
    """The bound still gives GRPO's advantages; 1e200 gave all zeros (the reason for the bound)."""
    mask = torch.ones(2, 1)
    adv, _ = compute_advantages(AlgorithmConfig(), [MAX_ABS_REWARD, 0.0], mask, group_size=2)
    assert adv[:, 0].tolist() == pytest.approx([0.7071, -0.7071], abs=1e-4)


ESTIMATORS = [
    e for e in get_args(AlgorithmConfig.model_fields["advantage_estimator"].annotation) if e != "gae"
]


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_at_the_bound_every_estimator_gives_the_advantages_of_the_same_rewards_scaled_down(estimator, sign):
    """Equal rewards at the bound give zero advantages (at 1e30 reinforce++ gave -0.96 to four equal rewards:
    float32 rounding, found by a review), and unequal ones the advantages of the rewards scaled down to O(1)
    (scale-free estimators alike, the others scaled): a ragged mask, groups of 4."""
    cfg = AlgorithmConfig(advantage_estimator=estimator)
    for mask in (
        torch.ones(4, 3, dtype=torch.bool),
        torch.ones(8, 5, dtype=torch.bool),
    ):  # the review's, ours
        mask[1::2, 2:] = mask.shape[0] == 4  # the review's all ones; ours (8, 5) ragged, used below too
        equal, _ = compute_advantages(cfg, [sign * MAX_ABS_REWARD] * mask.shape[0], mask, group_size=4)
        assert equal[mask].abs().max().item() == 0.0
    unit = [1.0, -1.0, 0.0, 0.5] * 2
    big, _ = compute_advantages(cfg, [sign * MAX_ABS_REWARD * r for r in unit], mask, group_size=4)
    small, _ = compute_advantages(cfg, [sign * r for r in unit], mask, group_size=4)
    scale = MAX_ABS_REWARD if estimator in ("dr_grpo", "rloo") else 1.0  # not normalised by a std
    assert (big[mask] / scale).tolist() == pytest.approx(small[mask].tolist(), abs=1e-4)


def test_a_reward_function_returning_1e200_is_refused_naming_it_index_and_value():
    fn = RewardFunction(lambda prompts, completions, **kw: [0.0, 1e200])
    with pytest.raises(
        InvalidArgumentError, match=r"reward function '.*' returned it at index 1: the reward is 1e\+200"
    ):
        fn.score(["p", "p"], ["a", "b"], {})


def test_a_trajectory_with_a_huge_or_overflowing_reward_is_refused_naming_agent_and_episode():
    ok = one_turn([1], [2], 1.0, "g", agent="solver")
    huge = one_turn([1], [2], 1e200, "g", agent="solver")
    with pytest.raises(
        InvalidArgumentError,
        match=rf"agent 'solver', episode '{huge.episode_id}' \(its return\): the reward is 1e\+200",
    ):
        collate([ok, huge], "solver", pad_id=0)
    # two finite turn rewards whose sum (the return) is -inf
    turns = [Turn(0, [1], [2], reward=-1e308), Turn(1, [1, 2, 3], [4], reward=-1e308)]
    over = Trajectory("ep-over", "solver", turns=turns, group_id="g")
    with pytest.raises(
        InvalidArgumentError, match=r"agent 'solver', episode 'ep-over', turn 0: the reward is -1e\+308"
    ):
        collate([ok, over], "solver", pad_id=0)
    assert collate([ok], "solver", pad_id=0).rewards.tolist() == [1.0]


def test_env_rewards_that_sum_to_minus_inf_stop_the_episode_before_any_hook_logs_it():
    """Two turn rewards of -1e308 each are finite; their sum, the return, is -inf (it was logged as -inf)."""
    from tests.unit.trainer.rollout.test_episode_runner import RelayEnv, _runner

    class Huge(RelayEnv):
        def step(self, actions):
            obs, rewards, terms, truncs, infos = super().step(actions)
            return obs, dict.fromkeys(rewards, -1e308), terms, truncs, infos

    seen = []
    runner = _runner([], [], None, on_episode_end=seen.append)
    runner.make_env = Huge
    with pytest.raises(
        InvalidArgumentError,
        match=r"problem seed 4, agent 'a0' \(episode golden-4-\w+\), its return: the reward is -inf",
    ):
        runner.play([4], max_turns=2)
    assert seen == []
