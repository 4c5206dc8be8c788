"""Shared-prompt computation: same logits, gradients and samples as the plain forward, on tiny models."""

from __future__ import annotations

import pytest
import torch

from services.trainer.models.loading import build_tiny_model, load_tokenizer
from services.trainer.models.policy import AgentSpec, MultiAgentPolicy, PolicyLayout
from services.trainer.models.prefix_sharing import (
    can_share,
    moves_padding,
    prefix_layout,
    prompts_first,
    response_logits,
    shared_prefix_len,
    shared_prefix_rows,
)
from services.trainer.rollout import AgentModel, HFRolloutEngine, SamplingParams
from services.trainer.rollout.engines.static import StaticCacheRolloutEngine
from tests.tiny_models import tiny_lfm2, tiny_mistral, tiny_mpt
from tests.trainer_batches import chain_batch, group_batch


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-llama")


def test_rows_with_equal_prefix_are_found_in_order_of_first_appearance():
    ids = torch.tensor([[9, 1, 2, 7], [3, 4, 5, 8], [9, 1, 2, 6], [3, 4, 5, 5], [0, 4, 5, 5]])
    mask = torch.ones_like(ids)
    mask[4, 0] = 0  # same ids as row 3 from column 1 on, but a padded first column: a different prefix
    first, inverse = shared_prefix_rows(ids, mask, 3)
    assert first.tolist() == [0, 1, 4]
    assert inverse.tolist() == [0, 1, 0, 1, 2]


def test_no_sharing_when_every_prefix_differs_or_the_prefix_is_out_of_range():
    ids = torch.tensor([[1, 2, 3], [1, 2, 4], [2, 2, 3]])
    mask = torch.ones_like(ids)
    assert shared_prefix_rows(ids, mask, 3) is None
    assert shared_prefix_rows(ids, mask, 0) is None
    assert shared_prefix_rows(ids, mask, 4) is None
    assert shared_prefix_rows(ids[:1], mask[:1], 2) is None  # a single row has nobody to share with
    assert shared_prefix_rows(ids, mask, 2) is not None  # rows 0 and 1 agree on 2 columns


@pytest.mark.parametrize("num_actions", [1, 5])
def test_shared_logits_and_gradients_equal_the_plain_forward(tok, num_actions):
    model = build_tiny_model(tok, seed=0)
    batch = group_batch(tok.pad_token_id)
    ids, mask = batch.input_ids, batch.attention_mask
    if num_actions == 1:  # cut every response to its first token
        ids, mask = ids[:, : ids.shape[1] - 4], mask[:, : ids.shape[1] - 4]
    labels = ids[:, -num_actions:]
    results = []
    for share in (False, True):
        model.zero_grad()
        logits = response_logits(model, ids, mask, num_actions, share=share)
        assert logits.shape == (6, num_actions, model.config.vocab_size)
        logp = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        (logp * mask[:, -num_actions:]).sum().backward()
        results.append((logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (plain, g_plain), (shared, g_shared) = results
    valid = mask[:, -num_actions:].bool()
    assert torch.allclose(plain[valid], shared[valid], atol=1e-5)
    for name, grad in g_plain.items():  # float32 sums in another order: equal to ~1e-6 of the largest entry
        scale = float(grad.abs().max()) + 1e-6
        assert float((grad - g_shared[name]).abs().max()) <= 1e-4 * scale, name
    assert any(g.abs().sum() > 0 for g in g_shared.values())


class _CountingModel(torch.nn.Module):
    """A model wrapper that counts the (row, column) tokens each forward is given."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model, self.tokens, self.config = model, 0, model.config

    def forward(self, input_ids: torch.Tensor, **kwargs):
        self.tokens += input_ids.numel()
        return self.model(input_ids=input_ids, **kwargs)


def test_rows_that_start_alike_share_their_head_when_no_prompt_repeats(tok):
    batch = chain_batch(tok.pad_token_id)
    ids, mask, num_actions = batch.input_ids, batch.attention_mask, batch.action_mask.shape[1]
    width = ids.shape[1] - num_actions
    assert shared_prefix_rows(ids, mask, width) is None  # no whole prompt repeats
    layout = prefix_layout(ids, mask, width)
    assert layout is not None and layout.head == 12  # the observation, though a shorter message pads one row
    assert layout.first.tolist() == [0, 3] and layout.inverse.tolist() == [0, 0, 0, 1, 1, 1]
    model = build_tiny_model(tok, seed=0)
    labels = ids[:, -num_actions:]
    results = []
    for share in (False, True):
        counted = _CountingModel(model)
        model.zero_grad()
        logits = response_logits(counted, ids, mask, num_actions, share=share)
        assert logits.shape == (6, num_actions, model.config.vocab_size)
        logp = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        (logp * batch.action_mask).sum().backward()
        results.append(
            (logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, counted.tokens)
        )
    (plain, g_plain, n_plain), (shared, g_shared, n_shared) = results
    assert n_plain == ids.numel() and n_shared == 2 * 12 + 6 * (ids.shape[1] - 1 - 12), (n_plain, n_shared)
    valid = batch.action_mask.bool()
    assert torch.allclose(plain[valid], shared[valid], atol=1e-5)
    for name, grad in g_plain.items():  # float32 sums in another order
        scale = float(grad.abs().max()) + 1e-6
        assert float((grad - g_shared[name]).abs().max()) <= 1e-4 * scale, name
    model.zero_grad()  # a seeded run must not drift: the same bits again
    logits = response_logits(model, ids, mask, num_actions, share=True)
    logp = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    (logp * batch.action_mask).sum().backward()
    assert all(torch.equal(p.grad, g_shared[n]) for n, p in model.named_parameters())


def test_prompt_padding_moves_after_the_prompt_but_its_last_token():
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 8, 9], [0, 2, 3, 0, 5, 8, 0]])
    mask = (ids != 0).long()
    moved, moved_mask = prompts_first(ids, mask, 5)  # prompts of 5 columns, then 2 response columns
    assert moved.tolist() == [[5, 6, 0, 0, 7, 8, 9], [1, 2, 3, 4, 5, 8, 9], [2, 3, 0, 0, 5, 8, 0]]
    assert moved_mask.tolist() == (moved != 0).long().tolist()  # each mask value moves with its column
    unpadded = torch.ones_like(ids)
    assert prompts_first(ids, unpadded, 5)[0] is ids  # nothing to move: the inputs themselves


def test_the_shared_length_is_the_cheapest_of_whole_prompts_and_heads():
    ones = torch.ones(3, 8, dtype=torch.long)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8], [2, 2, 3, 4, 5, 6, 7, 8], [3, 2, 3, 4, 5, 6, 7, 8]])
    assert shared_prefix_len(ids, ones, 6) is None  # the first column differs
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8], [1, 9, 9, 9, 9, 9, 9, 9]])
    assert shared_prefix_len(ids, ones[:2], 6) is None  # one common column of 8: not worth a pass
    assert shared_prefix_len(ids[:1], ones[:1], 6) is None  # nobody to share with
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 9, 9], [5, 2, 3, 4, 5, 6, 9, 9]])
    assert shared_prefix_len(ids, ones, 6) == 6  # a repeated whole prompt, however little it saves
    ids = torch.tensor([[1] * 10 + [2, 8], [1] * 10 + [2, 9], [1] * 10 + [3, 9], [1] * 10 + [4, 9]])
    # prompts of 11 columns: rows 0 and 1 repeat one (3 distinct), all 4 rows share 10 columns (1 distinct)
    assert shared_prefix_len(ids, torch.ones_like(ids), 11) == 10


@pytest.mark.parametrize("mode", ["per_agent", "lora"])
def test_policy_logprobs_and_reference_agree_with_sharing_on_and_off(tok, mode):
    batch = group_batch(tok.pad_token_id)
    out = []
    for share in (False, True):
        policy = MultiAgentPolicy(
            PolicyLayout(mode=mode, agents=(AgentSpec("a", "tiny-llama"),), share_prompt_prefix=share)
        )
        lp, ent = policy.logprobs(
            "a", batch.input_ids, batch.attention_mask, batch.action_mask, return_entropy=True
        )
        ref = policy.ref_logprobs("a", batch.input_ids, batch.attention_mask, batch.action_mask)
        out.append((lp.detach(), ent.detach(), ref))
    m = batch.action_mask
    for plain, shared in zip(out[0], out[1], strict=True):
        assert torch.allclose(plain[m], shared[m], atol=1e-5)


def test_gradient_checkpointing_takes_the_plain_forward(tok):
    policy = MultiAgentPolicy(
        PolicyLayout(mode="per_agent", agents=(AgentSpec("a", "tiny-llama"),), gradient_checkpointing=True)
    )
    policy.train(True)
    batch = group_batch(tok.pad_token_id)
    lp = policy.logprobs("a", batch.input_ids, batch.attention_mask, batch.action_mask)
    lp[batch.action_mask].sum().backward()  # no cache is asked for, so checkpointing works as before
    assert lp.shape == batch.action_mask.shape


_OBSERVATION = list(range(20, 36))
_PROMPT_SETS = {
    "whole_prompts": [[5, 6, 7, 8, 9, 10]] * 3 + [[11, 12]] * 3 + [[13, 14, 15]],
    # a chain's later agent: one observation, then a teammate's message of another length in every row
    "heads": [_OBSERVATION + m for m in ([41, 42, 43], [44], [45, 46], [47, 48, 49, 50], [51, 52])],
}


@pytest.mark.parametrize("prompts", list(_PROMPT_SETS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_samples_the_same_with_and_without_a_shared_prefill(tok, temperature, prompts):
    model = build_tiny_model(tok, seed=0)
    prompts = _PROMPT_SETS[prompts]
    params = SamplingParams(max_new_tokens=6, temperature=temperature, seed=7)
    gens, tokens = {}, {}
    for share in (False, True):
        engine = HFRolloutEngine({"a": AgentModel(model, tok)}, share_prompt_prefix=share)
        tokens[share] = 0

        def count(_module, args, _out, share=share):
            tokens[share] += args[0].numel()

        hook = model.get_input_embeddings().register_forward_hook(count)
        gens[share] = engine.generate("a", prompts, params)
        hook.remove()
    rows, width = len(prompts), max(map(len, prompts))
    if prompts is _PROMPT_SETS["heads"]:  # the observation once, then every row's message: 16 + 5 x (21 - 17)
        assert tokens[False] - tokens[True] == rows * (width - 1) - (16 + rows * (width - 1 - 16))
    else:  # the 3 distinct prompts once (all but their last column)
        assert tokens[False] - tokens[True] == (rows - 3) * (width - 1)
    for plain, shared in zip(gens[False], gens[True], strict=True):
        assert plain.prompt_token_ids == shared.prompt_token_ids
        assert plain.response_token_ids == shared.response_token_ids
        assert torch.allclose(
            torch.tensor(plain.response_logprobs), torch.tensor(shared.response_logprobs), atol=1e-4
        )


def _same_samples_shared_or_not(model, tok, prompts):
    """Greedy samples of both transformers engines with ``share_prompt_prefix`` on equal those with it off."""
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    for engine_class in (HFRolloutEngine, StaticCacheRolloutEngine):
        plain, shared = (
            engine_class({"a": AgentModel(model, tok)}, share_prompt_prefix=share).generate(
                "a", prompts, params
            )
            for share in (False, True)
        )
        for a, b in zip(plain, shared, strict=True):
            assert a.response_token_ids == b.response_token_ids, engine_class.__name__
            assert torch.allclose(
                torch.tensor(a.response_logprobs), torch.tensor(b.response_logprobs), atol=1e-4
            )


@pytest.mark.parametrize("build", ["sliding_window", "alibi"])
def test_a_model_that_counts_columns_shares_prompts_where_they_are(tok, build):
    """A sliding window (Mistral's) and an ALiBi bias (MPT's) count columns, not positions: a prompt's padding
    moved between its tokens would push its first tokens out of the window of the last ones, or farther from them,
    so such a model's rows keep their columns."""
    model = tiny_mistral(len(tok), sliding_window=6) if build == "sliding_window" else tiny_mpt(len(tok))
    assert can_share(model) and not moves_padding(model)
    batch = chain_batch(tok.pad_token_id)  # one row's shorter message pads it
    ids, mask, num_actions = batch.input_ids, batch.attention_mask, batch.action_mask.shape[1]
    with torch.no_grad():
        plain, shared = (
            response_logits(model, ids, mask, num_actions, share=share) for share in (False, True)
        )
    valid = batch.action_mask.bool()
    assert torch.allclose(plain[valid], shared[valid], atol=1e-5)
    _same_samples_shared_or_not(model, tok, _PROMPT_SETS["heads"])


def test_a_model_with_layers_other_than_attention_does_not_share(tok):
    """A convolution's (or a recurrence's) cache state is not gathered to rows, and reads padding in order: such
    a model takes the plain forward and the plain prefill."""
    model = tiny_lfm2(len(tok))
    assert not can_share(model)
    batch = group_batch(tok.pad_token_id)
    ids, mask, num_actions = batch.input_ids, batch.attention_mask, batch.action_mask.shape[1]
    with torch.no_grad():
        plain, shared = (
            response_logits(model, ids, mask, num_actions, share=share) for share in (False, True)
        )
    assert torch.equal(plain, shared)
    _same_samples_shared_or_not(model, tok, _PROMPT_SETS["whole_prompts"])


@pytest.mark.parametrize("make_batch", [group_batch, chain_batch], ids=["whole_prompts", "heads"])
def test_zero3_step_is_the_same_with_a_shared_prefix(tok, make_batch):
    """Under ZeRO-3 the prompt's modules run twice per forward (prefix or head, then the rest); parameters
    gathered for the first run must be gathered again for the second, and the update must equal the plain one."""
    from services.trainer.models.loading import TinyModelConfig
    from services.trainer.strategy import OptimConfig
    from services.trainer.strategy.deepspeed_strategy import DeepSpeedStrategy

    small = TinyModelConfig(
        num_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2
    )
    from deepspeed.utils import safe_get_full_grad

    batch = make_batch(tok.pad_token_id)
    labels = batch.input_ids[:, -batch.action_mask.shape[1] :]
    runs = []
    for share in (False, True):
        model = build_tiny_model(tok, seed=0, config=small).train()
        eng = DeepSpeedStrategy(zero_stage=3).setup(
            model, list(model.parameters()), OptimConfig(lr=1e-2, total_steps=4)
        )
        logits = response_logits(
            eng.model, batch.input_ids, batch.attention_mask, batch.action_mask.shape[1], share=share
        )
        logp = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        eng.backward(-(logp * batch.action_mask).sum() / batch.action_mask.sum())
        grads = {n: safe_get_full_grad(p).clone() for n, p in eng.model.named_parameters()}
        result = eng.step()
        assert result.stepped
        runs.append((logp.detach(), grads, float(result.grad_norm)))
    (lp0, g0, n0), (lp1, g1, n1) = runs
    assert torch.allclose(lp0[batch.action_mask], lp1[batch.action_mask], atol=1e-5)
    assert abs(n0 - n1) <= 1e-4 * n0
    for name, grad in g0.items():
        assert float((grad - g1[name]).abs().max()) <= 1e-4 * (float(grad.abs().max()) + 1e-6), name


def test_shared_gradients_are_the_same_bits_every_time(tok):
    """A seeded run must not drift: a group of rows that read one prompt adds its gradients into the prompt's
    computation in a fixed order. With ``tensor[rows]`` (transformers' ``batch_select_indices``) the CPU added
    them in a varying order, and two identical backward passes differed in the last bits."""
    model = build_tiny_model(tok, seed=0)
    ids = torch.tensor(
        [[5, 6, 7, 8, 9, 10, 11, 12] * 8 + [20 + i, 30 + i] for i in range(8)]
    )  # one prompt, G=8
    mask = torch.ones_like(ids)
    grads = []
    for _ in range(8):
        model.zero_grad()
        logits = response_logits(model, ids, mask, 2, share=True)
        logits.float().log_softmax(-1).gather(-1, ids[:, -2:, None]).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert all(torch.equal(grads[0], g) for g in grads[1:])
