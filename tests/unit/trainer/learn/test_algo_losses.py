"""Policy / value / KL / entropy losses and aggregation against hand-computed values and plain-Python loops."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marti.config import AlgorithmConfig
from marti.errors import InvalidArgumentError
from services.trainer.learn.algo import (
    actor_loss,
    aggregate_loss,
    entropy_from_logits,
    kl_loss,
    kl_penalty,
    logprobs_from_logits,
    policy_loss,
    value_loss,
)

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]

# ------------------------------------------------------------------ plain-Python reference


def ref_aggregate(mat, mask, mode, norm_tokens=None):
    if mode == "token-mean":
        vals = [mat[b][t] for b in range(len(mat)) for t in range(len(mat[b])) if mask[b][t]]
        return sum(vals) / len(vals) if vals else 0.0
    if mode == "seq-mean-token-sum-norm":
        total = sum(mat[b][t] for b in range(len(mat)) for t in range(len(mat[b])) if mask[b][t])
        return total / (len(mat) * (norm_tokens or len(mat[0])))
    seqs = []
    for b in range(len(mat)):
        vals = [mat[b][t] for t in range(len(mat[b])) if mask[b][t]]
        if vals:
            seqs.append(sum(vals) if mode == "seq-mean-token-sum" else sum(vals) / len(vals))
    return sum(seqs) / len(seqs) if seqs else 0.0


def ref_policy_token(lp, old, a, eps_low, eps_high, dual):
    ratio = math.exp(max(-20.0, min(20.0, lp - old)))
    unclipped = -a * ratio
    clipped = -a * min(max(ratio, 1 - eps_low), 1 + eps_high)
    loss = max(unclipped, clipped)
    if dual is not None and a < 0:
        loss = min(loss, -a * dual)
    return loss, clipped > unclipped


def ref_policy_loss(cfg, lp, old, adv, mask):
    mat, clip = [], []
    for b in range(len(lp)):
        row, crow = [], []
        for t in range(len(lp[b])):
            loss, c = ref_policy_token(
                lp[b][t], old[b][t], adv[b][t], cfg.clip_eps_low, cfg.clip_eps_high, cfg.dual_clip
            )
            row.append(loss)
            crow.append(1.0 if c else 0.0)
        mat.append(row)
        clip.append(crow)
    return ref_aggregate(mat, mask, cfg.loss_agg_mode, cfg.loss_norm_tokens), ref_aggregate(
        clip, mask, "token-mean"
    )


def ref_value_loss(cfg, v, v_old, ret, mask):
    mat = []
    for b in range(len(v)):
        row = []
        for t in range(len(v[b])):
            err = (v[b][t] - ret[b][t]) ** 2
            if cfg.value_clip is not None:
                vc = v_old[b][t] + min(max(v[b][t] - v_old[b][t], -cfg.value_clip), cfg.value_clip)
                err = max(err, (vc - ret[b][t]) ** 2)
            row.append(0.5 * err)
        mat.append(row)
    return ref_aggregate(mat, mask, cfg.loss_agg_mode, cfg.loss_norm_tokens)


def t(x, dtype=torch.float64):
    return torch.tensor(x, dtype=dtype)


# ------------------------------------------------------------------ hand-computed values


def test_policy_loss_hand_computed_clip_and_dual_clip():
    cfg = AlgorithmConfig(clip_eps_low=0.2, clip_eps_high=0.2, dual_clip=3.0)
    ratios = [1.5, 0.5, 5.0, 1.1]
    adv = [1.0, -1.0, -1.0, 1.0]
    # per token: max(-1.5, -1.2) = -1.2 (clipped); max(0.5, 0.8) = 0.8 (clipped); min(max(5, 1.2), 3) = 3 (dual);
    # max(-1.1, -1.1) = -1.1 (inside the range)
    lp = t([[math.log(r) for r in ratios]])
    loss, stats = policy_loss(cfg, lp, torch.zeros_like(lp), t([adv]), torch.ones(1, 4, dtype=torch.bool))
    assert loss.item() == pytest.approx((-1.2 + 0.8 + 3.0 - 1.1) / 4)
    assert stats["clip_frac"].item() == pytest.approx(0.5)
    assert stats["dual_clip_frac"].item() == pytest.approx(0.25)
    assert stats["approx_kl"].item() == pytest.approx(-sum(math.log(r) for r in ratios) / 4)


def test_asymmetric_clip_higher():
    cfg = AlgorithmConfig(clip_eps_low=0.2, clip_eps_high=0.28)
    lp = t([[math.log(1.25), math.log(1.3), math.log(0.75)]])
    loss, stats = policy_loss(cfg, lp, torch.zeros_like(lp), t([[1.0, 1.0, -1.0]]), torch.ones(1, 3))
    # 1.25 inside [0.8, 1.28] -> -1.25; 1.3 clipped to 1.28 -> -1.28; 0.75 with A<0 clipped to 0.8 -> 0.8
    assert loss.item() == pytest.approx((-1.25 - 1.28 + 0.8) / 3)
    assert stats["clip_frac"].item() == pytest.approx(2 / 3)


def test_clipped_tokens_get_no_gradient():
    cfg = AlgorithmConfig()
    lp = t([[math.log(1.5), math.log(1.1)]]).requires_grad_()
    loss, _ = policy_loss(cfg, lp, torch.zeros(1, 2, dtype=torch.float64), t([[1.0, 1.0]]), torch.ones(1, 2))
    loss.backward()
    # d/dlp of -A * exp(lp) / 2 = -A * ratio / 2 on the unclipped token, 0 on the clipped one
    assert lp.grad.tolist()[0] == pytest.approx([0.0, -1.1 / 2])


def test_value_loss_hand_computed():
    cfg = AlgorithmConfig(value_clip=0.2)
    loss, stats = value_loss(cfg, t([[1.0, 0.9]]), t([[0.5, 0.5]]), t([[1.2, 0.6]]), torch.ones(1, 2))
    # token 0: clipped value 0.7 -> 0.5 * max(0.04, 0.25) = 0.125 (clipped error larger)
    # token 1: clipped value 0.7 -> 0.5 * max(0.09, 0.01) = 0.045 (unclipped error larger)
    assert loss.item() == pytest.approx((0.125 + 0.045) / 2)
    assert stats["vf_clip_frac"].item() == pytest.approx(0.5)
    loss, _ = value_loss(
        AlgorithmConfig(value_clip=None), t([[1.0]]), t([[0.5]]), t([[1.2]]), torch.ones(1, 1)
    )
    assert loss.item() == pytest.approx(0.5 * 0.04)


def test_kl_estimators_hand_computed():
    lp, ref = t([[0.0, -1.0]]), t([[-0.5, -1.0]])  # log ratio 0.5 and 0
    assert kl_penalty(lp, ref, "k1").tolist()[0] == pytest.approx([0.5, 0.0])
    assert kl_penalty(lp, ref, "k2").tolist()[0] == pytest.approx([0.125, 0.0])
    assert kl_penalty(lp, ref, "k3").tolist()[0] == pytest.approx([math.exp(-0.5) - 0.5, 0.0])


def test_kl_estimators_agree_with_exact_kl_in_expectation():
    torch.manual_seed(0)
    p = torch.distributions.Categorical(logits=torch.randn(8, dtype=torch.float64))
    q = torch.distributions.Categorical(logits=torch.randn(8, dtype=torch.float64))
    x = p.sample((200_000,))
    exact = torch.distributions.kl_divergence(p, q).item()
    for est in ("k1", "k3"):  # unbiased estimators
        assert kl_penalty(p.log_prob(x)[None], q.log_prob(x)[None], est).mean().item() == pytest.approx(
            exact, rel=0.05
        )


def test_k3_stays_finite_with_extreme_log_ratios_and_masked_infinities():
    lp = torch.tensor([[-200.0, 0.0, float("-inf")]])
    ref = torch.tensor([[0.0, -200.0, float("-inf")]])
    out = kl_penalty(lp, ref, "k3", action_mask=torch.tensor([[1, 1, 0]]))
    assert torch.isfinite(out).all() and out[0, 2] == 0
    assert out[0, 0].item() == pytest.approx(math.exp(20) - 1 - 20, rel=1e-5)


def test_entropy_and_logprobs_hand_computed():
    logits = torch.zeros(1, 1, 4)
    assert entropy_from_logits(logits).item() == pytest.approx(math.log(4))
    logits = torch.tensor([[[0.0, float("-inf"), math.log(3.0)]]])  # p = [0.25, 0, 0.75]
    assert entropy_from_logits(logits).item() == pytest.approx(
        -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    )
    labels = torch.tensor([[2]])
    assert logprobs_from_logits(logits, labels).item() == pytest.approx(math.log(0.75))
    # temperature 2 halves the logits: p ~ [1, 0, sqrt 3]
    assert logprobs_from_logits(logits, labels, temperature=2.0).item() == pytest.approx(
        math.log(math.sqrt(3) / (1 + math.sqrt(3)))
    )


def test_logprobs_and_entropy_match_torch_distributions():
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 11)
    labels = torch.randint(0, 11, (2, 3))
    dist = torch.distributions.Categorical(logits=logits)
    assert torch.allclose(logprobs_from_logits(logits, labels), dist.log_prob(labels), atol=1e-5)
    assert torch.allclose(entropy_from_logits(logits), dist.entropy(), atol=1e-5)
    bf = logprobs_from_logits(logits.bfloat16(), labels)
    assert bf.dtype == torch.bfloat16


@pytest.mark.parametrize("mode", MODES)
def test_aggregation_hand_computed(mode):
    mat = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    want = {
        "token-mean": (1 + 2 + 4) / 3,
        "seq-mean-token-sum": (3 + 4) / 2,
        "seq-mean-token-mean": (1.5 + 4) / 2,
        "seq-mean-token-sum-norm": 7 / (3 * 3),
    }[mode]
    assert aggregate_loss(mat, mask, mode).item() == pytest.approx(want)


def test_seq_mean_token_sum_norm_uses_constant():
    mat, mask = t([[1.0, 2.0]]), torch.ones(1, 2)
    assert aggregate_loss(mat, mask, "seq-mean-token-sum-norm", norm_tokens=10).item() == pytest.approx(0.3)


# ------------------------------------------------------------------ edge cases


@pytest.mark.parametrize("mode", MODES)
def test_all_masked_batch_gives_finite_zero_loss_and_zero_grad(mode):
    cfg = AlgorithmConfig(loss_agg_mode=mode, dual_clip=3.0, entropy_coef=0.01)
    lp = torch.full((2, 3), float("-inf")).requires_grad_()
    old = torch.full((2, 3), float("-inf"))
    mask = torch.zeros(2, 3, dtype=torch.bool)
    loss, stats = actor_loss(
        cfg, lp, old, torch.full((2, 3), float("nan")), mask, ref_logprobs=old, entropy=torch.zeros(2, 3)
    )
    assert loss.item() == 0.0 and all(torch.isfinite(v) for v in stats.values())
    loss.backward()
    assert torch.equal(lp.grad, torch.zeros(2, 3))
    v = torch.zeros(2, 3, requires_grad=True)
    vloss, _ = value_loss(cfg, v, v.detach(), torch.full((2, 3), float("nan")), mask)
    vloss.backward()
    assert vloss.item() == 0.0 and torch.equal(v.grad, torch.zeros(2, 3))


def test_masked_tokens_do_not_change_the_loss():
    cfg = AlgorithmConfig(dual_clip=2.0)
    lp, old, adv = t([[0.1, -0.3, 0.2]]), t([[0.0, 0.0, 9.0]]), t([[1.0, -2.0, 50.0]])
    mask = torch.tensor([[1, 1, 0]])
    a, _ = policy_loss(cfg, lp, old, adv, mask)
    b, _ = policy_loss(cfg, lp[:, :2], old[:, :2], adv[:, :2], mask[:, :2])
    assert a.item() == pytest.approx(b.item())


def test_actor_loss_composition():
    cfg = AlgorithmConfig(kl_coef=0.1, use_kl_loss=True, entropy_coef=0.01)
    lp, old, ref = t([[0.1, -0.2]]), t([[0.0, 0.0]]), t([[-0.4, 0.3]])
    adv, mask, ent = t([[1.0, -1.0]]), torch.ones(1, 2), t([[2.0, 1.0]])
    total, stats = actor_loss(cfg, lp, old, adv, mask, ref_logprobs=ref, entropy=ent)
    pg, _ = policy_loss(cfg, lp, old, adv, mask)
    want = pg.item() + 0.1 * kl_loss(cfg, lp, ref, mask).item() - 0.01 * 1.5
    assert total.item() == pytest.approx(want)
    assert stats["entropy"].item() == pytest.approx(1.5)
    with pytest.raises(InvalidArgumentError, match="ref_logprobs"):
        actor_loss(cfg, lp, old, adv, mask)
    with pytest.raises(InvalidArgumentError, match="entropy"):
        actor_loss(cfg, lp, old, adv, mask, ref_logprobs=ref)
    # KL as a reward penalty: no KL term in the loss, so no ref_logprobs needed
    no_kl, _ = actor_loss(AlgorithmConfig(kl_coef=0.1, use_kl_loss=False), lp, old, adv, mask)
    assert no_kl.item() == pytest.approx(pg.item())


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: aggregate_loss(torch.ones(2, 2), torch.ones(2, 2), "mean"), "'mean'"),
        (lambda: aggregate_loss(torch.ones(2, 2), torch.ones(2, 3)), "shape"),
        (
            lambda: aggregate_loss(torch.ones(1, 2), torch.ones(1, 2), "seq-mean-token-sum-norm", 0),
            "norm_tokens",
        ),
        (lambda: kl_penalty(torch.ones(2), torch.ones(2), "k4"), "'k4'"),
        (lambda: kl_penalty(torch.ones(2), torch.ones(2), "k3", log_ratio_clamp=0), "log_ratio_clamp"),
        (lambda: logprobs_from_logits(torch.ones(1, 2, 3), torch.tensor([[0, 3]])), "label 3"),
        (lambda: logprobs_from_logits(torch.ones(1, 2, 3), torch.tensor([[0, -1]])), "label -1"),
        (lambda: logprobs_from_logits(torch.ones(1, 2, 3), torch.tensor([[0]])), "labels has shape"),
        (
            lambda: logprobs_from_logits(torch.ones(1, 1, 3), torch.tensor([[0]]), temperature=0.0),
            "temperature",
        ),
        (
            lambda: policy_loss(
                AlgorithmConfig(), torch.ones(1, 2), torch.ones(1, 3), torch.ones(1, 2), torch.ones(1, 2)
            ),
            "old_logprobs",
        ),
        (
            lambda: value_loss(
                AlgorithmConfig(), torch.ones(1, 2), torch.ones(1, 2), torch.ones(2, 2), torch.ones(1, 2)
            ),
            "returns",
        ),
        (lambda: entropy_from_logits(torch.ones(2, 2)), "logits must have 3"),
    ],
)
def test_bad_input_names_the_value(call, needle):
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert needle in str(info.value)


# ------------------------------------------------------------------ property tests against the reference


@st.composite
def token_batches(draw):
    b, a = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    f = st.floats(-3.0, 3.0, allow_nan=False)

    def mat(s):
        return draw(st.lists(st.lists(s, min_size=a, max_size=a), min_size=b, max_size=b))

    return mat(f), mat(f), mat(f), mat(st.booleans())


@settings(max_examples=80, deadline=None)
@given(
    token_batches(),
    st.sampled_from(MODES),
    st.sampled_from([0.0, 0.1, 0.2]),
    st.sampled_from([0.0, 0.2, 0.28]),
    st.sampled_from([None, 1.5, 3.0]),
)
def test_policy_loss_matches_reference(batch, mode, eps_low, eps_high, dual):
    lp, old, adv, mask = batch
    cfg = AlgorithmConfig(loss_agg_mode=mode, clip_eps_low=eps_low, clip_eps_high=eps_high, dual_clip=dual)
    loss, stats = policy_loss(cfg, t(lp), t(old), t(adv), torch.tensor(mask))
    want_loss, want_clip = ref_policy_loss(cfg, lp, old, adv, mask)
    assert loss.item() == pytest.approx(want_loss, rel=1e-9, abs=1e-9)
    assert stats["clip_frac"].item() == pytest.approx(want_clip, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(token_batches(), st.sampled_from(MODES), st.sampled_from([None, 0.1, 0.5]))
def test_value_loss_matches_reference(batch, mode, clip):
    v, v_old, ret, mask = batch
    cfg = AlgorithmConfig(loss_agg_mode=mode, value_clip=clip)
    loss, _ = value_loss(cfg, t(v), t(v_old), t(ret), torch.tensor(mask))
    assert loss.item() == pytest.approx(ref_value_loss(cfg, v, v_old, ret, mask), rel=1e-9, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(token_batches(), st.sampled_from(["k1", "k2", "k3"]))
def test_kl_loss_matches_reference_and_k2_k3_are_nonnegative(batch, est):
    lp, ref, _, mask = batch
    cfg = AlgorithmConfig(kl_estimator=est, loss_agg_mode="token-mean")
    per_token = []
    for b in range(len(lp)):
        row = []
        for i in range(len(lp[b])):
            x = lp[b][i] - ref[b][i]
            row.append({"k1": x, "k2": 0.5 * x * x, "k3": math.exp(-x) - 1 + x}[est])
        per_token.append(row)
    got = kl_loss(cfg, t(lp), t(ref), torch.tensor(mask)).item()
    assert got == pytest.approx(ref_aggregate(per_token, mask, "token-mean"), rel=1e-9, abs=1e-9)
    if est != "k1":
        assert (kl_penalty(t(lp), t(ref), est) >= 0).all()
