"""The LM head gets its input in row-major strides (services/trainer/models/dense_head.py): transformers slice the
hidden states for ``logits_to_keep``, and PyTorch's CPU bf16 ``linear`` over that strided view copies the whole
transposed head weight once per batch row. The logits must not change; the head must see a dense input."""

from __future__ import annotations

import copy

import pytest
import torch

from services.trainer.models.dense_head import _row_major_strides, dense_head_input
from services.trainer.models.loading import load_model, load_tokenizer


@pytest.fixture(scope="module")
def tiny():
    tok = load_tokenizer("tiny-llama")
    return load_model("tiny-llama", tokenizer=tok, seed=0), tok


def _strides_seen(model: torch.nn.Module) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Record (shape, strides) of every input the head gets, after the hooks registered before this one."""
    seen = []
    model.get_output_embeddings().register_forward_pre_hook(
        lambda m, args: seen.append((tuple(args[0].shape), args[0].stride()))
    )
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_loaded_models_give_the_head_a_dense_input_and_the_same_logits(tiny, dtype):
    # a sampling copy, as rollout.dtype makes one: the hook goes along
    model = copy.deepcopy(tiny[0]).to(dtype)
    seen = _strides_seen(model)
    ids = torch.randint(5, 200, (3, 9))
    with torch.no_grad():
        last = model(input_ids=ids, logits_to_keep=1).logits
        full = model(input_ids=ids).logits
    assert seen[0] == ((3, 1, 64), (64, 64, 1))  # hidden[:, -1:, :] arrives as its own dense rows
    assert all(strides == _row_major_strides(torch.Size(shape)) for shape, strides in seen)
    # float32 products of 3 and of 27 rows may round differently (seen on an AMD EPYC: 2.4e-7); bf16 ones are equal
    exact = dtype == torch.bfloat16
    torch.testing.assert_close(last[:, -1], full[:, -1], rtol=0 if exact else 1e-5, atol=0 if exact else 1e-5)


def test_generate_gives_the_same_tokens_with_and_without_the_hook(tiny):
    model, tok = tiny
    plain = copy.deepcopy(model).to(torch.bfloat16)
    plain.get_output_embeddings()._forward_pre_hooks.clear()
    hooked = copy.deepcopy(model).to(torch.bfloat16)
    ids = torch.randint(5, 200, (4, 7))
    with torch.no_grad():
        a = plain.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
        b = hooked.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=tok.pad_token_id)
    assert torch.equal(a, b)


def test_the_hook_is_registered_once_and_only_on_a_model_with_a_head(tiny):
    model = copy.deepcopy(tiny[0])
    before = len(model.get_output_embeddings()._forward_pre_hooks)
    assert dense_head_input(model) and dense_head_input(model)
    assert len(model.get_output_embeddings()._forward_pre_hooks) == before == 1
    assert not dense_head_input(torch.nn.Linear(4, 4))


def test_a_two_dimensional_or_dense_input_is_passed_as_it_is():
    head = torch.nn.Linear(8, 16)
    dense_head_input_on(head)
    seen = []
    head.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    flat, dense = torch.randn(4, 8), torch.randn(2, 3, 8)
    head(flat)
    head(dense)
    assert seen[0] is flat and seen[1] is dense


def dense_head_input_on(head: torch.nn.Module) -> None:
    """Register the hook on a bare module (a model whose output embedding is ``head``)."""

    class _Model(torch.nn.Module):
        def get_output_embeddings(self):
            return head

    assert dense_head_input(_Model())


@pytest.mark.parametrize("shape", [(1,), (3, 1), (2, 1, 5), (1, 1, 576), (4, 0, 2)])
def test_row_major_strides_are_what_clone_gives(shape):
    x = torch.empty(shape)
    assert _row_major_strides(x.shape) == x.clone(memory_format=torch.contiguous_format).stride()


@pytest.mark.parametrize("merge_adapters", [1, 0])
def test_the_engines_bf16_sampling_copies_keep_the_hook(tiny, merge_adapters):
    """The copies a transformers engine samples with (merged: a deep copy unloaded from peft; unmerged: a deep
    copy of the peft model) are made from loaded models, so their heads keep the dense input."""
    from services.trainer.models.dense_head import _dense
    from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout
    from services.trainer.rollout import HFRolloutEngine

    policy = MultiAgentPolicy(PolicyLayout(mode="lora", agents=(AgentSpec("a0", "tiny-llama"),)))
    engine = HFRolloutEngine.from_policy(
        policy, copy_weights=False, dtype=torch.bfloat16, merge_adapters=merge_adapters
    )
    copy_ = engine._agents["a0"].model
    assert next(copy_.parameters()).dtype == torch.bfloat16 and copy_ is not policy.model("a0")
    assert (engine._agents["a0"].adapter_name is None) == bool(merge_adapters)
    hooks = copy_.get_output_embeddings()._forward_pre_hooks.values()
    assert any(hook is _dense for hook in hooks)
