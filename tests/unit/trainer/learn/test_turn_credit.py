"""Turn-level credit options of ``algorithm``: ``group_by``, ``normalize_per_agent``, ``turn_rewards``.

A small team batch, hand-computed: 2 problems x 3 episodes x 2 agents x 2 turns. Agent ``b``'s rewards are
agent ``a``'s times 10 (so per-agent normalisation must give both the same advantages). Each agent's batch is
built the way the learner builds it: trajectories -> ``collate`` (one ``Experience``); rows are in
the order P1 e1 t0, e1 t1, e2 t0, e2 t1, e3 t0, e3 t1, then P2 e4 .. e6. Turn 0 has 2 response tokens and
turn 1 one, so token-level and row-level statistics would differ.

Per episode ``(turn rewards, outcome)`` of agent ``a`` (the outcome is the trajectory's ``episode_return``):
P1: ((1, 0), 1), ((0, 0), 0), ((0, 2), 2); P2: ((1, 1), 2), ((1, 1), 2), ((0, 1), 1).
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
from types import SimpleNamespace

import pytest
import torch

from marti.config import AlgorithmConfig, config_from_dict
from marti.errors import InvalidArgumentError
from marti.types.trajectory import Trajectory, Turn
from services.trainer.learn import learner
from services.trainer.learn.algo import compute_advantages, turn_returns
from services.trainer.learn.experience import collate
from services.trainer.learn.learner import (
    LearnerConfig,
    credited_rewards,
    experience_advantages,
    update_agent,
)

EPS = 1e-6
EPISODES = {
    "P1": [((1.0, 0.0), 1.0), ((0.0, 0.0), 0.0), ((0.0, 2.0), 2.0)],
    "P2": [((1.0, 1.0), 2.0), ((1.0, 1.0), 2.0), ((0.0, 1.0), 1.0)],
}
SCALE = {"a": 1.0, "b": 10.0}


def _traj(agent: str, problem: str, ep: int, rewards, outcome, extra_turns: int = 0) -> Trajectory:
    scale = SCALE[agent]
    turns = [
        Turn(
            step=2 * t + (agent == "b"),
            prompt_token_ids=[1, 2],
            response_token_ids=[3] * (2 if t == 0 else 1),
            reward=None if r is None else r * scale,
        )
        for t, r in enumerate(list(rewards) + [0.0] * extra_turns)
    ]
    return Trajectory(
        episode_id=f"{problem}-{ep}",
        agent_id=agent,
        group_id=problem,
        episode_return=None if outcome is None else outcome * scale,
        turns=turns,
    )


def _trajs(agent: str) -> list[Trajectory]:
    return [
        _traj(agent, p, i, rewards, outcome)
        for p, eps in EPISODES.items()
        for i, (rewards, outcome) in enumerate(eps)
    ]


def _batch(agent: str = "a", trajs: list[Trajectory] | None = None):
    trajs = _trajs(agent) if trajs is None else trajs
    return collate(trajs, agent, pad_id=0)


def _rows(adv: torch.Tensor) -> list[float]:
    """The per-row value (every row's first position is an action token)."""
    return [float(x) for x in adv[:, 0]]


def _advantages(agent: str = "a", **kw) -> list[float]:
    return _rows(experience_advantages(AlgorithmConfig(**kw), _batch(agent))[0])


def _close(got: list[float], want: list[float], tol: float = 1e-5) -> None:
    assert got == pytest.approx(want, abs=tol), (got, want)


# ----------------------------------------------------------------------------------------------- defaults


GRPO_PROBLEM_A = (
    # P1 outcome per row [1,1,0,0,2,2]: mean 1, unbiased var 4/5
    [d / (math.sqrt(4 / 5) + EPS) for d in (0, 0, -1, -1, 1, 1)]
    # P2 outcome per row [2,2,2,2,1,1]: mean 5/3, squared deviations 4/3, var 4/15
    + [d / (math.sqrt(4 / 15) + EPS) for d in (1 / 3, 1 / 3, 1 / 3, 1 / 3, -2 / 3, -2 / 3)]
)


def test_rows_record_their_turn_index_and_the_rewards_to_come():
    batch = _batch("a")
    assert batch.turn_ids.tolist() == [0, 1] * 6
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 1.0, 1.0]
    assert batch.turn_rewards[:2].tolist() == [[1.0, 0.0], [0.0, 0.0]]  # turn 1: its reward, then padding
    sub = batch.select(torch.tensor([5, 0]))
    assert sub.turn_ids.tolist() == [1, 0] and sub.turn_rewards.tolist() == [[2.0, 0.0], [1.0, 0.0]]


@pytest.mark.parametrize(
    "estimator", ["grpo", "dr_grpo", "rloo", "reinforce++", "reinforce++_baseline", "gae"]
)
def test_defaults_reproduce_the_advantages_of_before_exactly(estimator):
    cfg = AlgorithmConfig(advantage_estimator=estimator)
    assert (cfg.group_by, cfg.normalize_per_agent, cfg.turn_rewards) == ("problem", False, "outcome")
    batch = _batch("a")
    values = None
    if estimator == "gae":
        values = torch.linspace(0, 1, batch.action_mask.numel()).reshape(batch.action_mask.shape)
    got = experience_advantages(cfg, batch, values=values)
    rewards, groups = batch.rewards.tolist(), [f"P{g}" for g in batch.group_ids.tolist()]
    before = compute_advantages(cfg, rewards, batch.action_mask, groups, values=values)
    assert torch.equal(got[0], before[0]) and torch.equal(got[1], before[1])


def test_default_grpo_by_hand():
    _close(_advantages("a"), GRPO_PROBLEM_A)


# ----------------------------------------------------------------------------------------------- group_by


def test_agent_turn_groups_turn_t_with_turn_t_of_the_problem():
    want = (
        # P1 turn 0 and turn 1 outcomes [1, 0, 2]: mean 1, std 1
        [d / (1 + EPS) for d in (0, 0, -1, -1, 1, 1)]
        # P2 both turns [2, 2, 1]: mean 5/3, var (6/9)/2 = 1/3
        + [d / (math.sqrt(1 / 3) + EPS) for d in (1 / 3, 1 / 3, 1 / 3, 1 / 3, -2 / 3, -2 / 3)]
    )
    _close(_advantages("a", group_by="agent_turn"), want)


def test_agent_turn_with_rloo_and_reinforce_pp_baseline():
    # RLOO P1 turn t [1, 0, 2]: 1 - 1 = 0, 0 - 1.5, 2 - 0.5; P2 [2, 2, 1]: 2 - 1.5, 2 - 1.5, 1 - 2.
    _close(
        _advantages("a", advantage_estimator="rloo", group_by="agent_turn"),
        [0, 0, -1.5, -1.5, 1.5, 1.5, 0.5, 0.5, 0.5, 0.5, -1, -1],
    )
    # REINFORCE++-baseline: un-whitened returns = reward minus its (problem, turn) mean (gamma 1).
    cfg = AlgorithmConfig(
        advantage_estimator="reinforce++_baseline", group_by="agent_turn", turn_rewards="dense"
    )
    returns = _rows(experience_advantages(cfg, _batch("a"))[1])
    # dense P1 t0 [1,0,2] mean 1; t1 [0,0,2] mean 2/3; P2 t0 [2,2,1] mean 5/3; t1 [1,1,1] mean 1
    _close(returns, [0, -2 / 3, -1, -2 / 3, 1, 4 / 3, 1 / 3, 0, 1 / 3, 0, -2 / 3, 0])


def test_a_turn_subgroup_of_one_gets_advantage_zero():
    trajs = _trajs("a")
    trajs[2] = _traj("a", "P1", 2, (0.0, 2.0), 2.0, extra_turns=1)  # only e3 has a turn 2
    batch = _batch("a", trajs)
    assert batch.turn_ids[:7].tolist() == [0, 1, 0, 1, 0, 1, 2]
    adv = _rows(experience_advantages(AlgorithmConfig(group_by="agent_turn"), batch)[0])
    assert adv[6] == 0.0
    _close(adv[:6], [d / (1 + EPS) for d in (0, 0, -1, -1, 1, 1)])


def test_agent_turn_needs_turn_ids_and_a_group_estimator():
    mask = torch.ones(2, 1, dtype=torch.bool)
    with pytest.raises(InvalidArgumentError, match="turn_ids"):
        compute_advantages(AlgorithmConfig(group_by="agent_turn"), [1.0, 0.0], mask, ["g", "g"])
    with pytest.raises(InvalidArgumentError, match="turn_ids"):
        compute_advantages(
            AlgorithmConfig(group_by="agent_turn"), [1.0, 0.0], mask, ["g", "g"], turn_ids=[0, -1]
        )
    with pytest.raises(InvalidArgumentError, match="group_by"):
        AlgorithmConfig(group_by="turn")


@pytest.mark.parametrize("estimator", ["reinforce++", "gae"])
def test_estimators_without_groups_or_with_their_own_whitening_ignore_the_two_options(estimator):
    batch = _batch("a")
    values = torch.linspace(0, 1, batch.action_mask.numel()).reshape(batch.action_mask.shape)
    plain = experience_advantages(AlgorithmConfig(advantage_estimator=estimator), batch, values=values)
    cfg = AlgorithmConfig(advantage_estimator=estimator, group_by="agent_turn", normalize_per_agent=True)
    both = experience_advantages(cfg, batch, values=values)
    assert torch.equal(plain[0], both[0]) and torch.equal(plain[1], both[1])


# ----------------------------------------------------------------------------------------------- turn_rewards


def test_turn_returns_by_hand():
    assert turn_returns([1.0, None, 2.0], 0.5) == [1.5, 1.0, 2.0]
    assert turn_returns([1.0, 0.0, 2.0], 1.0) == [3.0, 2.0, 2.0]
    assert turn_returns([], 1.0) == []
    with pytest.raises(InvalidArgumentError, match="gamma"):
        turn_returns([1.0], 1.5)


def test_dense_credits_the_return_to_go_of_the_turn_rewards():
    batch = _batch("a")
    # P1: e1 (1,0) -> [1,0]; e2 -> [0,0]; e3 (0,2) -> [2,2]; P2: e4, e5 (1,1) -> [2,1]; e6 (0,1) -> [1,1]
    assert credited_rewards(AlgorithmConfig(turn_rewards="dense"), batch).tolist() == [
        1,
        0,
        0,
        0,
        2,
        2,
        2,
        1,
        2,
        1,
        1,
        1,
    ]
    assert torch.equal(credited_rewards(AlgorithmConfig(), batch), batch.rewards)
    want = (
        # P1 rows [1,0,0,0,2,2]: mean 5/6, squared deviations 174/36
        [d / (math.sqrt(174 / 36 / 5) + EPS) for d in (1 / 6, -5 / 6, -5 / 6, -5 / 6, 7 / 6, 7 / 6)]
        # P2 rows [2,1,2,1,1,1]: mean 4/3, squared deviations 12/9
        + [d / (math.sqrt(12 / 9 / 5) + EPS) for d in (2 / 3, -1 / 3, 2 / 3, -1 / 3, -1 / 3, -1 / 3)]
    )
    _close(_advantages("a", turn_rewards="dense"), want)


def test_dense_discounts_per_turn_with_gamma():
    # gamma 0.5: e3 (0, 2) -> [0 + 0.5 * 2, 2] = [1, 2]; P1 rows [1,0,0,0,1,2], mean 2/3 (dr_grpo: no std)
    got = _advantages("a", advantage_estimator="dr_grpo", turn_rewards="dense", gamma=0.5)
    # P2: e4, e5 (1,1) -> [1.5, 1]; e6 (0,1) -> [0.5, 1]: mean 6.5/6
    p2 = [1.5, 1.0, 1.5, 1.0, 0.5, 1.0]
    _close(got, [1 / 3, -2 / 3, -2 / 3, -2 / 3, 1 / 3, 4 / 3] + [r - 6.5 / 6 for r in p2])


def _dense_agent_turn_want() -> list[float]:
    """GRPO, ``turn_rewards=dense`` (gamma 1), ``group_by=agent_turn``, agent ``a``, by hand."""
    s_t1 = math.sqrt(4 / 3) + EPS  # P1 turn 1 returns [0, 0, 2]: mean 2/3, var (24/9)/2
    s_p2 = math.sqrt(1 / 3) + EPS  # P2 turn 0 returns [2, 2, 1]; turn 1 [1, 1, 1] -> 0
    want = [0, -2 / 3 / s_t1, -1 / (1 + EPS), -2 / 3 / s_t1, 1 / (1 + EPS), 4 / 3 / s_t1]
    return want + [1 / 3 / s_p2, 0, 1 / 3 / s_p2, 0, -2 / 3 / s_p2, 0]


def test_dense_and_agent_turn():
    _close(_advantages("a", turn_rewards="dense", group_by="agent_turn"), _dense_agent_turn_want())


def test_dense_without_turn_rewards_falls_back_to_the_outcome_and_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(learner, "_dense_fallback_warned", False)
    trajs = _trajs("a")
    for t in trajs[:2]:  # e1 and e2 report only their return
        for turn in t.turns:
            turn.reward = None
    batch = _batch("a", trajs)
    assert not batch.has_turn_rewards[0] and batch.has_turn_rewards[4]
    with caplog.at_level(logging.WARNING, logger="marti.trainer.learner"):
        got = credited_rewards(AlgorithmConfig(turn_rewards="dense"), batch).tolist()
        credited_rewards(AlgorithmConfig(turn_rewards="dense"), batch)
    assert got[:6] == [1.0, 1.0, 0.0, 0.0, 2.0, 2.0]  # e1, e2 outcomes; e3 dense [2, 2]
    assert len([r for r in caplog.records if "per-turn reward" in r.getMessage()]) == 1


# ----------------------------------------------------------------------------------------------- normalize_per_agent


def test_normalize_per_agent_whitens_each_agents_advantages_over_its_batch():
    # dr_grpo deviations: P1 [0,0,-1,-1,1,1], P2 [1/3 x4, -2/3 x2]; mean 0, squared sum 4 + 4/3 = 16/3
    devs = [0, 0, -1, -1, 1, 1] + [1 / 3] * 4 + [-2 / 3] * 2
    std = math.sqrt(16 / 3 / 11)
    _close(_advantages("a", advantage_estimator="dr_grpo"), devs)
    _close(_advantages("b", advantage_estimator="dr_grpo"), [10 * d for d in devs], 1e-4)
    want = [d / (std + EPS) for d in devs]
    for agent in ("a", "b"):  # each agent by its own statistics: the 10x agent gets the same advantages
        _close(_advantages(agent, advantage_estimator="dr_grpo", normalize_per_agent=True), want)


def test_normalize_per_agent_with_grpo_uses_rows_not_tokens():
    mean, std = statistics.mean(GRPO_PROBLEM_A), statistics.stdev(GRPO_PROBLEM_A)
    _close(_advantages("a", normalize_per_agent=True), [(x - mean) / (std + EPS) for x in GRPO_PROBLEM_A])


def test_all_three_options_together():
    pre = _dense_agent_turn_want()
    mean, std = statistics.mean(pre), statistics.stdev(pre)
    want = [(x - mean) / (std + EPS) for x in pre]
    kw = dict(turn_rewards="dense", group_by="agent_turn", normalize_per_agent=True)
    _close(_advantages("a", **kw), want)
    _close(_advantages("b", **kw), want, 1e-4)


def test_normalize_per_agent_edge_cases_and_validation():
    mask = torch.ones(3, 1, dtype=torch.bool)
    cfg = AlgorithmConfig(normalize_per_agent=True)
    adv, _ = compute_advantages(cfg, [1.0, 1.0, 1.0], mask, ["g"] * 3)
    assert torch.equal(adv, torch.zeros(3, 1))
    with pytest.raises(InvalidArgumentError, match="normalize_per_agent"):
        AlgorithmConfig(normalize_per_agent=1)
    with pytest.raises(InvalidArgumentError, match="turn_rewards"):
        AlgorithmConfig(turn_rewards="per_turn")


# ----------------------------------------------------------------------------------------------- config + learner


BASE = {
    "training_name": "t",
    "agents": [
        {"name": "a", "pretrain_model": "m", "role": "planner"},
        {"name": "b", "pretrain_model": "m", "role": "executor"},
    ],
}


def test_config_keys_reach_the_learners_algorithm_settings():
    from services.trainer.ray.policy_worker import learner_config

    raw = {
        **BASE,
        "algorithm": {"group_by": "agent_turn", "normalize_per_agent": True, "turn_rewards": "dense"},
    }
    algo = learner_config(config_from_dict(raw)).algo
    assert (algo.group_by, algo.normalize_per_agent, algo.turn_rewards) == ("agent_turn", True, "dense")
    default = learner_config(config_from_dict(BASE)).algo
    assert (default.group_by, default.normalize_per_agent, default.turn_rewards) == (
        "problem",
        False,
        "outcome",
    )


@pytest.mark.parametrize(
    ("algorithm", "match"),
    [
        ({"group_by": "episode"}, "group_by"),
        ({"turn_rewards": "per_turn"}, "turn_rewards"),
        ({"normalize_per_agent": "sometimes"}, "normalize_per_agent"),
    ],
)
def test_config_refuses_unknown_values(algorithm, match):
    with pytest.raises(InvalidArgumentError, match=match):
        config_from_dict({**BASE, "algorithm": algorithm})


class _ToyPolicy:
    """Log-probabilities ``-1 + w`` on every position (one trainable scalar), entropy 0."""

    def __init__(self) -> None:
        self.w = torch.nn.Parameter(torch.zeros(()))

    def logprobs(self, agent_id, input_ids, attention_mask, action_mask, return_entropy=False):
        lp = torch.full(action_mask.shape, -1.0) + self.w
        return (lp, torch.zeros(action_mask.shape)) if return_entropy else lp


class _ToyStrategy:
    def autocast(self):
        return contextlib.nullcontext()

    def backward(self, loss):
        loss.backward()

    def step(self):
        return SimpleNamespace(grad_norm=None, lr=0.0, skipped_nonfinite=False)


@pytest.mark.parametrize(
    "options", [{}, {"turn_rewards": "dense", "group_by": "agent_turn", "normalize_per_agent": True}]
)
def test_update_agent_trains_on_the_turn_level_advantages(options):
    """The learner's update computes its advantages from sampled trajectories with the config's options."""
    cfg = AlgorithmConfig(kl_coef=0.0, **options)
    batch = _batch("a")
    result = update_agent(_ToyPolicy(), _ToyStrategy(), batch, LearnerConfig(cfg, micro_batch_size=12))
    if options:
        pre = _dense_agent_turn_want()
        mean, std = statistics.mean(pre), statistics.stdev(pre)
        want = [(x - mean) / (std + EPS) for x in pre]
    else:
        want = GRPO_PROBLEM_A
    _close(_rows(result.advantages), want)
    assert torch.equal(result.advantages[:, 1] != 0, batch.action_mask[:, 1] & (result.advantages[:, 0] != 0))
    assert result.stats["num_samples"] == 12.0


@pytest.mark.parametrize("turn_rewards", ["outcome", "dense"])
def test_normalize_reward_normalises_the_credited_rewards(turn_rewards):
    """``normalize_reward`` with ``dense``: the running moments see the per-turn returns (not the outcomes)."""
    from services.trainer.learn.algo.running_moments import RunningMoments

    cfg = AlgorithmConfig(turn_rewards=turn_rewards)
    batch = _batch("a")
    credited = credited_rewards(cfg, batch).tolist()
    moments = RunningMoments()
    batch = learner.normalize_credit(cfg, batch, moments)
    mean, std = statistics.fmean(credited), statistics.pstdev(credited)
    assert moments.mean == pytest.approx(mean) and moments.std == pytest.approx(std)
    _close(batch.rewards.tolist(), [(r - mean) / (std + 1e-8) for r in credited])
    assert batch.credited and torch.equal(credited_rewards(cfg, batch), batch.rewards)  # used as they are now
    assert batch.select(torch.tensor([0, 1])).credited
