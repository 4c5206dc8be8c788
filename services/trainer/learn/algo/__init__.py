"""Pure-torch RL algorithms for training LLM agents: advantages, KL, losses, masks.

Shapes are declared once in :mod:`services.trainer.learn.algo.masks` (``B``, ``T``, ``A``, ``G``, ``N``, ``V``).
Nothing here imports gRPC, Ray or transformers; every function is a plain tensor computation with its formula's
source in its docstring. Errors are :class:`marti.errors.InvalidArgumentError` naming the bad value.

Every function takes the ``algorithm`` section of the training config, :class:`marti.config.AlgorithmConfig`.

Typical use, for one agent's batch::

    cfg = AlgorithmConfig(advantage_estimator="grpo")  # marti.config's algorithm section
    adv, ret = compute_advantages(cfg, rewards, action_mask, group_size=8)
    loss, stats = actor_loss(cfg, logprobs, old_logprobs, adv, action_mask, ref_logprobs=ref_logprobs)
"""

from .advantages import (
    AdvantageInputs,
    available_advantage_estimators,
    compute_advantages,
    discounted_returns,
    estimator_needs_groups,
    get_advantage_estimator,
    group_index_from,
    normalize_per_agent,
    register_advantage_estimator,
    reward_present,
    rewards_to_tensor,
    turn_group_index,
    turn_returns,
)
from .kl import kl_penalty
from .losses import (
    actor_loss,
    aggregate_loss,
    entropy_from_logits,
    kl_loss,
    logprobs_from_logits,
    policy_loss,
    value_loss,
)
from .masks import (
    action_mask_from_owners,
    action_mask_from_spans,
    last_action_index,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

__all__ = [
    "AdvantageInputs",
    "action_mask_from_owners",
    "action_mask_from_spans",
    "actor_loss",
    "aggregate_loss",
    "available_advantage_estimators",
    "compute_advantages",
    "discounted_returns",
    "entropy_from_logits",
    "estimator_needs_groups",
    "get_advantage_estimator",
    "group_index_from",
    "kl_loss",
    "kl_penalty",
    "last_action_index",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "normalize_per_agent",
    "policy_loss",
    "register_advantage_estimator",
    "reward_present",
    "rewards_to_tensor",
    "turn_group_index",
    "turn_returns",
    "value_loss",
]
