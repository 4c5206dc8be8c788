"""``AlgoConfig``: the algorithm section of a training config, validated on construction."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from marti.errors import InvalidArgumentError

from ._checks import check_real

KL_ESTIMATORS = ("k1", "k2", "k3")
"""Names accepted by ``AlgoConfig.kl_estimator`` and :func:`services.trainer.algo.kl.kl_penalty`."""

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""Names accepted by ``AlgoConfig.loss_agg_mode`` and :func:`services.trainer.algo.losses.aggregate_loss`."""

GROUP_BY_MODES = ("problem", "agent_turn")
"""Names accepted by ``AlgoConfig.group_by``: what a group estimator compares a sample with."""

TURN_REWARD_MODES = ("outcome", "dense")
"""Names accepted by ``AlgoConfig.turn_rewards``: which reward a turn is credited with."""

PER_AGENT_NORMALIZABLE = ("dr_grpo", "grpo", "rloo")
"""Estimators ``normalize_per_agent`` applies to: the group estimators without a batch whitening of their own
(``reinforce++`` and ``reinforce++_baseline`` already whiten over the agent's batch, ``gae`` does with
``normalize_advantages``)."""


@dataclass(frozen=True)
class AlgoConfig:
    """Hyper-parameters of advantage estimation and the policy / value losses (one per agent).

    Construction validates every field and raises :class:`marti.errors.InvalidArgumentError` naming the field
    and the bad value; the object is immutable afterwards. Build one from a YAML mapping with
    :meth:`from_mapping`, which also rejects unknown keys by name.
    """

    advantage_estimator: str = "grpo"
    """One of ``gae``, ``grpo``, ``dr_grpo``, ``reinforce++``, ``reinforce++_baseline``, ``rloo`` (or any name
    added with ``register_advantage_estimator``). ``gae`` needs critic values."""

    gamma: float = 1.0
    """Discount factor per action token, in [0, 1] (used by ``gae``, ``reinforce++``, ``reinforce++_baseline``)."""

    lambd: float = 0.95
    """GAE lambda, in [0, 1] (``gae`` only)."""

    kl_coef: float = 0.001
    """Weight of the KL to the reference policy, >= 0: a reward penalty ``-kl_coef * kl_t`` per token when
    ``use_kl_loss`` is False, a loss term ``kl_coef * agg(kl)`` when True. 0 disables the KL."""

    kl_estimator: str = "k3"
    """``k1``, ``k2`` or ``k3`` (Schulman 2020, "Approximating KL Divergence")."""

    use_kl_loss: bool = True
    """True: KL is a loss term (GRPO style); False: KL is subtracted from the per-token reward (PPO style)."""

    clip_eps_low: float = 0.2
    """PPO ratio clip below 1: ratios are clipped to ``>= 1 - clip_eps_low``; in [0, 1)."""

    clip_eps_high: float = 0.2
    """PPO ratio clip above 1: ratios are clipped to ``<= 1 + clip_eps_high``; >= 0 (DAPO "clip-higher" uses
    0.28)."""

    dual_clip: float | None = None
    """Dual-clip constant ``c > 1`` (Ye et al. 2020) bounding the loss of negative-advantage tokens by
    ``-c * A``; None disables it (verl uses 3.0)."""

    value_clip: float | None = 0.2
    """Clip range of the value update around the old value, > 0; None disables value clipping."""

    entropy_coef: float = 0.0
    """Weight of the entropy bonus, >= 0 (the loss subtracts ``entropy_coef * agg(entropy)``)."""

    loss_agg_mode: str = "token-mean"
    """How per-token losses become one scalar: ``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean``
    or ``seq-mean-token-sum-norm`` (Dr. GRPO's constant normaliser)."""

    normalize_advantages: bool = True
    """Whiten advantages over all action tokens of the batch for ``gae``; REINFORCE++ and REINFORCE++-baseline
    always whiten (it is part of the algorithm) and the group estimators normalise per group, so this flag is
    read by ``gae`` only."""

    adv_eps: float = 1e-6
    """Added to the group standard deviation in ``grpo`` (verl uses 1e-6); > 0."""

    loss_norm_tokens: int | None = None
    """Constant token count of ``seq-mean-token-sum-norm``; None uses the padded response length ``A``."""

    log_ratio_clamp: float = 20.0
    """Log-probability ratios are clamped to ``[-log_ratio_clamp, log_ratio_clamp]`` before ``exp`` so ratios
    and the k3 estimate stay finite (verl clamps at 20); > 0."""

    group_by: str = "problem"
    """What a group estimator compares a turn with. ``problem`` (default): every turn of the agent's episodes of
    one problem (the ``group_ids``). ``agent_turn`` (AT-GRPO, Zhao et al. 2025, arXiv:2510.11062): only the
    agent's turn of the same index ``t`` in the episodes of that problem (``turn_ids``); a subgroup of one gets
    advantage 0. Read by the group estimators (``grpo``, ``dr_grpo``, ``rloo``, ``reinforce++_baseline``, and
    any registered with ``needs_groups``); the others compare no groups and ignore it."""

    normalize_per_agent: bool = False
    """Dr. MAS (Feng et al. 2026, arXiv:2602.08847): after the group baseline, whiten the agent's per-turn
    advantages over its whole batch, ``A' = (A - mean_b A) / (std_b A + adv_eps)`` (0 if all equal). Each call
    holds one agent's batch, so the statistics are that agent's own. Read by ``grpo``, ``dr_grpo``, ``rloo``
    only (:data:`PER_AGENT_NORMALIZABLE`); the other estimators already whiten over the agent's batch
    (``reinforce++``, ``reinforce++_baseline``) or have ``normalize_advantages`` (``gae``) and ignore it."""

    turn_rewards: str = "outcome"
    """Which reward each turn is credited with. ``outcome`` (default): the episode's credited return for every
    turn. ``dense``: the return-to-go of the env's per-turn rewards, ``G_t = sum_{k >= t} gamma^(k-t) r_k``
    over the agent's turns (``gamma`` discounts per turn here); a trajectory without any per-turn reward falls
    back to its outcome (with a warning once)."""

    def __post_init__(self) -> None:
        from .advantages import available_advantage_estimators

        names = available_advantage_estimators()
        if self.advantage_estimator not in names:
            raise InvalidArgumentError(
                f"advantage_estimator must be one of {list(names)}, got {self.advantage_estimator!r}"
            )
        check_real("gamma", self.gamma, low=0.0, high=1.0)
        check_real("lambd", self.lambd, low=0.0, high=1.0)
        check_real("kl_coef", self.kl_coef, low=0.0)
        if self.kl_estimator not in KL_ESTIMATORS:
            raise InvalidArgumentError(
                f"kl_estimator must be one of {list(KL_ESTIMATORS)}, got {self.kl_estimator!r}"
            )
        for name in ("use_kl_loss", "normalize_advantages"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgumentError(f"{name} must be a bool, got {getattr(self, name)!r}")
        check_real("clip_eps_low", self.clip_eps_low, low=0.0, high=1.0, high_open=True)
        check_real("clip_eps_high", self.clip_eps_high, low=0.0)
        if self.dual_clip is not None:
            check_real("dual_clip", self.dual_clip, low=1.0, low_open=True)
        if self.value_clip is not None:
            check_real("value_clip", self.value_clip, low=0.0, low_open=True)
        check_real("entropy_coef", self.entropy_coef, low=0.0)
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            raise InvalidArgumentError(
                f"loss_agg_mode must be one of {list(LOSS_AGG_MODES)}, got {self.loss_agg_mode!r}"
            )
        check_real("adv_eps", self.adv_eps, low=0.0, low_open=True)
        if self.loss_norm_tokens is not None and (
            isinstance(self.loss_norm_tokens, bool)
            or not isinstance(self.loss_norm_tokens, int)
            or self.loss_norm_tokens < 1
        ):
            raise InvalidArgumentError(
                f"loss_norm_tokens must be an int >= 1 or None, got {self.loss_norm_tokens!r}"
            )
        check_real("log_ratio_clamp", self.log_ratio_clamp, low=0.0, low_open=True)
        self._check_turn_credit()

    def _check_turn_credit(self) -> None:
        """Validate ``group_by``, ``normalize_per_agent`` and ``turn_rewards`` (each on its own: like ``lambd``
        for ``gae``, they are ignored by the estimators they do not apply to)."""
        if self.group_by not in GROUP_BY_MODES:
            raise InvalidArgumentError(
                f"group_by must be one of {list(GROUP_BY_MODES)}, got {self.group_by!r}"
            )
        if not isinstance(self.normalize_per_agent, bool):
            raise InvalidArgumentError(
                f"normalize_per_agent must be a bool, got {self.normalize_per_agent!r}"
            )
        if self.turn_rewards not in TURN_REWARD_MODES:
            raise InvalidArgumentError(
                f"turn_rewards must be one of {list(TURN_REWARD_MODES)}, got {self.turn_rewards!r}"
            )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], prefix: str = "algorithm") -> AlgoConfig:
        """Build a config from a mapping such as the ``algorithm:`` section of a YAML file.

        Args:
            data: Field names to values; missing fields keep their defaults.
            prefix: Dotted path of the section, used in error messages (``algorithm.gama``).

        Returns:
            The validated config.

        Raises:
            InvalidArgumentError: ``data`` is not a mapping, holds an unknown key (named with its dotted path)
                or a bad value.
        """
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(f"{prefix} must be a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                raise InvalidArgumentError(f"unknown key {prefix}.{key}; known keys: {sorted(known)}")
        try:
            return cls(**dict(data))
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"{prefix}.{exc.message}") from None

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a plain dict (for logging and checkpoints)."""
        return dataclasses.asdict(self)
