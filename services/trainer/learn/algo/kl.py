"""KL divergence to the reference policy, estimated per token from sampled log-probabilities.

With ``log_ratio = logprobs - ref_logprobs`` (policy over reference, at the sampled token), the estimators of
``KL(pi || pi_ref)`` from J. Schulman, "Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html)
are:

- ``k1 = log_ratio``: unbiased, high variance, can be negative per token;
- ``k2 = 0.5 * log_ratio^2``: biased, low variance, >= 0;
- ``k3 = exp(-log_ratio) - 1 + log_ratio`` (``(r - 1) - log r`` with ``r = pi_ref / pi``): unbiased, low
  variance, >= 0 (computed as ``expm1(-x) + x`` and clamped at 0 against rounding). verl calls it ``low_var_kl``; GRPO (Shao et al. 2024, eq. 4) uses it as a loss term.

Used as a reward penalty (``kl_coef * k`` subtracted from each action token's reward, OpenRLHF
``compute_reward``) or as a loss term (``kl_coef * agg(k)``, GRPO / verl ``use_kl_loss``); see
:func:`services.trainer.learn.algo.advantages.token_level_rewards` and :func:`services.trainer.learn.algo.losses.actor_loss`.
Shapes follow :mod:`services.trainer.learn.algo.masks`.
"""

from __future__ import annotations

import torch

from marti.config import KL_ESTIMATORS
from marti.errors import InvalidArgumentError

from ._checks import check_real, check_same_shape
from .masks import _mask_like


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: str = "k3",
    action_mask: torch.Tensor | None = None,
    log_ratio_clamp: float = 20.0,
) -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference policy.

    Args:
        logprobs: ``(B, A)`` log-probabilities of the sampled tokens under the policy.
        ref_logprobs: ``(B, A)`` log-probabilities of the same tokens under the reference policy.
        estimator: ``k1``, ``k2`` or ``k3`` (see the module docstring for formulas and sources).
        action_mask: Optional ``(B, A)`` bool / 0-1 mask; masked-out positions are set to 0 (so a -inf
            log-probability at a padding token gives 0, not NaN).
        log_ratio_clamp: ``log_ratio`` is clamped to ``[-c, c]`` before the estimator, so ``exp`` in k3 cannot
            overflow; > 0. The default 20 matches verl.

    Returns:
        ``(B, A)`` tensor of per-token KL estimates (nats), dtype of ``logprobs``.

    Raises:
        InvalidArgumentError: unknown ``estimator``, mismatched shapes, or ``log_ratio_clamp <= 0``.
    """
    if estimator not in KL_ESTIMATORS:
        raise InvalidArgumentError(f"kl estimator must be one of {list(KL_ESTIMATORS)}, got {estimator!r}")
    check_same_shape("ref_logprobs", ref_logprobs, "logprobs", logprobs)
    clamp = check_real("log_ratio_clamp", log_ratio_clamp, low=0.0, low_open=True)
    log_ratio = logprobs - ref_logprobs
    if action_mask is not None:
        m = _mask_like(logprobs, action_mask)
        log_ratio = torch.where(m, log_ratio, torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device))
    log_ratio = log_ratio.clamp(-clamp, clamp)
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    # expm1 keeps precision for small ratios; k3 >= 0 exactly, the clamp removes rounding below 0
    return (torch.expm1(-log_ratio) + log_ratio).clamp(min=0.0)
