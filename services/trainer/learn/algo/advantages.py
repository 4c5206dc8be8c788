"""Advantage estimators: ``gae``, ``grpo``, ``dr_grpo``, ``reinforce++``, ``reinforce++_baseline``, ``rloo``.

Shapes (declared in :mod:`services.trainer.learn.algo.masks`): ``B`` sequences, ``A`` response tokens, ``G`` samples
per prompt. Entry point: :func:`compute_advantages`. Each estimator is a function
``(cfg, AdvantageInputs) -> (advantages (B, A), returns (B, A))`` kept in a registry
(:func:`get_advantage_estimator`, :func:`register_advantage_estimator`).

How rewards become token rewards (OpenRLHF ``compute_reward``, verl ``apply_kl_penalty``): the outcome reward of
a sequence sits on its last action token; when the KL is a reward penalty (``use_kl_loss=False``) every action
token also gets ``-kl_coef * kl_t``. The sequence score used by the group estimators is the sum of its token
rewards, i.e. ``reward - kl_coef * sum_t kl_t``.

Multi-turn sequences: only action tokens (``action_mask`` True) are time steps. Discounting and GAE skip the
masked tokens between an agent's turns (verl ``compute_gae_advantage_return`` with a response mask), so an
observation in the middle of a trajectory neither discounts nor receives credit.

Edge cases, all finite and documented:

- **All-equal rewards in a group** (including a group whose every reward is 0): advantage exactly 0 for
  ``grpo``, ``dr_grpo``, ``rloo`` and the baseline of ``reinforce++_baseline`` (checked with ``max == min``, not
  with a floating-point ``std``, so rounding cannot leave tiny non-zero values).
- **Group of one** (or a group where only one sample has a reward): advantage 0 for the group estimators, since
  there is nothing to compare with. (verl instead uses mean 0 and std 1, i.e. the raw reward, for GRPO.)
- **All action tokens masked** (a sequence truncated away, or an agent that produced nothing): that row's
  advantages and returns are 0; in ``grpo``/``rloo`` its reward still counts in its group's statistics, since
  it is real evidence about the prompt. A batch where every row is masked gives all-zero advantages.
- **A reward that is +-inf, or beyond +-1e20** (:data:`MAX_ABS_REWARD`, where float32 advantages would be all
  zero or infinite): refused (:func:`marti.rewards.base.check_reward`), its index named; :func:`services.trainer.learn.experience.collate`
  refuses it first, naming the agent and episode.
- **Reward None** (a verifier that failed or timed out; NaN in a reward tensor means the same): the sample is
  *unscored*. Its advantages and returns are 0 and it is left out of every statistic (group mean and std,
  RLOO baselines, batch whitening). Callers should also drop it from the loss mask, e.g.
  ``action_mask & reward_present(rewards)[:, None]``, so it does not dilute token-mean denominators.

Turn-level credit (options of :class:`marti.config.AlgorithmConfig`, defaults = the behaviour
above): ``group_by="agent_turn"`` splits each group into subgroups of one turn index (AT-GRPO, arXiv:2510.11062;
:func:`turn_group_index`), ``normalize_per_agent`` whitens the per-turn advantages over the agent's batch after
the group baseline (Dr. MAS, arXiv:2602.08847; :func:`normalize_per_agent`), and :func:`turn_returns` gives the
per-turn return-to-go that ``turn_rewards="dense"`` credits (the learner passes it as the rewards).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from marti.config import AlgorithmConfig
from marti.errors import InvalidArgumentError
from marti.rewards.base import MAX_ABS_REWARD, check_reward

from ._checks import as_bool_mask, check_finite, check_same_shape, check_tensor
from .masks import last_action_index, masked_whiten

PER_AGENT_NORMALIZABLE = ("dr_grpo", "grpo", "rloo")
"""Estimators ``algorithm.normalize_per_agent`` applies to: the group estimators without a batch whitening of their
own (``reinforce++`` and ``reinforce++_baseline`` already whiten over the agent's batch, ``gae`` does with
``normalize_advantages``)."""

RewardsLike = torch.Tensor | Sequence[float | None]
GroupsLike = torch.Tensor | Sequence[Hashable] | int | None


@dataclass(frozen=True)
class AdvantageInputs:
    """Validated inputs every estimator receives (all float tensors are float64, on one device).

    Attributes:
        rewards: ``(B,)`` outcome rewards; 0 where ``reward_present`` is False.
        reward_present: ``(B,)`` bool, False for an unscored sample (reward None / NaN).
        action_mask: ``(B, A)`` bool; True on tokens this agent generated.
        kl_rewards: ``(B, A)`` per-token KL reward penalty ``-kl_coef * kl`` on action tokens, 0 elsewhere (all
            0 when the KL is a loss term or not given).
        group_index: ``(B,)`` int64 group of each sample, in ``0..num_groups-1``.
        num_groups: Number of groups.
        values: ``(B, A)`` critic values (0 on masked tokens), or None.
    """

    rewards: torch.Tensor
    reward_present: torch.Tensor
    action_mask: torch.Tensor
    kl_rewards: torch.Tensor
    group_index: torch.Tensor
    num_groups: int
    values: torch.Tensor | None

    @property
    def train_mask(self) -> torch.Tensor:
        """``(B, A)`` bool: action tokens of scored samples (the tokens that enter statistics)."""
        return self.action_mask & self.reward_present[:, None]

    def token_rewards(self, rewards: torch.Tensor | None = None) -> torch.Tensor:
        """``(B, A)`` token rewards: ``rewards`` (default: the outcome rewards) on each row's last action token,
        plus the KL penalty; rows without action tokens get no outcome reward."""
        r = self.rewards if rewards is None else rewards
        out = self.kl_rewards.clone()
        last = last_action_index(self.action_mask)
        rows = (last >= 0).nonzero(as_tuple=True)[0]
        out[rows, last[rows]] += r[rows]
        return out

    def scores(self) -> torch.Tensor:
        """``(B,)`` sequence scores: outcome reward plus the summed KL penalty."""
        return self.rewards + self.kl_rewards.sum(dim=1)


EstimatorFn = Callable[[AlgorithmConfig, AdvantageInputs], tuple[torch.Tensor, torch.Tensor]]
_REGISTRY: dict[str, EstimatorFn] = {}
_NEEDS_GROUPS: set[str] = set()


def register_advantage_estimator(
    name: str, needs_groups: bool = False
) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator adding an estimator to the registry under ``name``.

    Args:
        name: The name ``AlgorithmConfig.advantage_estimator`` selects it by.
        needs_groups: True if the estimator compares samples of one prompt (then ``compute_advantages`` requires
            ``group_ids`` or ``group_size``).

    Returns:
        The decorator; it returns the function unchanged.

    Raises:
        InvalidArgumentError: ``name`` is already registered.
    """

    def deco(fn: EstimatorFn) -> EstimatorFn:
        if name in _REGISTRY:
            raise InvalidArgumentError(f"advantage estimator {name!r} is already registered")
        _REGISTRY[name] = fn
        if needs_groups:
            _NEEDS_GROUPS.add(name)
        return fn

    return deco


def get_advantage_estimator(name: str) -> EstimatorFn:
    """Return the estimator registered as ``name``.

    Raises:
        InvalidArgumentError: no estimator has that name (the known names are listed).
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise InvalidArgumentError(
            f"unknown advantage estimator {name!r}; known: {list(available_advantage_estimators())}"
        ) from None


def estimator_needs_groups(name: str) -> bool:
    """True if the estimator registered as ``name`` compares the samples of a group (needs ``group_ids``)."""
    return name in _NEEDS_GROUPS


def available_advantage_estimators() -> tuple[str, ...]:
    """Names of all registered estimators, sorted."""
    return tuple(sorted(_REGISTRY))


# ----------------------------------------------------------------------------------------------- input helpers


def reward_present(rewards: RewardsLike) -> torch.Tensor:
    """``(B,)`` bool: True where a sample has a reward (not None, not NaN)."""
    return rewards_to_tensor(rewards)[1]


def rewards_to_tensor(rewards: RewardsLike) -> tuple[torch.Tensor, torch.Tensor]:
    """Convert rewards that may be missing into a float64 tensor and a presence mask.

    Args:
        rewards: ``(B,)`` tensor (NaN = no reward) or a sequence of floats and ``None``.

    Returns:
        ``(values (B,), present (B,))``: float64 rewards with 0 where missing, and a bool mask.

    Raises:
        InvalidArgumentError: not 1-D, or a reward is +-inf, beyond +-:data:`MAX_ABS_REWARD` or not a number
            (its index is named).
    """
    if isinstance(rewards, torch.Tensor):
        check_tensor("rewards", rewards, 1)
        values = rewards.detach().to(torch.float64)
    else:
        if isinstance(rewards, str | bytes) or not isinstance(rewards, Sequence):
            raise InvalidArgumentError(
                f"rewards must be a tensor or a sequence, got {type(rewards).__name__}"
            )
        items = []
        for i, r in enumerate(rewards):
            if r is None:
                items.append(math.nan)
            elif isinstance(r, bool) or not isinstance(r, int | float):
                raise InvalidArgumentError(f"rewards[{i}] must be a number or None, got {r!r}")
            else:
                items.append(float(r))
        values = torch.tensor(items, dtype=torch.float64)
    present = ~torch.isnan(values)
    check_finite("rewards", values, present)
    big = (present & (values.abs() > MAX_ABS_REWARD)).nonzero()
    if len(big):
        check_reward(float(values[int(big[0])]), f"rewards[{int(big[0])}]")
    return torch.where(present, values, torch.zeros_like(values)), present


def group_index_from(groups: GroupsLike, batch_size: int) -> tuple[torch.Tensor, int]:
    """Turn group ids or a group size into a dense ``(B,)`` group index.

    Args:
        groups: ``(B,)`` integer tensor or sequence of hashable ids (e.g. prompt uids; samples with equal ids
            form a group, in any order); or an int ``G``: consecutive blocks of ``G`` samples form a group;
            or None: every sample is its own group.
        batch_size: ``B``.

    Returns:
        ``(index (B,) int64, num_groups)``.

    Raises:
        InvalidArgumentError: ``G < 1``, ``B`` not a multiple of ``G``, or the ids have another length than ``B``.
    """
    if groups is None:
        return torch.arange(batch_size), batch_size
    if isinstance(groups, bool):
        raise InvalidArgumentError(f"group_size must be an int >= 1, got {groups!r}")
    if isinstance(groups, int):
        if groups < 1:
            raise InvalidArgumentError(f"group_size must be an int >= 1, got {groups}")
        if batch_size % groups:
            raise InvalidArgumentError(f"batch size {batch_size} is not a multiple of group_size {groups}")
        return torch.arange(batch_size) // groups, batch_size // groups
    if isinstance(groups, torch.Tensor):
        check_tensor("group_ids", groups, 1)
        if groups.dtype.is_floating_point:
            raise InvalidArgumentError(f"group_ids must be an integer tensor, got dtype {groups.dtype}")
        ids: Sequence[Hashable] = groups.tolist()
    elif isinstance(groups, Sequence) and not isinstance(groups, str | bytes):
        ids = groups
    else:
        raise InvalidArgumentError(
            f"group_ids must be a tensor, a sequence or an int, got {type(groups).__name__}"
        )
    if len(ids) != batch_size:
        raise InvalidArgumentError(f"group_ids has length {len(ids)} but the batch size is {batch_size}")
    dense: dict[Hashable, int] = {}
    index = [dense.setdefault(g, len(dense)) for g in ids]
    return torch.tensor(index, dtype=torch.long), len(dense)


def turn_group_index(
    index: torch.Tensor, turn_ids: torch.Tensor | Sequence[int] | None, batch_size: int
) -> tuple[torch.Tensor, int]:
    """Split every group into subgroups of one turn index (``group_by="agent_turn"``).

    AT-GRPO (Zhao et al. 2025, "Stronger Together", arXiv:2510.11062) groups by agent and turn: turn ``t`` of
    an agent is compared only with the same agent's turn ``t`` of the other episodes of the problem. A batch
    holds one agent's turns, so the subgroup key is ``(group, turn)``.

    Args:
        index: ``(B,)`` int64 dense group index (:func:`group_index_from`).
        turn_ids: ``(B,)`` int turn index of each sample within its episode (the agent's turn ``t``, 0-based).
        batch_size: ``B``.

    Returns:
        ``(index (B,) int64, num_groups)`` over the ``(group, turn)`` pairs, numbered by first appearance.

    Raises:
        InvalidArgumentError: ``turn_ids`` is None, has another length than ``B``, or holds a value that is not
            an int >= 0.
    """
    if turn_ids is None:
        raise InvalidArgumentError("group_by='agent_turn' needs turn_ids (the turn index of each sample)")
    if isinstance(turn_ids, torch.Tensor):
        check_tensor("turn_ids", turn_ids, 1)
        if turn_ids.dtype.is_floating_point:
            raise InvalidArgumentError(f"turn_ids must be an integer tensor, got dtype {turn_ids.dtype}")
        turns: Sequence[int] = turn_ids.tolist()
    else:
        turns = turn_ids
    if len(turns) != batch_size:
        raise InvalidArgumentError(f"turn_ids has length {len(turns)} but the batch size is {batch_size}")
    for i, t in enumerate(turns):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise InvalidArgumentError(f"turn_ids[{i}] must be an int >= 0, got {t!r}")
    return group_index_from(list(zip(index.tolist(), turns, strict=True)), batch_size)


def turn_returns(rewards: Sequence[float | None], gamma: float) -> list[float]:
    """Per-turn return-to-go of one agent's episode: ``G_t = r_t + gamma * G_{t+1}``, ``G_T = 0``.

    The credit of ``turn_rewards="dense"`` (REINFORCE, Williams 1992, applied per turn as in multi-turn agent RL,
    e.g. AT-GRPO, arXiv:2510.11062, which rewards each turn). A turn whose reward is None (the env set none)
    contributes 0 but is still a step: it discounts the later rewards.

    Args:
        rewards: ``(T,)`` the env's reward of each of the agent's turns, in turn order (None = not set).
        gamma: Discount per turn, in [0, 1].

    Returns:
        ``(T,)`` float returns-to-go.

    Raises:
        InvalidArgumentError: ``gamma`` outside [0, 1] or a reward that is not a finite number.
    """
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0.0 <= gamma <= 1.0:
        raise InvalidArgumentError(f"gamma must be a number in [0, 1], got {gamma!r}")
    out = [0.0] * len(rewards)
    acc = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        r = rewards[t]
        if r is not None and (isinstance(r, bool) or not isinstance(r, int | float) or not math.isfinite(r)):
            raise InvalidArgumentError(f"turn reward {t} must be a finite number or None, got {r!r}")
        acc = (0.0 if r is None else float(r)) + gamma * acc
        out[t] = acc
    return out


# ----------------------------------------------------------------------------------------------- group statistics


@dataclass(frozen=True)
class GroupStats:
    """Per-sample view of its group's statistics over scored samples (all ``(B,)``, float64).

    Attributes:
        count: Number of scored samples in the group.
        total: Sum of their scores.
        mean: Their mean (0 for an empty group).
        std: Unbiased standard deviation (Bessel), 0 when ``count < 2``.
        all_equal: True when the group's scored samples all have the same score (or ``count < 2``).
    """

    count: torch.Tensor
    total: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    all_equal: torch.Tensor


def group_stats(
    scores: torch.Tensor, present: torch.Tensor, index: torch.Tensor, num_groups: int
) -> GroupStats:
    """Group count, sum, mean, unbiased std and equality of ``scores``, over samples where ``present``.

    Args:
        scores: ``(B,)`` float64.
        present: ``(B,)`` bool; absent samples are ignored.
        index: ``(B,)`` int64 group index.
        num_groups: Number of groups.

    Returns:
        :class:`GroupStats`, gathered back to ``(B,)``.
    """
    zeros = torch.zeros(num_groups, dtype=scores.dtype, device=scores.device)
    s = torch.where(present, scores, torch.zeros_like(scores))
    count = zeros.index_add(0, index, present.to(scores.dtype))
    total = zeros.index_add(0, index, s)
    mean = total / count.clamp(min=1)
    dev = torch.where(present, scores - mean[index], torch.zeros_like(scores))
    sq = zeros.index_add(0, index, dev.square())
    std = torch.where(count > 1, (sq / (count - 1).clamp(min=1)).sqrt(), zeros)
    neg_inf = torch.full_like(zeros, -math.inf)
    pos_inf = torch.full_like(zeros, math.inf)
    hi = neg_inf.scatter_reduce(0, index, torch.where(present, scores, -math.inf), "amax")
    lo = pos_inf.scatter_reduce(0, index, torch.where(present, scores, math.inf), "amin")
    all_equal = (count < 2) | (hi == lo)
    return GroupStats(count[index], total[index], mean[index], std[index], all_equal[index])


def _broadcast(per_sample: torch.Tensor, inputs: AdvantageInputs) -> torch.Tensor:
    per_sample = torch.where(inputs.reward_present, per_sample, torch.zeros_like(per_sample))
    return torch.where(inputs.action_mask, per_sample[:, None], torch.zeros_like(inputs.kl_rewards))


def discounted_returns(token_rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Reward-to-go over action tokens: ``G_t = r_t + gamma * G_{t'}``, ``t'`` the next action token.

    Source: REINFORCE (Williams 1992); OpenRLHF ``get_cumulative_returns``. Masked tokens are skipped (they
    neither discount nor receive a return), which is what multi-turn trajectories need.

    Args:
        token_rewards: ``(B, A)`` float.
        action_mask: ``(B, A)`` bool.
        gamma: Discount per action token, in [0, 1].

    Returns:
        ``(B, A)`` returns; 0 on masked tokens.
    """
    if token_rewards.shape[1] == 0:
        return torch.zeros_like(token_rewards)
    # iterate over contiguous per-token columns (A, B) instead of strided writes into (B, A)
    rewards_by_t, mask_by_t = token_rewards.t().contiguous().unbind(0), action_mask.t().contiguous().unbind(0)
    running = torch.zeros_like(rewards_by_t[0])
    out: list[torch.Tensor] = []
    for r_t, m_t in zip(reversed(rewards_by_t), reversed(mask_by_t), strict=True):
        running = torch.where(m_t, r_t + gamma * running, running)
        out.append(torch.where(m_t, running, torch.zeros_like(running)))
    return torch.stack(out[::-1], dim=1)


# ----------------------------------------------------------------------------------------------- estimators


@register_advantage_estimator("gae")
def gae(cfg: AlgorithmConfig, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation with a critic (Schulman et al. 2016, arXiv:1506.02438).

    ``delta_t = r_t + gamma * V_{t'} - V_t``, ``A_t = delta_t + gamma * lambd * A_{t'}``, ``t'`` the next action
    token (``V`` and ``A`` are 0 after the last one: the sequence ends there), ``returns = A + V``. Masked
    tokens are skipped as in verl ``compute_gae_advantage_return``. With ``cfg.normalize_advantages`` the
    advantages are whitened over the batch's action tokens (verl, OpenRLHF); returns are not.

    Returns:
        ``(advantages (B, A), returns (B, A))``, 0 on masked tokens and unscored rows.
    """
    if inputs.values is None:
        raise InvalidArgumentError("advantage_estimator 'gae' needs critic values (B, A); got values=None")
    mask = inputs.train_mask
    rewards = inputs.token_rewards()
    values = inputs.values
    adv = torch.zeros_like(rewards)
    if rewards.shape[1]:
        columns = (x.t().contiguous().unbind(0) for x in (rewards, values, mask))
        next_value = torch.zeros_like(rewards[:, 0])
        last_gae = torch.zeros_like(next_value)
        out: list[torch.Tensor] = []
        for r_t, v_t, m_t in zip(*(reversed(c) for c in columns), strict=True):
            delta = r_t + cfg.gamma * next_value - v_t
            gae_t = delta + cfg.gamma * cfg.lambd * last_gae
            next_value = torch.where(m_t, v_t, next_value)
            last_gae = torch.where(m_t, gae_t, last_gae)
            out.append(torch.where(m_t, gae_t, torch.zeros_like(gae_t)))
        adv = torch.stack(out[::-1], dim=1)
    returns = torch.where(mask, adv + values, torch.zeros_like(adv))
    if cfg.normalize_advantages:
        adv = masked_whiten(adv, mask)
    return adv, returns


@register_advantage_estimator("grpo", needs_groups=True)
def grpo(cfg: AlgorithmConfig, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-normalised outcome advantage (GRPO, Shao et al. 2024, arXiv:2402.03300, sec. 4.1.2).

    ``A_i = (s_i - mean(s_g)) / (std(s_g) + adv_eps)`` for every action token of sample ``i`` in group ``g``,
    with the unbiased std (as verl ``compute_grpo_outcome_advantage`` and OpenRLHF). Returns equal advantages
    (verl). All-equal groups and groups of one give 0.
    """
    scores = inputs.scores()
    st = group_stats(scores, inputs.reward_present, inputs.group_index, inputs.num_groups)
    adv = (scores - st.mean) / (st.std + cfg.adv_eps)
    adv = torch.where(st.all_equal, torch.zeros_like(adv), adv)
    out = _broadcast(adv, inputs)
    return out, out.clone()


@register_advantage_estimator("dr_grpo", needs_groups=True)
def dr_grpo(cfg: AlgorithmConfig, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO done right (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783).

    ``A_i = s_i - mean(s_g)``: no division by the group std (the question-level difficulty bias). The paper also
    removes the per-sequence length normalisation: pair it with ``loss_agg_mode="seq-mean-token-sum-norm"``.
    All-equal groups and groups of one give 0.
    """
    scores = inputs.scores()
    st = group_stats(scores, inputs.reward_present, inputs.group_index, inputs.num_groups)
    adv = torch.where(st.all_equal, torch.zeros_like(scores), scores - st.mean)
    out = _broadcast(adv, inputs)
    return out, out.clone()


@register_advantage_estimator("rloo", needs_groups=True)
def rloo(cfg: AlgorithmConfig, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE Leave-One-Out (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740, eq. 6).

    ``A_i = s_i - (sum_{j in g, j != i} s_j) / (n_g - 1)``, the mean of the *other* samples as baseline
    (verl ``compute_rloo_outcome_advantage``). Groups of one have no baseline and give 0; all-equal groups 0.
    """
    scores = inputs.scores()
    st = group_stats(scores, inputs.reward_present, inputs.group_index, inputs.num_groups)
    baseline = (st.total - scores) / (st.count - 1).clamp(min=1)
    adv = torch.where(st.all_equal, torch.zeros_like(scores), scores - baseline)
    out = _broadcast(adv, inputs)
    return out, out.clone()


@register_advantage_estimator("reinforce++")
def reinforce_pp(cfg: AlgorithmConfig, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262; OpenRLHF ``advantage_estimator=reinforce``).

    Token rewards (outcome on the last action token, ``-kl_coef * kl_t`` on each when the KL is a reward
    penalty), discounted returns ``G_t`` over action tokens, then global batch normalisation:
    ``A = (G - mean(G)) / sqrt(var(G) + 1e-8)`` over all action tokens of all scored samples.

    Returns:
        ``(advantages (B, A), returns (B, A))``: whitened advantages, un-whitened discounted returns.
    """
    mask = inputs.train_mask
    returns = discounted_returns(inputs.token_rewards(), mask, cfg.gamma)
    return masked_whiten(returns, mask), returns


@register_advantage_estimator("reinforce++_baseline", needs_groups=True)
def reinforce_pp_baseline(cfg: AlgorithmConfig, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline (Hu 2025, arXiv:2501.03262 v3; OpenRLHF ``reinforce_baseline``).

    The outcome reward minus its group's mean (0 for all-equal groups and groups of one), then as
    :func:`reinforce_pp`: KL token penalty, discounted returns, global batch whitening.
    """
    st = group_stats(inputs.rewards, inputs.reward_present, inputs.group_index, inputs.num_groups)
    centred = torch.where(st.all_equal, torch.zeros_like(inputs.rewards), inputs.rewards - st.mean)
    mask = inputs.train_mask
    returns = discounted_returns(inputs.token_rewards(centred), mask, cfg.gamma)
    return masked_whiten(returns, mask), returns


def normalize_per_agent(adv: torch.Tensor, train_mask: torch.Tensor, eps: float) -> torch.Tensor:
    """Whiten one agent's per-turn advantages over its batch (Dr. MAS, Feng et al. 2026, arXiv:2602.08847).

    Dr. MAS normalises advantages per agent with that agent's own statistics instead of statistics pooled over
    all agents. Here each row is one turn whose advantage is constant over its action tokens (the group
    estimators broadcast a per-sample value), so the statistics are over rows, not tokens:
    ``A'_i = (A_i - mean_b A) / (std_b A + eps)``, unbiased std over the rows with an action token of a scored
    sample; 0 when those rows all have the same advantage (or there is only one).

    Args:
        adv: ``(B, A)`` advantages of one agent's batch, constant over each row's action tokens.
        train_mask: ``(B, A)`` bool action tokens of scored samples.
        eps: Added to the std (``adv_eps``).

    Returns:
        ``(B, A)`` whitened advantages, 0 off ``train_mask``.
    """
    rows = train_mask.any(dim=1)
    last = last_action_index(train_mask).clamp(min=0)
    per_row = adv.gather(1, last[:, None]).squeeze(1)
    st = group_stats(per_row, rows, torch.zeros_like(last), 1)
    out = torch.where(st.all_equal, torch.zeros_like(per_row), (per_row - st.mean) / (st.std + eps))
    out = torch.where(rows, out, torch.zeros_like(out))
    return torch.where(train_mask, out[:, None], torch.zeros_like(adv))


# ----------------------------------------------------------------------------------------------- entry point


def token_level_kl_rewards(
    kl: torch.Tensor | None, action_mask: torch.Tensor, kl_coef: float, use_kl_loss: bool
) -> torch.Tensor:
    """``(B, A)`` KL reward penalty ``-kl_coef * kl`` on action tokens (0 if the KL is a loss term or absent).

    Source: OpenRLHF ``compute_reward``, verl ``apply_kl_penalty`` (Ziegler et al. 2019, arXiv:1909.08593).
    """
    zeros = torch.zeros(action_mask.shape, dtype=torch.float64, device=action_mask.device)
    if kl is None or use_kl_loss or kl_coef == 0:
        return zeros
    return torch.where(action_mask, -kl_coef * kl.detach().to(torch.float64), zeros)


def compute_advantages(
    cfg: AlgorithmConfig,
    rewards: RewardsLike,
    action_mask: torch.Tensor,
    group_ids: GroupsLike = None,
    values: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    *,
    group_size: int | None = None,
    turn_ids: torch.Tensor | Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns of one agent's batch with the estimator ``cfg.advantage_estimator``.

    With ``cfg.group_by="agent_turn"`` a group estimator compares each sample only with the samples of its
    group that have the same ``turn_ids`` value (:func:`turn_group_index`); with ``cfg.normalize_per_agent``
    (``grpo``, ``dr_grpo``, ``rloo``) the advantages are then whitened over the batch
    (:func:`normalize_per_agent`; the returns stay the estimator's). Other estimators ignore these two. ``cfg.turn_rewards`` is the caller's: pass the per-turn returns (:func:`turn_returns`) as
    ``rewards`` for ``dense``.

    Args:
        cfg: Algorithm config.
        rewards: ``(B,)`` outcome rewards; a tensor (NaN = no reward) or a sequence with ``None`` for no reward.
        action_mask: ``(B, A)`` bool / 0-1: tokens this agent generated.
        group_ids: ``(B,)`` group ids (tensor or sequence of hashables; equal ids = same prompt), or an int
            group size ``G`` (consecutive blocks of ``G``). Required by ``grpo``, ``dr_grpo``, ``rloo`` and
            ``reinforce++_baseline``; ignored by the others.
        values: ``(B, A)`` critic values of the old policy; required by ``gae``.
        kl: ``(B, A)`` per-token KL to the reference (:func:`~services.trainer.learn.algo.kl.kl_penalty`); subtracted
            from the rewards as ``kl_coef * kl`` when ``cfg.use_kl_loss`` is False, ignored when True.
        group_size: Keyword alternative to passing an int as ``group_ids``.
        turn_ids: ``(B,)`` int turn index of each sample within its episode; required by
            ``group_by="agent_turn"`` with a group estimator, ignored otherwise.

    Returns:
        ``(advantages (B, A), returns (B, A))``, float32 (or the dtype of ``values``), detached, 0 on masked
        tokens and on unscored samples. See the module docstring for the edge cases.

    Raises:
        InvalidArgumentError: mismatched shapes, a non-finite reward / value / kl on an action token, missing
            groups or values for an estimator that needs them, a bad group size, or ``group_by="agent_turn"``
            without valid ``turn_ids``.
    """
    estimator = get_advantage_estimator(cfg.advantage_estimator)
    check_tensor("action_mask", action_mask, 2)
    mask = as_bool_mask("action_mask", action_mask)
    reward_values, present = rewards_to_tensor(rewards)
    if reward_values.shape[0] != mask.shape[0]:
        raise InvalidArgumentError(
            f"rewards has {reward_values.shape[0]} entries but action_mask has {mask.shape[0]} rows"
        )
    device = mask.device
    reward_values, present = reward_values.to(device), present.to(device)
    if group_ids is not None and group_size is not None:
        raise InvalidArgumentError("pass either group_ids or group_size, not both")
    groups = group_size if group_size is not None else group_ids
    if groups is None and cfg.advantage_estimator in _NEEDS_GROUPS:
        raise InvalidArgumentError(
            f"advantage_estimator {cfg.advantage_estimator!r} needs group_ids or group_size; got neither"
        )
    index, num_groups = group_index_from(groups, mask.shape[0])
    if cfg.group_by == "agent_turn" and cfg.advantage_estimator in _NEEDS_GROUPS:
        index, num_groups = turn_group_index(index, turn_ids, mask.shape[0])
    index = index.to(device)
    out_dtype = torch.float32
    values64 = None
    if values is not None:
        check_tensor("values", values, 2)
        check_same_shape("values", values, "action_mask", mask)
        check_finite("values", values.detach(), mask)
        out_dtype = values.dtype if values.dtype.is_floating_point else torch.float32
        values64 = torch.where(mask, values.detach().to(torch.float64), torch.zeros((), dtype=torch.float64))
    if kl is not None:
        check_tensor("kl", kl, 2)
        check_same_shape("kl", kl, "action_mask", mask)
        check_finite("kl", kl.detach(), mask)
    inputs = AdvantageInputs(
        rewards=reward_values,
        reward_present=present,
        action_mask=mask,
        kl_rewards=token_level_kl_rewards(kl, mask, cfg.kl_coef, cfg.use_kl_loss),
        group_index=index.to(device),
        num_groups=num_groups,
        values=values64,
    )
    adv, returns = estimator(cfg, inputs)
    if cfg.normalize_per_agent and cfg.advantage_estimator in PER_AGENT_NORMALIZABLE:
        adv = normalize_per_agent(adv, inputs.train_mask, cfg.adv_eps)
    zero = torch.zeros((), dtype=adv.dtype, device=device)
    keep = inputs.train_mask
    return torch.where(keep, adv, zero).to(out_dtype), torch.where(keep, returns, zero).to(out_dtype)
