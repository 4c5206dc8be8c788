"""Advantage estimators against hand-computed values and a plain-Python reference implementation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marti.config import AlgorithmConfig
from marti.errors import InvalidArgumentError
from services.trainer.learn.algo import (
    available_advantage_estimators,
    compute_advantages,
    get_advantage_estimator,
    register_advantage_estimator,
    reward_present,
)

# ------------------------------------------------------------------ plain-Python reference (lists and loops only)


def ref_scores(rewards, mask, kl, kl_coef):
    """Sequence score = reward - kl_coef * sum of kl over action tokens (kl may be None)."""
    out = []
    for b, r in enumerate(rewards):
        s = 0.0 if r is None else r
        if kl is not None:
            for t in range(len(mask[b])):
                if mask[b][t]:
                    s -= kl_coef * kl[b][t]
        out.append(s)
    return out


def ref_groups(groups):
    members = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    return members


def ref_group_estimator(kind, rewards, mask, groups, kl=None, kl_coef=0.0, eps=1e-6):
    scores = ref_scores(rewards, mask, kl, kl_coef)
    per_sample = [0.0] * len(rewards)
    for idx in ref_groups(groups).values():
        valid = [i for i in idx if rewards[i] is not None]
        vals = [scores[i] for i in valid]
        n = len(vals)
        if n < 2 or max(vals) == min(vals):
            continue
        mean = sum(vals) / n
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1))
        for i in valid:
            if kind == "grpo":
                per_sample[i] = (scores[i] - mean) / (std + eps)
            elif kind == "dr_grpo":
                per_sample[i] = scores[i] - mean
            else:  # rloo
                per_sample[i] = scores[i] - (sum(vals) - scores[i]) / (n - 1)
    adv = [[per_sample[b] if mask[b][t] else 0.0 for t in range(len(mask[b]))] for b in range(len(rewards))]
    return adv, adv


def ref_token_rewards(rewards, mask, kl, kl_coef):
    out = []
    for b, r in enumerate(rewards):
        row = [(-kl_coef * kl[b][t] if (kl is not None and mask[b][t]) else 0.0) for t in range(len(mask[b]))]
        positions = [t for t in range(len(mask[b])) if mask[b][t]]
        if positions:
            row[positions[-1]] += 0.0 if r is None else r
        out.append(row)
    return out


def ref_whiten(mat, keep):
    vals = [mat[b][t] for b in range(len(mat)) for t in range(len(mat[b])) if keep[b][t]]
    n = len(vals)
    mean = sum(vals) / n if n else 0.0
    var = sum((v - mean) ** 2 for v in vals) / (n - 1) if n > 1 else 0.0
    return [
        [(mat[b][t] - mean) / math.sqrt(var + 1e-8) if keep[b][t] else 0.0 for t in range(len(mat[b]))]
        for b in range(len(mat))
    ]


def ref_reinforce(rewards, mask, groups, gamma, kl=None, kl_coef=0.0, baseline=False):
    rewards = list(rewards)
    if baseline:
        centred = list(rewards)
        for idx in ref_groups(groups).values():
            valid = [i for i in idx if rewards[i] is not None]
            vals = [rewards[i] for i in valid]
            if len(vals) < 2 or max(vals) == min(vals):
                for i in valid:
                    centred[i] = 0.0
                continue
            mean = sum(vals) / len(vals)
            for i in valid:
                centred[i] = rewards[i] - mean
        rewards = centred
    keep = [
        [bool(mask[b][t]) and rewards[b] is not None for t in range(len(mask[b]))] for b in range(len(mask))
    ]
    tok = ref_token_rewards(rewards, mask, kl, kl_coef)
    returns = []
    for b in range(len(mask)):
        row, g = [0.0] * len(mask[b]), 0.0
        for t in reversed(range(len(mask[b]))):
            if keep[b][t]:
                g = tok[b][t] + gamma * g
                row[t] = g
        returns.append(row)
    return ref_whiten(returns, keep), returns


def ref_gae(rewards, mask, values, gamma, lambd, kl=None, kl_coef=0.0, normalize=False):
    keep = [
        [bool(mask[b][t]) and rewards[b] is not None for t in range(len(mask[b]))] for b in range(len(mask))
    ]
    tok = ref_token_rewards(rewards, mask, kl, kl_coef)
    adv = [[0.0] * len(row) for row in mask]
    ret = [[0.0] * len(row) for row in mask]
    for b in range(len(mask)):
        steps = [t for t in range(len(mask[b])) if keep[b][t]]
        a_next = 0.0
        for k in reversed(range(len(steps))):
            t = steps[k]
            v_next = values[b][steps[k + 1]] if k + 1 < len(steps) else 0.0
            delta = tok[b][t] + gamma * v_next - values[b][t]
            a_next = delta + gamma * lambd * a_next
            adv[b][t] = a_next
            ret[b][t] = a_next + values[b][t]
    return (ref_whiten(adv, keep) if normalize else adv), ret


def run(cfg, rewards, mask, groups=None, values=None, kl=None):
    m = torch.tensor(mask, dtype=torch.bool)
    v = None if values is None else torch.tensor(values, dtype=torch.float32)
    k = None if kl is None else torch.tensor(kl, dtype=torch.float32)
    adv, ret = compute_advantages(cfg, rewards, m, groups, v, k)
    return adv.tolist(), ret.tolist()


def close(a, b, tol=1e-4):
    assert torch.allclose(
        torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64), atol=tol, rtol=tol
    ), (
        a,
        b,
    )


# ------------------------------------------------------------------ hand-computed values


def test_grpo_hand_computed():
    cfg = AlgorithmConfig(advantage_estimator="grpo")
    adv, ret = run(cfg, [1.0, 0.0, 0.0, 1.0], [[1, 1]] * 4, 4)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # mean 0.5, unbiased std sqrt(1/3)
    close(adv, [[a, a], [-a, -a], [-a, -a], [a, a]])
    close(ret, adv)


def test_dr_grpo_hand_computed():
    adv, _ = run(AlgorithmConfig(advantage_estimator="dr_grpo"), [1.0, 0.0, 0.0], [[1, 0, 1]] * 3, 3)
    close(adv, [[2 / 3, 0, 2 / 3], [-1 / 3, 0, -1 / 3], [-1 / 3, 0, -1 / 3]])


def test_rloo_hand_computed():
    adv, _ = run(AlgorithmConfig(advantage_estimator="rloo"), [1.0, 0.0, 0.0], [[1]] * 3, 3)
    close(adv, [[1.0], [-0.5], [-0.5]])


def test_reinforce_pp_hand_computed():
    cfg = AlgorithmConfig(advantage_estimator="reinforce++", gamma=1.0)
    adv, ret = run(cfg, [1.0, 0.0], [[1, 1], [1, 1]])
    close(ret, [[1, 1], [0, 0]])
    a = 0.5 / math.sqrt(1 / 3 + 1e-8)  # four returns 1,1,0,0: mean .5, unbiased var 1/3
    close(adv, [[a, a], [-a, -a]])


def test_reinforce_pp_discount_and_kl_penalty_hand_computed():
    cfg = AlgorithmConfig(advantage_estimator="reinforce++", gamma=0.5, kl_coef=0.1, use_kl_loss=False)
    # token rewards: [-0.1*0.2, -0.1*0.4 + 1] -> returns [-0.02 + 0.5*0.96, 0.96]
    _, ret = run(cfg, [1.0], [[1, 1]], kl=[[0.2, 0.4]])
    close(ret, [[-0.02 + 0.5 * 0.96, 0.96]])


def test_kl_is_ignored_as_reward_when_it_is_a_loss_term():
    cfg = AlgorithmConfig(advantage_estimator="reinforce++", kl_coef=0.1, use_kl_loss=True)
    _, ret = run(cfg, [1.0], [[1, 1]], kl=[[0.2, 0.4]])
    close(ret, [[1.0, 1.0]])


def test_reinforce_pp_baseline_hand_computed():
    cfg = AlgorithmConfig(advantage_estimator="reinforce++_baseline")
    _, ret = run(cfg, [3.0, 1.0, 5.0, 5.0], [[1, 1]] * 4, [7, 7, 9, 9])
    close(ret, [[1, 1], [-1, -1], [0, 0], [0, 0]])  # second group is all-equal -> baseline removes everything


def test_gae_hand_computed():
    cfg = AlgorithmConfig(advantage_estimator="gae", gamma=1.0, lambd=1.0, normalize_advantages=False)
    adv, ret = run(cfg, [1.0], [[1, 1]], values=[[0.5, 0.25]])
    close(adv, [[0.5, 0.75]])
    close(ret, [[1.0, 1.0]])
    cfg = AlgorithmConfig(advantage_estimator="gae", gamma=0.9, lambd=0.5, normalize_advantages=False)
    adv, ret = run(cfg, [1.0], [[1, 1]], values=[[0.5, 0.25]])
    # delta1 = 1 - .25 = .75; delta0 = .9*.25 - .5 = -.275; A0 = -.275 + .9*.5*.75
    close(adv, [[0.0625, 0.75]])
    close(ret, [[0.5625, 1.0]])


def test_gae_skips_observation_tokens_between_turns():
    cfg = AlgorithmConfig(advantage_estimator="gae", gamma=0.9, lambd=0.5, normalize_advantages=False)
    adv, ret = run(cfg, [1.0], [[1, 0, 0, 1, 0]], values=[[0.5, 99.0, -7.0, 0.25, 3.0]])
    close(adv, [[0.0625, 0, 0, 0.75, 0]])
    close(ret, [[0.5625, 0, 0, 1.0, 0]])


def test_reinforce_skips_observation_tokens_between_turns():
    cfg = AlgorithmConfig(advantage_estimator="reinforce++", gamma=0.5)
    _, ret = run(cfg, [1.0, 1.0], [[1, 0, 1], [1, 1, 0]])
    close(ret, [[0.5, 0, 1.0], [0.5, 1.0, 0]])


# ------------------------------------------------------------------ edge cases


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce++_baseline"])
@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, -3.7])
def test_all_equal_group_gives_exact_zero(name, value):
    cfg = AlgorithmConfig(advantage_estimator=name)
    adv, ret = run(cfg, [value, value, value], [[1, 1, 1]] * 3, 3)
    assert adv == [[0.0] * 3] * 3
    if name != "reinforce++_baseline":
        assert ret == [[0.0] * 3] * 3


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce++_baseline"])
def test_group_of_one_gives_zero(name):
    adv, _ = run(AlgorithmConfig(advantage_estimator=name), [1.0, 0.0], [[1, 1]] * 2, 1)
    assert adv == [[0.0, 0.0], [0.0, 0.0]]


@pytest.mark.parametrize(
    "name", sorted(["gae", "grpo", "dr_grpo", "rloo", "reinforce++", "reinforce++_baseline"])
)
def test_all_masked_batch_is_finite_zero(name):
    values = [[0.3, 0.1]] * 4
    adv, ret = run(AlgorithmConfig(advantage_estimator=name), [1.0, 0.0, 1.0, 0.5], [[0, 0]] * 4, 2, values)
    assert adv == [[0.0, 0.0]] * 4 and ret == [[0.0, 0.0]] * 4


@pytest.mark.parametrize("name", ["gae", "grpo", "dr_grpo", "rloo", "reinforce++", "reinforce++_baseline"])
def test_none_reward_is_unscored_and_excluded(name):
    cfg = AlgorithmConfig(advantage_estimator=name)
    values = [[0.1, 0.2]] * 4
    adv, ret = run(cfg, [1.0, None, 0.0, 1.0], [[1, 1]] * 4, [0, 0, 0, 1], values)
    assert adv[1] == [0.0, 0.0] and ret[1] == [0.0, 0.0]
    # the same batch without the unscored sample gives the same advantages for the others
    adv2, _ = run(cfg, [1.0, 0.0, 1.0], [[1, 1]] * 3, [0, 0, 1], values[:3])
    close([adv[0], adv[2], adv[3]], adv2)


def test_nan_in_reward_tensor_means_none():
    cfg = AlgorithmConfig(advantage_estimator="grpo")
    m = torch.ones(3, 2, dtype=torch.bool)
    a, _ = compute_advantages(cfg, torch.tensor([1.0, float("nan"), 0.0]), m, 3)
    b, _ = compute_advantages(cfg, [1.0, None, 0.0], m, 3)
    assert torch.equal(a, b) and torch.isfinite(a).all()
    assert reward_present([1.0, None, 0.0]).tolist() == [True, False, True]


def test_row_without_action_tokens_still_counts_in_group():
    cfg = AlgorithmConfig(advantage_estimator="rloo")
    adv, _ = run(cfg, [1.0, 0.0, 0.0], [[1], [0], [1]], 3)
    close(adv, [[1.0], [0.0], [-0.5]])


def test_group_ids_in_any_order_match_contiguous_groups():
    cfg = AlgorithmConfig(advantage_estimator="grpo")
    a, _ = run(cfg, [1.0, 5.0, 0.0, 2.0], [[1]] * 4, ["p", "q", "p", "q"])
    b, _ = run(cfg, [1.0, 0.0, 5.0, 2.0], [[1]] * 4, 2)
    close([a[0], a[2], a[1], a[3]], b)


def test_output_dtype_follows_values_and_is_detached():
    v = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
    adv, ret = compute_advantages(
        AlgorithmConfig(advantage_estimator="gae"), [1.0, 0.0], torch.ones(2, 2), values=v
    )
    assert adv.dtype == torch.float64 and not adv.requires_grad and not ret.requires_grad
    adv, _ = compute_advantages(AlgorithmConfig(), [1.0, 0.0], torch.ones(2, 2), 2)
    assert adv.dtype == torch.float32


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"rewards": [1.0, float("inf")]}, "rewards"),
        (
            {"rewards": [1e200, 0.0]},
            "rewards[0]: the reward is 1e+200, beyond +-1e+20",
        ),  # all-zero advantages
        ({"rewards": torch.tensor([0.0, -1e308], dtype=torch.float64)}, "rewards[1]: the reward is -1e+308"),
        ({"rewards": [1.0, "x"]}, "rewards[1]"),
        ({"rewards": [1.0]}, "1 entries"),
        ({"group_ids": 3}, "not a multiple of group_size 3"),
        ({"group_ids": 0}, "group_size"),
        ({"group_ids": [0, 0, 1]}, "length 3"),
        ({"group_ids": None}, "needs group_ids"),
        ({"action_mask": torch.full((2, 2), 2)}, "only 0 and 1"),
        ({"action_mask": torch.ones(2)}, "action_mask must have 2"),
        ({"kl": torch.ones(2, 3)}, "kl has shape"),
        ({"kl": torch.tensor([[1.0, float("nan")], [0.0, 0.0]])}, "kl must be finite"),
    ],
)
def test_bad_input_names_the_value(kwargs, needle):
    args = {"rewards": [1.0, 0.0], "action_mask": torch.ones(2, 2), "group_ids": 2, "kl": None}
    args.update(kwargs)
    with pytest.raises(InvalidArgumentError, match=None) as info:
        compute_advantages(
            AlgorithmConfig(), args["rewards"], args["action_mask"], args["group_ids"], kl=args["kl"]
        )
    assert needle in str(info.value)


def test_gae_without_values_is_an_error():
    with pytest.raises(InvalidArgumentError, match="needs critic values"):
        compute_advantages(AlgorithmConfig(advantage_estimator="gae"), [1.0], torch.ones(1, 2))


def test_nonfinite_value_on_action_token_is_an_error_but_ignored_elsewhere():
    cfg = AlgorithmConfig(advantage_estimator="gae")
    with pytest.raises(InvalidArgumentError, match="values must be finite"):
        compute_advantages(cfg, [1.0], torch.ones(1, 2), values=torch.tensor([[0.0, float("nan")]]))
    adv, _ = compute_advantages(
        cfg, [1.0], torch.tensor([[1, 0]]), values=torch.tensor([[0.0, float("nan")]])
    )
    assert torch.isfinite(adv).all()


def test_registry():
    assert set(available_advantage_estimators()) >= {
        "gae",
        "grpo",
        "dr_grpo",
        "reinforce++",
        "reinforce++_baseline",
        "rloo",
    }
    with pytest.raises(InvalidArgumentError, match="'nope'"):
        get_advantage_estimator("nope")
    with pytest.raises(InvalidArgumentError, match="already registered"):
        register_advantage_estimator("grpo")(lambda cfg, inputs: (None, None))


# ------------------------------------------------------------------ property tests against the reference


@st.composite
def batches(draw):
    num_groups = draw(st.integers(1, 3))
    group_size = draw(st.integers(1, 4))
    length = draw(st.integers(1, 5))
    b = num_groups * group_size
    rewards = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.25, None]), min_size=b, max_size=b))
    mask = draw(st.lists(st.lists(st.booleans(), min_size=length, max_size=length), min_size=b, max_size=b))
    unit = st.floats(-1.0, 1.0, allow_nan=False, width=32)
    values = draw(st.lists(st.lists(unit, min_size=length, max_size=length), min_size=b, max_size=b))
    kl = draw(st.lists(st.lists(unit, min_size=length, max_size=length), min_size=b, max_size=b))
    return rewards, mask, group_size, values, kl


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from(["grpo", "dr_grpo", "rloo"]), st.booleans())
def test_group_estimators_match_reference(batch, name, kl_in_reward):
    rewards, mask, g, _, kl = batch
    cfg = AlgorithmConfig(advantage_estimator=name, kl_coef=0.05, use_kl_loss=not kl_in_reward)
    got = run(cfg, rewards, mask, g, kl=kl)
    groups = [i // g for i in range(len(rewards))]
    want = ref_group_estimator(name, rewards, mask, groups, kl, 0.05 if kl_in_reward else 0.0)
    close(got[0], want[0], tol=2e-4)
    close(got[1], want[1], tol=2e-4)


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from([1.0, 0.9, 0.0]), st.booleans())
def test_reinforce_estimators_match_reference(batch, gamma, baseline):
    rewards, mask, g, _, kl = batch
    name = "reinforce++_baseline" if baseline else "reinforce++"
    cfg = AlgorithmConfig(advantage_estimator=name, gamma=gamma, kl_coef=0.05, use_kl_loss=False)
    got = run(cfg, rewards, mask, g, kl=kl)
    groups = [i // g for i in range(len(rewards))]
    want = ref_reinforce(rewards, mask, groups, gamma, kl, 0.05, baseline)
    close(got[1], want[1])
    close(got[0], want[0], tol=2e-3)


@settings(max_examples=60, deadline=None)
@given(batches(), st.sampled_from([1.0, 0.95]), st.sampled_from([1.0, 0.9, 0.0]), st.booleans())
def test_gae_matches_reference(batch, gamma, lambd, normalize):
    rewards, mask, _, values, kl = batch
    cfg = AlgorithmConfig(
        advantage_estimator="gae",
        gamma=gamma,
        lambd=lambd,
        kl_coef=0.05,
        use_kl_loss=False,
        normalize_advantages=normalize,
    )
    got = run(cfg, rewards, mask, None, values, kl)
    want = ref_gae(rewards, mask, values, gamma, lambd, kl, 0.05, normalize)
    close(got[1], want[1])
    close(got[0], want[0], tol=2e-3)


@settings(max_examples=40, deadline=None)
@given(batches(), st.floats(-5, 5), st.floats(0.25, 4))
def test_grpo_is_invariant_to_affine_reward_changes(batch, shift, scale):
    rewards, mask, g, _, _ = batch
    cfg = AlgorithmConfig(advantage_estimator="grpo", adv_eps=1e-12)
    a, _ = run(cfg, rewards, mask, g)
    moved = [None if r is None else r * scale + shift for r in rewards]
    b, _ = run(cfg, moved, mask, g)
    close(a, b, tol=1e-3)


@settings(max_examples=40, deadline=None)
@given(batches())
def test_rloo_and_dr_grpo_advantages_sum_to_zero_per_group(batch):
    rewards, _, g, _, _ = batch
    mask = [[True]] * len(rewards)
    for name in ("rloo", "dr_grpo"):
        adv, _ = run(AlgorithmConfig(advantage_estimator=name), rewards, mask, g)
        for start in range(0, len(rewards), g):
            assert abs(sum(row[0] for row in adv[start : start + g])) < 1e-4
