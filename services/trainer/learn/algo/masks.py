"""Masked reductions and multi-turn action masks.

Dimension names used throughout ``services.trainer.learn.algo`` (declared once, here):

- ``B``: batch, the number of sequences (one agent's trajectories) in a batch;
- ``T``: tokens of a whole sequence (prompt, observations, every agent's turns);
- ``A``: the response (action) region of a sequence: the tokens after the first prompt, padded to one length;
- ``G``: group size, the number of samples drawn for one prompt (GRPO, RLOO);
- ``N``: number of agents in a team;
- ``V``: vocabulary size.

A mask is a bool tensor (or a 0/1 tensor) whose True entries are the tokens that count. In a multi-turn,
multi-agent trajectory only the tokens that *this* agent generated are True: prompt, observation, environment
and other agents' tokens are False, so they are never trained on and never enter an average.

Every reduction here uses ``torch.where`` rather than multiplying by the mask, so a NaN or -inf at a masked
position (for example the log-probability of a padding token) never leaks into the result, and an empty mask
gives a finite 0 instead of 0/0. The formulas follow verl ``verl/utils/torch_functional.py`` (masked_mean,
masked_var, masked_whiten) and TRL ``trl/core.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from marti.errors import InvalidArgumentError

from ._checks import as_bool_mask, check_same_shape, check_tensor

WHITEN_EPS = 1e-8
"""Default variance floor of :func:`masked_whiten` (verl and TRL use 1e-8)."""


def _mask_like(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise InvalidArgumentError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    check_same_shape("mask", mask, "values", values)
    return as_bool_mask("mask", mask)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is True.

    Args:
        values: Any shape, floating point.
        mask: Same shape as ``values``; bool or 0/1.
        dim: Dimension to reduce, or None for all.

    Returns:
        The sum; masked-out entries (even NaN or inf ones) contribute exactly 0.

    Raises:
        InvalidArgumentError: shapes differ or the mask holds values other than 0/1.
    """
    m = _mask_like(values, mask)
    kept = torch.where(m, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the True entries of ``mask``: ``sum(x * m) / sum(m)``.

    Args:
        values: Any shape, floating point.
        mask: Same shape as ``values``; bool or 0/1.
        dim: Dimension to reduce, or None for all.

    Returns:
        The mean; where no entry is selected the result is 0 (finite, and still attached to the graph).

    Raises:
        InvalidArgumentError: shapes differ or the mask holds values other than 0/1.
    """
    m = _mask_like(values, mask)
    total = masked_sum(values, m, dim)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return total / count.clamp(min=1).to(values.dtype)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the selected entries of ``values`` (over all dimensions).

    ``var = sum(m * (x - mean)^2) / (n - 1)`` when ``unbiased`` (Bessel's correction, as verl and TRL), else
    divided by ``n``. With ``n <= 1`` selected entries (or ``n == 0``) the variance is defined as 0.

    Args:
        values: Any shape, floating point.
        mask: Same shape as ``values``; bool or 0/1.
        unbiased: Use ``n - 1`` instead of ``n`` in the denominator.

    Returns:
        A 0-dim tensor, always finite for finite selected values.

    Raises:
        InvalidArgumentError: shapes differ or the mask holds values other than 0/1.
    """
    m = _mask_like(values, mask)
    mean = masked_mean(values, m)
    sq = masked_sum((values - mean) ** 2, m)
    n = m.sum().to(values.dtype)
    denom = n - 1 if unbiased else n
    return torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq))


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = WHITEN_EPS
) -> torch.Tensor:
    """Normalise the selected entries to zero mean and unit variance: ``(x - mean) / sqrt(var + eps)``.

    Source: verl ``masked_whiten``, TRL ``whiten``; mean and unbiased variance over the selected entries of the
    whole tensor (global batch normalisation, as REINFORCE++ uses). Masked-out entries of the result are 0.

    Args:
        values: Any shape, floating point.
        mask: Same shape as ``values``; bool or 0/1.
        shift_mean: Subtract the mean (True); if False, the mean is added back after scaling.
        eps: Variance floor; keeps the result finite when all selected values are equal (the result is then 0).

    Returns:
        Tensor of the shape of ``values``; 0 at masked-out positions and everywhere if nothing is selected.

    Raises:
        InvalidArgumentError: shapes differ, the mask holds values other than 0/1, or ``eps <= 0``.
    """
    if not eps > 0:
        raise InvalidArgumentError(f"eps must be > 0, got {eps!r}")
    m = _mask_like(values, mask)
    mean = masked_mean(values, m)
    var = masked_var(values, m)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(m, whitened, torch.zeros((), dtype=values.dtype, device=values.device))


def action_mask_from_owners(
    token_owner: torch.Tensor, agent: int, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Mask of the tokens one agent generated in a multi-turn, multi-agent sequence.

    Args:
        token_owner: ``(B, T)`` or ``(B, A)`` integer tensor: for each token, the index (0..N-1) of the agent
            that generated it, or a negative number for tokens no agent generated (prompt, observations,
            environment text, padding).
        agent: Index of the agent whose tokens are trained, ``>= 0``.
        attention_mask: Optional tensor of the same shape; positions where it is 0 (padding) are excluded.

    Returns:
        Bool tensor of the shape of ``token_owner``: True exactly where ``agent`` generated the token.

    Raises:
        InvalidArgumentError: ``token_owner`` is not a 2-D integer tensor, ``agent`` is negative or not an int,
            or ``attention_mask`` has another shape.
    """
    check_tensor("token_owner", token_owner, 2)
    if token_owner.dtype.is_floating_point or token_owner.dtype == torch.bool:
        raise InvalidArgumentError(f"token_owner must be an integer tensor, got dtype {token_owner.dtype}")
    if isinstance(agent, bool) or not isinstance(agent, int) or agent < 0:
        raise InvalidArgumentError(f"agent must be an int >= 0, got {agent!r}")
    mask = token_owner == agent
    if attention_mask is not None:
        check_same_shape("attention_mask", attention_mask, "token_owner", token_owner)
        mask = mask & as_bool_mask("attention_mask", attention_mask)
    return mask


def action_mask_from_spans(spans: Sequence[Sequence[tuple[int, int]]], num_tokens: int) -> torch.Tensor:
    """Build a mask from the half-open token spans ``[start, end)`` an agent generated in each sequence.

    A multi-turn rollout records, per sequence, where each of the agent's turns starts and ends inside the
    response region; everything between turns (observations, other agents' messages) stays False.

    Args:
        spans: One list per sequence (``B`` lists) of ``(start, end)`` pairs with ``0 <= start <= end <= A``.
        num_tokens: ``A``, the padded length of the response region.

    Returns:
        ``(B, A)`` bool tensor.

    Raises:
        InvalidArgumentError: ``num_tokens < 0`` or a span is out of range or reversed (the span, its
            sequence index and the limit are named).
    """
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise InvalidArgumentError(f"num_tokens must be an int >= 0, got {num_tokens!r}")
    mask = torch.zeros((len(spans), num_tokens), dtype=torch.bool)
    for b, seq_spans in enumerate(spans):
        for span in seq_spans:
            if len(span) != 2:
                raise InvalidArgumentError(f"span {span!r} of sequence {b} must be a (start, end) pair")
            start, end = span
            if not (0 <= start <= end <= num_tokens):
                raise InvalidArgumentError(
                    f"span {tuple(span)!r} of sequence {b} must satisfy 0 <= start <= end <= {num_tokens}"
                )
            mask[b, start:end] = True
    return mask


def last_action_index(action_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last True token of each row (where an outcome reward is placed).

    Args:
        action_mask: ``(B, A)`` bool or 0/1.

    Returns:
        ``(B,)`` int64: the last True position, or -1 for a row with no True entry.

    Raises:
        InvalidArgumentError: ``action_mask`` is not 2-D or holds values other than 0/1.
    """
    m = as_bool_mask("action_mask", check_tensor("action_mask", action_mask, 2))
    positions = torch.arange(m.shape[1], device=m.device).expand_as(m)
    return (
        torch.where(m, positions, torch.full_like(positions, -1)).amax(dim=1)
        if m.shape[1]
        else torch.full((m.shape[0],), -1, dtype=torch.long, device=m.device)
    )
