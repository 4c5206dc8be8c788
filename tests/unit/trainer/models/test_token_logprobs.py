"""Chunked token log-probabilities: values and gradients of the plain formula, the entropy's backward only when used."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from marti.errors import InvalidArgumentError
from services.trainer.models.token_logprobs import CHUNK_ELEMENTS, chunks, default_chunk_rows, token_logprobs


def _plain(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The formula token_logprobs replaces (the former body of policy._sequence_logprobs)."""
    z = logits.float()
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return logp, entropy


def _run(fn, base: torch.Tensor, labels: torch.Tensor, g: torch.Tensor, h: torch.Tensor | None):
    """Values and the gradient of ``sum(g * logp) + sum(h * H)`` w.r.t. the logits (a non-contiguous slice)."""
    x = base.clone().requires_grad_(True)
    logp, ent = fn(x[:, :-1], labels)  # (B, A+1, V)[:, :-1], as response_logits returns it
    loss = (g * logp).sum() + (0 if h is None else (h * ent).sum())
    loss.backward()
    return logp.detach(), ent.detach(), x.grad.float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_entropy_grad", [False, True])
@pytest.mark.parametrize("chunk_rows", [1, 3, 7, 15, 100, None])
def test_values_and_gradients_equal_the_plain_formula(dtype, with_entropy_grad, chunk_rows):
    gen = torch.Generator().manual_seed(0)
    base = (torch.randn(3, 8, 1000, generator=gen) * 4).to(dtype)
    labels = torch.randint(0, 1000, (3, 7), generator=gen)
    g = torch.randn(3, 7, generator=gen)
    h = torch.randn(3, 7, generator=gen) if with_entropy_grad else None
    want = _run(_plain, base, labels, g, h)
    got = _run(lambda x, y: token_logprobs(x, y, entropy=True, chunk_rows=chunk_rows), base, labels, g, h)
    for w, o in zip(want, got, strict=True):
        assert o.dtype == w.dtype
        assert torch.allclose(o, w, atol=1e-5, rtol=1e-5), (o - w).abs().max()
    assert got[2].abs().sum() > 0


def test_entropy_alone_gets_its_gradient():
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(2, 5, 300, generator=gen)
    labels = torch.randint(0, 300, (2, 4), generator=gen)
    grads = []
    for fn in (_plain, lambda x, y: token_logprobs(x, y, entropy=True, chunk_rows=2)):
        x = base.clone().requires_grad_(True)
        fn(x[:, :-1], labels)[1].sum().backward()
        grads.append(x.grad)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_logprobs_alone_without_entropy():
    base = torch.randn(2, 4, 50)
    labels = torch.randint(0, 50, (2, 4))
    logp = token_logprobs(base, labels)
    assert isinstance(logp, torch.Tensor)
    assert torch.allclose(logp, _plain(base, labels)[0], atol=1e-6)
    with torch.no_grad():
        assert not token_logprobs(base.requires_grad_(True), labels).requires_grad


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("entropy_in_loss", [False, True])
def test_entropy_term_of_the_backward_runs_only_when_the_entropy_is_used(entropy_in_loss):
    x = torch.randn(2, 3, 64, requires_grad=True)
    logp, ent = token_logprobs(x, torch.randint(0, 64, (2, 3)), entropy=True, chunk_rows=2)
    loss = logp.sum() + (ent.sum() if entropy_in_loss else 0)
    with _CountOps() as ops:
        loss.backward()
    adds = [n for n in ops.names if n.startswith("aten.add_")]  # the entropy term's (log p + H) and (g + ...)
    assert bool(adds) == entropy_in_loss, ops.names


def test_bad_input_is_rejected():
    with pytest.raises(InvalidArgumentError, match="must be \\(B, A, V\\)"):
        token_logprobs(torch.randn(4, 10), torch.zeros(4, dtype=torch.long))
    with pytest.raises(InvalidArgumentError, match="labels must be"):
        token_logprobs(torch.randn(2, 3, 10), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(InvalidArgumentError, match="chunk_rows must be >= 1, got 0"):
        token_logprobs(torch.randn(2, 3, 10), torch.zeros(2, 3, dtype=torch.long), chunk_rows=0)


@pytest.mark.parametrize(
    ("batch", "actions", "rows"), [(3, 7, 1), (3, 7, 3), (3, 7, 7), (3, 7, 15), (4, 2, 5), (2, 3, 99)]
)
def test_chunks_cover_every_position_once_in_order(batch, actions, rows):
    seen = []
    for b, cols in chunks(batch, actions, rows):
        assert (b.stop - b.start) * (cols.stop - cols.start) <= rows
        seen += [(i, j) for i in range(b.start, b.stop) for j in range(cols.start, cols.stop)]
    assert seen == [(i, j) for i in range(batch) for j in range(actions)]


def test_default_chunks_are_cache_sized_on_the_cpu_and_whole_elsewhere():
    assert default_chunk_rows(torch.device("cpu"), 8, 12, 49152) == CHUNK_ELEMENTS // 49152 == 5
    assert default_chunk_rows(torch.device("cpu"), 8, 12, 10 * CHUNK_ELEMENTS) == 1
    assert default_chunk_rows(torch.device("cuda"), 8, 12, 49152) == 96


@pytest.mark.parametrize("shape", [(2, 0, 5), (0, 3, 5)])
def test_no_positions_give_empty_results_with_a_gradient(shape):
    """(B, 0, V) and (0, A, V) logits: empty (B, A) results, as the plain formula gives (no division by A)."""
    logits = torch.zeros(shape, requires_grad=True)
    logp, ent = token_logprobs(logits, torch.zeros(shape[:2], dtype=torch.long), entropy=True)
    assert logp.shape == ent.shape == shape[:2]
    (logp.sum() + ent.sum()).backward()
    assert logits.grad is not None and logits.grad.shape == shape
    assert list(chunks(shape[0], shape[1], 4)) == []
