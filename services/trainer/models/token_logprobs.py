"""Token log-probabilities and entropies from (B, A, V) logits, computed a few rows at a time.

The plain formula (``z = logits.float()``, ``logp = z[y] - logsumexp(z)``, ``H = logsumexp(z) - sum_v p_v z_v``)
makes several (B, A, V) float32 tensors and keeps them for the backward; at V = 49152 each is 19 MB for 8 rows of
12 tokens, fresh memory that page-faults on every update. :func:`token_logprobs` runs the same arithmetic on chunks of
about :data:`CHUNK_ELEMENTS` logits that stay in cache (on the CPU; one chunk on other devices), keeps only the logits
and two (B, A) vectors for the backward, and writes the logits' gradient chunk by chunk:

- ``d logp_y / d z_v = onehot_y(v) - p_v``
- ``d H / d z_v = -p_v (log p_v + H)`` (``H = -sum_v p_v log p_v``)

so ``grad_z = g * onehot_y - p * (g + h * (log p + H))`` for upstream gradients ``g`` (of logp) and ``h`` (of H).
The entropy's term is computed only when the entropy reaches the loss (its upstream gradient is not None), so an
entropy taken as a statistic costs no backward. Values and gradients equal the plain formula's up to float rounding.

Shapes: B rows, A response (action) tokens, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from marti.errors import InvalidArgumentError

CHUNK_ELEMENTS = 1 << 18
"""Logits per chunk on the CPU (1 MiB of float32): a few rows of a 50k vocabulary, within one core's L2 cache."""


def token_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, *, entropy: bool = False, chunk_rows: int | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``log softmax(logits)[labels]`` per position, and the entropy of each distribution, in float32.

    Args:
        logits: (B, A, V) float logits (any float dtype; computed in float32), the last dim contiguous or not.
        labels: (B, A) int64 token ids in [0, V).
        entropy: Also return the entropies.
        chunk_rows: Positions per chunk; None: :func:`default_chunk_rows`.

    Returns:
        (B, A) float32 log-probabilities, or ``(logp, entropy)``; both carry grad to ``logits`` when it requires
        grad (the entropy's backward runs only when it is used).

    Raises:
        InvalidArgumentError: ``logits`` is not 3-D floating point, ``labels`` is not its (B, A), or
            ``chunk_rows`` < 1.
    """
    if logits.dim() != 3 or not logits.is_floating_point():
        raise InvalidArgumentError(
            f"logits must be (B, A, V) floating point, got {tuple(logits.shape)} {logits.dtype}"
        )
    if tuple(labels.shape) != tuple(logits.shape[:2]):
        raise InvalidArgumentError(
            f"labels must be (B, A) = {tuple(logits.shape[:2])}, got {tuple(labels.shape)}"
        )
    rows = chunk_rows if chunk_rows is not None else default_chunk_rows(logits.device, *logits.shape)
    if rows < 1:
        raise InvalidArgumentError(f"chunk_rows must be >= 1, got {chunk_rows}")
    logp, ent = _TokenLogprobs.apply(logits, labels, entropy, rows)
    return (logp, ent) if entropy else logp


def default_chunk_rows(device: torch.device, batch: int, actions: int, vocab: int) -> int:
    """Positions per chunk: on the CPU ``max(1, CHUNK_ELEMENTS // V)`` (cache-sized chunks); on other devices all
    ``B * A`` positions in one chunk (a loop of small kernels would cost launches there)."""
    if device.type == "cpu":
        return max(1, CHUNK_ELEMENTS // vocab)
    return max(1, batch * actions)


def chunks(batch: int, actions: int, rows: int) -> Iterator[tuple[slice, slice]]:
    """(row slice, position slice) pairs covering (B, A) once, in order, with at most ``rows`` positions each: whole
    rows (``rows // A`` of them) when ``rows >= A``, else slices of one row's positions; none when B or A is 0."""
    if batch == 0 or actions == 0:
        return
    if rows >= actions:
        per = rows // actions
        for b in range(0, batch, per):
            yield slice(b, min(b + per, batch)), slice(0, actions)
        return
    for b in range(batch):
        for start in range(0, actions, rows):
            yield slice(b, b + 1), slice(start, min(start + rows, actions))


class _TokenLogprobs(torch.autograd.Function):
    """Forward: (logp, entropy or None); backward: the logits' gradient (module docstring)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor, entropy: bool, rows: int) -> Any:
        batch, actions, _ = logits.shape
        labels = labels.to(logits.device)
        lse = torch.empty(batch, actions, dtype=torch.float32, device=logits.device)
        logp = torch.empty_like(lse)
        ent = torch.empty_like(lse) if entropy else None
        for b, cols in chunks(batch, actions, rows):
            z = logits[b, cols].float()  # (rows, positions, V)
            chunk_lse = torch.logsumexp(z, dim=-1)
            lse[b, cols] = chunk_lse
            logp[b, cols] = z.gather(-1, labels[b, cols].unsqueeze(-1)).squeeze(-1) - chunk_lse
            if ent is not None:
                probs = torch.softmax(z, dim=-1)
                ent[b, cols] = chunk_lse - (probs * z).sum(-1)  # H = logsumexp(z) - sum_v p_v z_v
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(logits, labels, lse, ent)
        ctx.rows = rows
        return logp, ent

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_logp: torch.Tensor | None, grad_ent: torch.Tensor | None) -> Any:
        logits, labels, lse, ent = ctx.saved_tensors
        if grad_logp is None and grad_ent is None:
            return None, None, None, None
        batch, actions, _ = logits.shape
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for b, cols in chunks(batch, actions, ctx.rows):
            log_p = logits[b, cols].float() - lse[b, cols].unsqueeze(-1)  # (rows, positions, V)
            probs = log_p.exp()
            if grad_ent is not None:  # p * (g + h * (log p + H))
                coef = log_p.add_(ent[b, cols].unsqueeze(-1)).mul_(grad_ent[b, cols].unsqueeze(-1))
                if grad_logp is not None:
                    coef.add_(grad_logp[b, cols].unsqueeze(-1))
                chunk = coef.mul_(probs).neg_()
            else:
                chunk = probs.mul_(grad_logp[b, cols].unsqueeze(-1).neg())
            if grad_logp is not None:
                chunk.scatter_add_(-1, labels[b, cols].unsqueeze(-1), grad_logp[b, cols].unsqueeze(-1))
            grad[b, cols] = chunk
        return grad, None, None, None
