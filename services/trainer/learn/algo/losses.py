"""Policy, value, KL and entropy losses, and how per-token losses become one scalar.

Shapes (declared in :mod:`services.trainer.learn.algo.masks`): ``B`` sequences, ``A`` response tokens, ``V`` vocabulary.
Every loss takes an ``action_mask`` ``(B, A)``; only True tokens (the ones this agent generated) contribute, and
values at masked positions (padding log-probabilities of -inf, garbage advantages) are ignored, never
multiplied by 0 (which would turn -inf into NaN). A batch with no action token gives a loss of exactly 0 that is
still attached to the graph, so ``backward()`` works and produces zero gradients.

Stats dicts hold detached 0-dim tensors (call ``float()`` to log them; this avoids a device sync per value).
"""

from __future__ import annotations

import torch

from marti.config import LOSS_AGG_MODES, AlgorithmConfig
from marti.errors import InvalidArgumentError

from ._checks import as_bool_mask, check_real, check_same_shape, check_tensor
from .kl import kl_penalty
from .masks import masked_mean, masked_sum


def _zero_masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _mask_for(name: str, tensor: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    check_tensor("action_mask", action_mask, 2)
    check_same_shape(name, tensor, "action_mask", action_mask)
    return as_bool_mask("action_mask", action_mask)


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probability of each label under ``softmax(logits / temperature)``.

    ``log p(y) = z_y - logsumexp(z)`` with ``z = logits / temperature`` (verl ``logprobs_from_logits``; it
    avoids materialising the full ``log_softmax``). The sampling temperature must match the one used for
    rollouts, or the ratio to the rollout log-probabilities is biased.

    Args:
        logits: ``(B, A, V)`` float; the logits that *predicted* each label (already shifted by one position).
        labels: ``(B, A)`` int64 token ids in ``[0, V)``.
        temperature: > 0.

    Returns:
        ``(B, A)`` log-probabilities, dtype of ``logits`` (computed in float32 at least).

    Raises:
        InvalidArgumentError: shapes do not match, a label is outside ``[0, V)``, or ``temperature <= 0``.
    """
    check_tensor("logits", logits, 3)
    check_tensor("labels", labels, 2)
    if tuple(labels.shape) != tuple(logits.shape[:2]):
        raise InvalidArgumentError(
            f"labels has shape {tuple(labels.shape)} but logits has shape {tuple(logits.shape)}; "
            "expected labels (B, A) and logits (B, A, V)"
        )
    temp = check_real("temperature", temperature, low=0.0, low_open=True)
    vocab = logits.shape[-1]
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= vocab):
        bad = int(labels.min()) if int(labels.min()) < 0 else int(labels.max())
        raise InvalidArgumentError(f"label {bad} is outside the vocabulary [0, {vocab})")
    z = logits.float() / temp if logits.dtype in (torch.float16, torch.bfloat16) else logits / temp
    picked = z.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    return (picked - torch.logsumexp(z, dim=-1)).to(logits.dtype)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` at each position: ``H = -sum_v p_v log p_v`` (nats).

    Source: verl ``entropy_from_logits``; terms with ``p_v = 0`` (logits of -inf) count as 0.

    Args:
        logits: ``(B, A, V)`` float.

    Returns:
        ``(B, A)`` entropies, ``0 <= H <= log V``.

    Raises:
        InvalidArgumentError: ``logits`` is not 3-D.
    """
    check_tensor("logits", logits, 3)
    logp = torch.log_softmax(logits.float(), dim=-1)
    p = logp.exp()
    plogp = torch.where(p > 0, p * logp, torch.zeros((), dtype=p.dtype, device=p.device))
    return (-plogp.sum(dim=-1)).to(logits.dtype)


def aggregate_loss(
    loss_mat: torch.Tensor,
    action_mask: torch.Tensor,
    mode: str = "token-mean",
    norm_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce per-token losses ``(B, A)`` to a scalar.

    Modes (verl ``agg_loss``; DAPO, Yu et al. 2025, arXiv:2503.14476, argues for ``token-mean``):

    - ``token-mean``: ``sum_{b,t} m l / sum_{b,t} m``; every action token weighs the same.
    - ``seq-mean-token-sum``: ``mean_b sum_t m l``; each sequence's summed loss, averaged over the sequences
      that have at least one action token.
    - ``seq-mean-token-mean``: ``mean_b (sum_t m l / sum_t m)`` over sequences with at least one action token
      (the original GRPO objective).
    - ``seq-mean-token-sum-norm``: ``sum_{b,t} m l / (B * norm_tokens)`` with a constant ``norm_tokens``
      (default ``A``); Dr. GRPO (Liu et al. 2025, arXiv:2503.20783) removes length bias this way.

    Args:
        loss_mat: ``(B, A)`` per-token losses.
        action_mask: ``(B, A)`` bool / 0-1.
        mode: One of the modes above.
        norm_tokens: Constant of ``seq-mean-token-sum-norm``, >= 1; None means ``A``.

    Returns:
        0-dim tensor; exactly 0 (still differentiable) when no token is selected.

    Raises:
        InvalidArgumentError: unknown mode, mismatched shapes, or ``norm_tokens < 1``.
    """
    if mode not in LOSS_AGG_MODES:
        raise InvalidArgumentError(f"loss_agg_mode must be one of {list(LOSS_AGG_MODES)}, got {mode!r}")
    mask = _mask_for("loss_mat", loss_mat, action_mask)
    if mode == "token-mean":
        return masked_mean(loss_mat, mask)
    if mode == "seq-mean-token-sum-norm":
        if norm_tokens is not None and (
            isinstance(norm_tokens, bool) or not isinstance(norm_tokens, int) or norm_tokens < 1
        ):
            raise InvalidArgumentError(f"norm_tokens must be an int >= 1 or None, got {norm_tokens!r}")
        denom = loss_mat.shape[0] * (norm_tokens if norm_tokens is not None else loss_mat.shape[1])
        return masked_sum(loss_mat, mask) / max(denom, 1)
    seq = (
        masked_sum(loss_mat, mask, dim=1)
        if mode == "seq-mean-token-sum"
        else masked_mean(loss_mat, mask, dim=1)
    )
    return masked_mean(seq, mask.any(dim=1))


def policy_loss(
    cfg: AlgorithmConfig,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss with an asymmetric clip range and optional dual clip.

    ``r = exp(logprobs - old_logprobs)`` (log-ratio clamped to ``+-cfg.log_ratio_clamp``),
    ``l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))`` (PPO, Schulman et al. 2017, arXiv:1707.06347, eq. 7;
    asymmetric "clip-higher" from DAPO, arXiv:2503.14476); with ``cfg.dual_clip = c``, tokens with ``A < 0`` use
    ``min(l, -c A)`` (dual-clip PPO, Ye et al. 2020, arXiv:1912.09729). Reduced with ``cfg.loss_agg_mode``.

    Args:
        cfg: Algorithm config (clip ranges, dual clip, aggregation).
        logprobs: ``(B, A)`` log-probabilities of the sampled tokens under the current policy (with grad).
        old_logprobs: ``(B, A)`` the same under the policy that generated the rollouts.
        advantages: ``(B, A)`` from :func:`~services.trainer.learn.algo.advantages.compute_advantages`.
        action_mask: ``(B, A)`` bool / 0-1.
        weights: ``(B, A)`` per-token importance weights multiplied into each token's clipped loss before
            aggregation (truncated importance sampling; detached); None = 1.

    Returns:
        ``(loss, stats)``: the scalar loss and detached stats ``pg_loss``, ``clip_frac`` (fraction of action
        tokens whose clipped term was active), ``dual_clip_frac``, ``approx_kl`` (``mean(old - new)`` over
        action tokens, verl ``ppo_kl``), ``ratio_mean``, ``ratio_max``.

    Raises:
        InvalidArgumentError: mismatched shapes or a mask holding values other than 0/1.
    """
    mask = _mask_for("logprobs", logprobs, action_mask)
    check_same_shape("old_logprobs", old_logprobs, "logprobs", logprobs)
    check_same_shape("advantages", advantages, "logprobs", logprobs)
    if weights is not None:
        check_same_shape("weights", weights, "logprobs", logprobs)
    log_ratio = _zero_masked(logprobs - old_logprobs.detach(), mask).clamp(
        -cfg.log_ratio_clamp, cfg.log_ratio_clamp
    )
    adv = _zero_masked(advantages.detach().to(logprobs.dtype), mask)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
    loss_mat = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(mask)
    if cfg.dual_clip is not None:
        bound = -adv * cfg.dual_clip
        dual_active = (adv < 0) & (loss_mat > bound) & mask
        loss_mat = torch.where(adv < 0, torch.minimum(loss_mat, bound), loss_mat)
    if weights is not None:
        loss_mat = loss_mat * weights.detach().to(loss_mat.dtype)
    loss = aggregate_loss(loss_mat, mask, cfg.loss_agg_mode, cfg.loss_norm_tokens)
    with torch.no_grad():
        stats = {
            "pg_loss": loss.detach(),
            "clip_frac": masked_mean((clipped > unclipped).to(logprobs.dtype), mask),
            "dual_clip_frac": masked_mean(dual_active.to(logprobs.dtype), mask),
            "approx_kl": masked_mean(-log_ratio.detach(), mask),
            "ratio_mean": masked_mean(ratio.detach(), mask),
            "ratio_max": _zero_masked(ratio.detach(), mask).max() if ratio.numel() else ratio.new_zeros(()),
        }
    return loss, stats


def value_loss(
    cfg: AlgorithmConfig,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    action_mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss: ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)``.

    Source: OpenAI baselines ppo2, OpenRLHF ``ValueLoss``, verl ``compute_value_loss`` (``c = cfg.value_clip``;
    with None the plain ``0.5 * (V - R)^2``). Reduced with ``cfg.loss_agg_mode``.

    Args:
        cfg: Algorithm config.
        values: ``(B, A)`` current critic values (with grad).
        old_values: ``(B, A)`` critic values at rollout time.
        returns: ``(B, A)`` targets from :func:`~services.trainer.learn.algo.advantages.compute_advantages`.
        action_mask: ``(B, A)`` bool / 0-1.

    Returns:
        ``(loss, stats)`` with detached ``vf_loss``, ``vf_clip_frac`` (fraction of tokens where the clipped
        error was the larger one) and ``value_mean``.

    Raises:
        InvalidArgumentError: mismatched shapes or a mask holding values other than 0/1.
    """
    mask = _mask_for("values", values, action_mask)
    check_same_shape("old_values", old_values, "values", values)
    check_same_shape("returns", returns, "values", values)
    v = _zero_masked(values, mask)
    v_old = _zero_masked(old_values.detach().to(values.dtype), mask)
    ret = _zero_masked(returns.detach().to(values.dtype), mask)
    err = (v - ret).square()
    if cfg.value_clip is None:
        loss_mat, clip_active = 0.5 * err, torch.zeros_like(mask)
    else:
        v_clipped = v_old + torch.clamp(v - v_old, -cfg.value_clip, cfg.value_clip)
        err_clipped = (v_clipped - ret).square()
        loss_mat = 0.5 * torch.maximum(err, err_clipped)
        clip_active = (err_clipped > err) & mask
    loss = aggregate_loss(loss_mat, mask, cfg.loss_agg_mode, cfg.loss_norm_tokens)
    stats = {
        "vf_loss": loss.detach(),
        "vf_clip_frac": masked_mean(clip_active.to(values.dtype), mask),
        "value_mean": masked_mean(v.detach(), mask),
    }
    return loss, stats


def kl_loss(
    cfg: AlgorithmConfig, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, action_mask: torch.Tensor
) -> torch.Tensor:
    """KL to the reference policy as a loss term: ``agg(k(logprobs, ref_logprobs))`` (unweighted).

    Source: GRPO (Shao et al. 2024, eq. 3-4) with ``k3``; verl ``use_kl_loss``. Gradients flow through
    ``logprobs`` only.

    Args:
        cfg: Algorithm config (``kl_estimator``, ``loss_agg_mode``, ``log_ratio_clamp``).
        logprobs: ``(B, A)`` current policy log-probabilities (with grad).
        ref_logprobs: ``(B, A)`` reference policy log-probabilities.
        action_mask: ``(B, A)`` bool / 0-1.

    Returns:
        0-dim tensor (nats), before multiplying by ``cfg.kl_coef``.
    """
    mask = _mask_for("logprobs", logprobs, action_mask)
    kl = kl_penalty(logprobs, ref_logprobs.detach(), cfg.kl_estimator, mask, cfg.log_ratio_clamp)
    return aggregate_loss(kl, mask, cfg.loss_agg_mode, cfg.loss_norm_tokens)


def actor_loss(
    cfg: AlgorithmConfig,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The full actor objective: ``pg_loss + kl_coef * kl_loss - entropy_coef * agg(entropy)``.

    The KL term is added only when ``cfg.use_kl_loss`` and ``cfg.kl_coef > 0``; the entropy bonus only when
    ``cfg.entropy_coef > 0``.

    Args:
        cfg: Algorithm config.
        logprobs, old_logprobs, advantages, action_mask: as :func:`policy_loss`.
        ref_logprobs: ``(B, A)`` reference log-probabilities; required when the KL is a loss term.
        entropy: ``(B, A)`` per-token entropy (:func:`entropy_from_logits`); required when ``entropy_coef > 0``.
        weights: ``(B, A)`` importance weights of the policy-gradient term (see :func:`policy_loss`).

    Returns:
        ``(loss, stats)``: stats of :func:`policy_loss` plus ``kl_loss`` and ``entropy`` when computed, and
        ``actor_loss``.

    Raises:
        InvalidArgumentError: a required tensor is missing, or shapes do not match.
    """
    loss, stats = policy_loss(cfg, logprobs, old_logprobs, advantages, action_mask, weights)
    mask = as_bool_mask("action_mask", action_mask)
    if cfg.use_kl_loss and cfg.kl_coef > 0:
        if ref_logprobs is None:
            raise InvalidArgumentError(
                "use_kl_loss is True and kl_coef > 0, so ref_logprobs (B, A) is required"
            )
        kl = kl_loss(cfg, logprobs, ref_logprobs, mask)
        loss = loss + cfg.kl_coef * kl
        stats["kl_loss"] = kl.detach()
    if entropy is not None:
        check_same_shape("entropy", entropy, "logprobs", logprobs)
        ent = aggregate_loss(entropy, mask, cfg.loss_agg_mode, cfg.loss_norm_tokens)
        stats["entropy"] = ent.detach()
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * ent
    elif cfg.entropy_coef > 0:
        raise InvalidArgumentError("entropy_coef > 0, so entropy (B, A) is required")
    stats["actor_loss"] = loss.detach()
    return loss, stats
