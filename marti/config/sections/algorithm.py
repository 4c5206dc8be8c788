"""The ``algorithm:`` section of the training config: the RL objective (advantage estimator, KL, clipping, loss
aggregation; docs/algorithms.md). Re-exported by :mod:`marti.config.schema`.
"""

from __future__ import annotations

import typing
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from marti.config.section import NonNegFloat, PositiveFloat, PositiveInt, Section, UnitFloat

Estimator = Literal["gae", "grpo", "dr_grpo", "reinforce++", "reinforce++_baseline", "rloo"]
GROUP_ESTIMATORS = frozenset({"grpo", "dr_grpo", "reinforce++_baseline", "rloo"})
"""Advantage estimators that compare episodes of one problem seed, so need ``rollout.group_size >= 2``."""
KlEstimator = Literal["k1", "k2", "k3"]
LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
GroupBy = Literal["problem", "agent_turn"]
TurnRewards = Literal["outcome", "dense"]
KL_ESTIMATORS: tuple[str, ...] = typing.get_args(KlEstimator)
"""Names accepted by ``algorithm.kl_estimator`` (and ``services.trainer.learn.algo.kl.kl_penalty``)."""
LOSS_AGG_MODES: tuple[str, ...] = typing.get_args(LossAggMode)
"""Names accepted by ``algorithm.loss_agg_mode`` (and ``services.trainer.learn.algo.losses.aggregate_loss``)."""
GROUP_BY_MODES: tuple[str, ...] = typing.get_args(GroupBy)
"""Names accepted by ``algorithm.group_by``: what a group estimator compares a turn with."""
TURN_REWARD_MODES: tuple[str, ...] = typing.get_args(TurnRewards)
"""Names accepted by ``algorithm.turn_rewards``: which reward a turn is credited with."""


class AlgorithmConfig(Section):
    """The RL algorithm: advantage estimator, KL regularisation, PPO clipping, loss aggregation.

    The one algorithm config: the learner, the advantage estimators and the losses of ``services.trainer.learn.algo``
    take this section as it is (validated once, with the config; one set of defaults). Built directly
    (``AlgorithmConfig(advantage_estimator="rloo")``) it is validated the same way and a bad value raises
    :class:`~marti.errors.InvalidArgumentError` naming the key and the value; it is immutable. Numbers must be
    finite and not booleans, switches must be booleans (``gamma: true`` or ``use_kl_loss: 1`` is a mistake).
    """

    model_config = ConfigDict(allow_inf_nan=False)

    advantage_estimator: Estimator = "grpo"
    """``gae`` (PPO with a critic), ``grpo``, ``dr_grpo``, ``reinforce++``, ``reinforce++_baseline``, ``rloo``."""
    gamma: UnitFloat = 1.0
    """Discount factor in [0, 1] (``gae``, ``reinforce++``, ``reinforce++_baseline``, ``turn_rewards: dense``; a
    training config refuses another value than 1 where nothing reads it)."""
    lambd: UnitFloat = 0.95
    """GAE lambda in [0, 1] (``gae`` only: a training config refuses another value with another estimator)."""
    kl_coef: NonNegFloat = 0.001
    """Weight of the KL to the reference policy; 0 disables the reference model."""
    kl_estimator: KlEstimator = "k3"
    """KL estimator (Schulman's k1, k2, k3); with ``kl_coef: 0`` a training config refuses another value."""
    use_kl_loss: bool = True
    """True: KL is a loss term (GRPO style); false: KL is a per-token reward penalty (PPO style). With
    ``kl_coef: 0`` a training config refuses false."""
    clip_eps_low: Annotated[float, Field(ge=0, lt=1)] = 0.2
    """Lower PPO clip range in [0, 1): the ratio is clipped below at ``1 - clip_eps_low``."""
    clip_eps_high: NonNegFloat = 0.2
    """Upper PPO clip range: the ratio is clipped above at ``1 + clip_eps_high`` (DAPO's clip-higher: 0.28)."""
    dual_clip: Annotated[float, Field(gt=1)] | None = None
    """Dual-clip constant c > 1 bounding the loss of negative advantages; null disables it."""
    value_clip: PositiveFloat | None = 0.2
    """Clip range of the value loss (``gae`` only, like ``lambd``); null disables value clipping."""
    entropy_coef: NonNegFloat = 0.0
    """Weight of the entropy bonus."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How token losses are reduced to one number (``seq-mean-token-sum-norm``: Dr. GRPO's constant divisor)."""
    normalize_advantages: bool = True
    """Whiten advantages over the batch (read by ``gae``; the other estimators normalise by construction, and a
    training config refuses ``false`` with them)."""
    adv_eps: PositiveFloat = 1e-6
    """Added to the standard deviation ``grpo`` divides by (the group's), and ``normalize_per_agent`` (the agent
    batch's, with ``dr_grpo`` or ``rloo``); the other estimators divide by no such std, and a training config
    refuses another value than the default with them."""
    loss_norm_tokens: PositiveInt | None = None
    """Constant token divisor of ``seq-mean-token-sum-norm`` (a training config refuses it with another
    ``loss_agg_mode``); null: the padded response length."""
    log_ratio_clamp: PositiveFloat = 20.0
    """Log-ratios are clamped to +-this before ``exp`` so ratios and k3 stay finite."""
    normalize_reward: bool = False
    """Normalise rewards by running statistics before computing advantages: each agent's batch (one credited
    reward per trained turn: the outcome, or with ``turn_rewards: dense`` the turn's return-to-go) updates its
    running mean and standard deviation, then its rewards become ``(r - mean) / (std + 1e-8)`` (OpenRLHF's
    ``--normalize_reward``); the moments are saved with checkpoints."""
    ppo_epochs: PositiveInt = 1
    """Optimisation passes over each rollout batch."""
    critic_learning_rate: PositiveFloat | None = None
    """Critic learning rate (``gae`` only, like ``lambd``); null uses the top-level ``learning_rate``."""
    group_by: GroupBy = "problem"
    """What a group estimator compares each turn with (docs/algorithms.md, "Turn-level credit"). ``problem``:
    all of the agent's turns in the episodes of one problem seed. ``agent_turn`` (AT-GRPO, arXiv:2510.11062):
    only the agent's turn ``t`` in the other episodes of that problem (baseline and std over that subgroup; a
    subgroup of one gets advantage 0). Read by the group estimators (``grpo``, ``dr_grpo``, ``rloo``,
    ``reinforce++_baseline``); the others compare no groups, and a training config refuses ``agent_turn`` with them."""
    normalize_per_agent: bool = False
    """Dr. MAS (arXiv:2602.08847): after the group baseline, whiten each agent's per-turn advantages over its
    own batch, ``(A - mean) / (std + adv_eps)``. Read by ``grpo``, ``dr_grpo`` and ``rloo``; the other
    estimators already whiten over one agent's batch (``gae``: ``normalize_advantages``), and a training config refuses
    it with them. No
    statistic spans several agents either way."""
    turn_rewards: TurnRewards = "outcome"
    """Reward credited to each turn: ``outcome``, the episode's credited return; ``dense``, the return-to-go of
    the env's per-turn rewards from that turn on, discounted by ``gamma`` per turn (an episode without per-turn
    rewards falls back to its outcome, with a warning once). With ``normalize_reward`` the running moments
    normalise these credited rewards (the per-turn returns, or the outcome where there are none)."""
