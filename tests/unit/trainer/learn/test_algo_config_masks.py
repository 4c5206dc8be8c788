"""The algorithm section's validation (marti.config.AlgorithmConfig) at the edge of every limit, masked reductions and multi-turn action masks."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from marti.config import AlgorithmConfig, config_from_dict
from marti.errors import InvalidArgumentError
from services.trainer.learn.algo import (
    action_mask_from_owners,
    action_mask_from_spans,
    available_advantage_estimators,
    last_action_index,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

# ------------------------------------------------------------------ the algorithm section

BASE = {"training_name": "t", "agents": [{"name": "a", "pretrain_model": "m", "role": "r"}]}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gamma", 0.0),
        ("gamma", 1.0),
        ("lambd", 0.0),
        ("lambd", 1.0),
        ("kl_coef", 0.0),
        ("clip_eps_low", 0.0),
        ("clip_eps_low", 0.999),
        ("clip_eps_high", 0.0),
        ("clip_eps_high", 5.0),
        ("dual_clip", 1.0001),
        ("dual_clip", None),
        ("value_clip", 1e-9),
        ("value_clip", None),
        ("entropy_coef", 0.0),
        ("adv_eps", 1e-12),
        ("loss_norm_tokens", 1),
        ("loss_norm_tokens", None),
        ("log_ratio_clamp", 1e-3),
        ("kl_estimator", "k1"),
        ("use_kl_loss", False),
    ],
)
def test_values_at_the_edge_are_accepted(field, value):
    assert getattr(AlgorithmConfig(**{field: value}), field) == value


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("advantage_estimator", "ppo"),
        ("gamma", -0.01),
        ("gamma", 1.01),
        ("gamma", math.nan),
        ("lambd", 1.5),
        ("kl_coef", -1e-9),
        ("kl_coef", math.inf),
        ("kl_estimator", "low_var_kl"),
        ("use_kl_loss", 1),
        ("normalize_advantages", "yes"),
        ("clip_eps_low", 1.0),
        ("clip_eps_low", -0.1),
        ("clip_eps_high", -0.1),
        ("dual_clip", 1.0),
        ("value_clip", 0.0),
        ("entropy_coef", -0.1),
        ("loss_agg_mode", "mean"),
        ("adv_eps", 0.0),
        ("loss_norm_tokens", 0),
        ("loss_norm_tokens", 2.5),
        ("loss_norm_tokens", True),
        ("log_ratio_clamp", 0.0),
        ("gamma", True),
        ("kl_coef", -math.inf),
        ("use_kl_loss", "true"),
    ],
)
def test_bad_values_raise_naming_the_field_and_value(field, value):
    with pytest.raises(InvalidArgumentError) as info:
        AlgorithmConfig(**{field: value})
    assert field in str(info.value) and repr(value) in str(info.value)


def test_config_is_frozen_and_round_trips():
    cfg = AlgorithmConfig(advantage_estimator="rloo", dual_clip=3.0)
    with pytest.raises(ValidationError, match="frozen"):
        cfg.gamma = 0.5  # type: ignore[misc]
    assert AlgorithmConfig(**cfg.model_dump()) == cfg
    assert (
        AlgorithmConfig(gamma="0.9").gamma == 0.9
    )  # a numeric string (YAML 1.1 reads 2e-5 as one) is a number


def test_a_config_file_names_unknown_and_bad_algorithm_keys_with_their_path():
    with pytest.raises(
        InvalidArgumentError, match=r"unknown key 'algorithm\.kl_coeff' \(did you mean 'kl_coef'"
    ):
        config_from_dict({**BASE, "algorithm": {"kl_coeff": 0.1}})
    with pytest.raises(
        InvalidArgumentError, match=r"'algorithm\.gamma': .*less than or equal to 1 \(got 2\)"
    ):
        config_from_dict({**BASE, "algorithm": {"gamma": 2}})
    with pytest.raises(
        InvalidArgumentError, match=r"'algorithm\.use_kl_loss': must be true or false \(got 1\)"
    ):
        config_from_dict({**BASE, "algorithm": {"use_kl_loss": 1}})
    with pytest.raises(InvalidArgumentError, match=r"'algorithm': .*valid dictionary"):
        config_from_dict({**BASE, "algorithm": [["gamma", 1.0]]})


def test_every_registered_estimator_is_a_valid_config_value():
    for name in available_advantage_estimators():
        assert AlgorithmConfig(advantage_estimator=name).advantage_estimator == name


# ------------------------------------------------------------------ masked reductions


def test_masked_reductions_hand_computed():
    x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("-inf"), 5.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_sum(x, m).item() == 6.0
    assert masked_mean(x, m).item() == 2.0
    assert masked_mean(x, m, dim=1).tolist() == [1.5, 3.0]
    assert masked_var(x, m).item() == pytest.approx(1.0)  # values 1, 2, 3: unbiased var 1
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(2 / 3)
    w = masked_whiten(x, m)
    assert w.tolist()[0][:2] == pytest.approx([-1.0, 0.0], abs=1e-6) and w[1, 0].item() == pytest.approx(1.0)
    assert w[0, 2].item() == 0.0 and w[1, 1].item() == 0.0
    assert masked_whiten(x, m, shift_mean=False)[0, 1].item() == pytest.approx(2.0)


def test_empty_and_single_element_masks_are_finite_zero():
    x = torch.tensor([[float("nan"), 2.0]], requires_grad=True)
    none = torch.zeros(1, 2, dtype=torch.bool)
    assert masked_mean(x, none).item() == 0.0 and masked_var(x, none).item() == 0.0
    assert masked_whiten(x, none).tolist() == [[0.0, 0.0]]
    one = torch.tensor([[False, True]])
    assert masked_var(x, one).item() == 0.0 and masked_whiten(x, one).tolist() == [[0.0, 0.0]]
    masked_mean(x, none).backward()
    assert x.grad.tolist() == [[0.0, 0.0]]


def test_masked_helpers_reject_bad_masks():
    with pytest.raises(InvalidArgumentError, match="mask has shape"):
        masked_mean(torch.ones(2, 2), torch.ones(2, 3))
    with pytest.raises(InvalidArgumentError, match="only 0 and 1, got 0.5"):
        masked_sum(torch.ones(2), torch.tensor([1.0, 0.5]))
    with pytest.raises(InvalidArgumentError, match="eps must be > 0"):
        masked_whiten(torch.ones(2), torch.ones(2), eps=0.0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(-100, 100), st.booleans()), min_size=1, max_size=30))
def test_masked_whiten_has_zero_mean_unit_variance(items):
    x = torch.tensor([v for v, _ in items], dtype=torch.float64)
    m = torch.tensor([k for _, k in items])
    kept = x[m]
    w = masked_whiten(x, m, eps=1e-12)
    if kept.numel() >= 2 and float(kept.std()) > 1e-3:
        assert abs(float(w[m].mean())) < 1e-6
        assert float(w[m].std()) == pytest.approx(1.0, rel=1e-6)
    assert torch.isfinite(w).all() and (w[~m] == 0).all()


# ------------------------------------------------------------------ multi-turn action masks


def test_mask_from_owners_keeps_only_this_agents_tokens():
    # prompt(-1) agent0 agent0 env(-1) agent1 agent0 pad
    owner = torch.tensor([[-1, 0, 0, -1, 1, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1, 1, 0]])
    assert action_mask_from_owners(owner, 0, attn).tolist() == [
        [False, True, True, False, False, True, False]
    ]
    assert action_mask_from_owners(owner, 1).tolist() == [[False, False, False, False, True, False, False]]
    assert not action_mask_from_owners(owner, 2).any()


def test_mask_from_spans():
    mask = action_mask_from_spans([[(0, 2), (4, 5)], [], [(5, 5)]], 5)
    assert mask.tolist() == [
        [True, True, False, False, True],
        [False] * 5,
        [False] * 5,
    ]


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (
            lambda: action_mask_from_spans([[(0, 6)]], 5),
            "(0, 6) of sequence 0 must satisfy 0 <= start <= end <= 5",
        ),
        (lambda: action_mask_from_spans([[], [(3, 2)]], 5), "(3, 2) of sequence 1"),
        (lambda: action_mask_from_spans([[(-1, 2)]], 5), "(-1, 2)"),
        (lambda: action_mask_from_spans([[(1,)]], 5), "(start, end) pair"),
        (lambda: action_mask_from_spans([], -1), "num_tokens must be an int >= 0, got -1"),
        (lambda: action_mask_from_owners(torch.zeros(1, 2), 0), "integer tensor"),
        (
            lambda: action_mask_from_owners(torch.zeros(1, 2, dtype=torch.long), -1),
            "agent must be an int >= 0, got -1",
        ),
        (
            lambda: action_mask_from_owners(torch.zeros(1, 2, dtype=torch.long), 0, torch.ones(1, 3)),
            "attention_mask",
        ),
    ],
)
def test_mask_builders_reject_bad_input(call, needle):
    with pytest.raises(InvalidArgumentError) as info:
        call()
    assert needle in str(info.value)


def test_last_action_index():
    m = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert last_action_index(m).tolist() == [2, -1, 3]
    assert last_action_index(torch.zeros(2, 0, dtype=torch.bool)).tolist() == [-1, -1]
