"""SDPA kernel of CPU training forwards: math up to MATH_ATTENTION_MAX_TOKENS columns with grad, flash otherwise."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from marti.errors import InvalidArgumentError
from services.trainer.models import training_attention as ta
from services.trainer.models.loading import build_tiny_model, load_tokenizer
from services.trainer.models.policy import _sequence_logprobs

KERNELS = {
    "flash": "aten::_scaled_dot_product_flash_attention_for_cpu",
    "math": "aten::_scaled_dot_product_attention_math",
}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


@pytest.fixture(scope="module")
def model(tok):
    return build_tiny_model(tok, seed=0)


def _batch(num_tokens: int, num_actions: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(num_tokens)
    ids = torch.randint(5, 200, (2, num_tokens), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding: SDPA gets a mask, as in training
    return ids, mask, torch.ones(2, num_actions, dtype=torch.bool)


def _kernels(model, num_tokens: int, grad: bool) -> set[str]:
    """SDPA kernels a forward (and backward) of ``num_tokens`` columns ran."""
    ids, mask, action = _batch(num_tokens)
    with profile(activities=[ProfilerActivity.CPU]) as prof, torch.set_grad_enabled(grad):
        logp = _sequence_logprobs(model, ids, mask, action, False)
        if grad:
            logp.sum().backward()
    names = {e.key for e in prof.key_averages()}
    return {kernel for kernel, op in KERNELS.items() if op in names}


def test_math_kernel_up_to_the_limit_flash_above_and_without_grad(model):
    limit = ta.MATH_ATTENTION_MAX_TOKENS
    assert _kernels(model, limit, grad=True) == {"math"}
    assert _kernels(model, limit + 1, grad=True) == {"flash"}
    assert _kernels(model, 16, grad=False) == {"flash"}


def test_gradient_checkpointing_keeps_the_default_kernel(tok):
    model = build_tiny_model(tok, seed=0)
    model.gradient_checkpointing_enable()
    model.train()
    assert isinstance(ta.training_attention(model, 8), contextlib.nullcontext)
    # its backward reruns the forward outside the context, so the forward must take the kernel the rerun takes
    assert _kernels(model, 16, grad=True) == {"flash"}


def test_checkpointing_is_seen_on_a_model_and_through_a_peft_wrapper_as_transformers_sees_it(tok):
    from peft import LoraConfig, get_peft_model

    model = build_tiny_model(tok, seed=0)
    wrapped = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))
    assert (
        not ta.checkpointed(model) and not ta.checkpointed(wrapped) and not model.is_activation_checkpointing
    )
    model.gradient_checkpointing_enable()
    assert ta.checkpointed(model) and ta.checkpointed(wrapped) and model.is_activation_checkpointing
    model.gradient_checkpointing_disable()
    assert not ta.checkpointed(wrapped) and not model.is_activation_checkpointing


def test_math_and_flash_give_the_same_logprobs_and_gradients(model, monkeypatch):
    ids, mask, action = _batch(40, num_actions=6)
    results = []
    for limit in (ta.MATH_ATTENTION_MAX_TOKENS, 0):  # 0: every forward takes the default (flash) kernel
        monkeypatch.setattr(ta, "MATH_ATTENTION_MAX_TOKENS", limit)
        model.zero_grad()
        logp = _sequence_logprobs(model, ids, mask, action, False)
        logp.sum().backward()
        results.append((logp.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-5)
    for a, b in zip(results[0][1], results[1][1], strict=True):
        assert torch.allclose(a, b, atol=1e-5 * max(1.0, float(b.abs().max())))


def test_bad_token_count_is_rejected(model):
    with pytest.raises(InvalidArgumentError, match="num_tokens must be >= 1, got 0"):
        ta.training_attention(model, 0)


def test_overlapping_forwards_in_two_threads_restore_the_kernels(model):
    """Thread A enters, B enters, A leaves, B leaves: plain sdpa_kernel contexts would leave math-only set (B
    restores what it saw on entry); the shared context restores the setting from before A entered."""
    import threading

    from torch.nn.attention import _cur_sdpa_kernel_backends

    before = set(_cur_sdpa_kernel_backends())
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    inside: list[set] = []

    def thread_a():
        with torch.enable_grad(), ta.training_attention(model, 8):
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def thread_b():
        a_in.wait(5)
        with torch.enable_grad(), ta.training_attention(model, 8):
            b_in.set()
            a_out.wait(5)
            inside.append(set(_cur_sdpa_kernel_backends()))

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    from torch.nn.attention import SDPBackend

    assert inside == [{SDPBackend.MATH}]  # still math while B's forward runs, after A left
    assert set(_cur_sdpa_kernel_backends()) == before
