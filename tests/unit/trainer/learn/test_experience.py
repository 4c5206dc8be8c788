"""The learner's one input: ``collate`` of trajectories gives the documented ``Experience`` shapes and padding,
and ``update_agent`` on it gives bit for bit the numbers the old ``Sample`` -> ``Batch`` path gave.

The reference constants were computed with the code before the ``Experience`` record (commit 744673a:
``samples_from_trajectory`` -> ``collate(samples)`` -> ``update_agent(policy, strategy, agent, batch, cfg, ...)``)
on the same trajectories, toy model and settings, on this project's CPU torch build.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
from types import SimpleNamespace

import pytest
import torch

from marti.config import AlgorithmConfig
from marti.errors import FailedPreconditionError, InvalidArgumentError
from marti.types.trajectory import Trajectory, Turn
from services.trainer.learn.algo.running_moments import RunningMoments
from services.trainer.learn.experience import collate
from services.trainer.learn.learner import LearnerConfig, TrainableCritic, normalize_credit, update_agent


def _turn(step, prompt, response, logprobs=(), reward=None, mask=()):
    return Turn(step, list(prompt), list(response), list(logprobs), reward=reward, response_mask=list(mask))


def _trajectories() -> list[Trajectory]:
    """Two groups and a group-less episode; a 3-turn episode with per-turn rewards, a masked token, behaviour
    log-probabilities on some turns, and a turn without a response (skipped)."""
    return [
        Trajectory("e1", "a", group_id="g1", episode_return=1.0, turns=[
            _turn(0, [1, 2, 3], [4, 5], [-1.5, -2.0], reward=0.5),
            _turn(1, [6], [7, 8, 9], reward=None, mask=[1, 0, 1]),
            _turn(2, [3, 3], [10], [-0.7], reward=0.25),
        ]),
        Trajectory("e2", "a", group_id="g1", episode_return=0.0, turns=[_turn(0, [2], [11, 12, 13, 14])]),
        Trajectory("e3", "a", group_id="g2", episode_return=0.75, policy_version=2,
                   turns=[_turn(0, [5, 6, 7, 8], [9], [-2.5]), _turn(1, [5], [])]),
        Trajectory("e4", "a", group_id="g2", episode_return=-0.25, turns=[_turn(0, [1], [2, 3])]),
        Trajectory("e5", "a", episode_return=0.3, turns=[_turn(0, [4, 4], [15, 1])]),
    ]  # fmt: skip


def test_collate_gives_the_documented_shapes_and_padding():
    exp = collate(_trajectories(), "a", pad_id=0)
    B, A, P = 7, 4, 4  # 7 turns with a response; longest response 4; longest prompt 4
    assert exp.agent_id == "a" and exp.batch_size == B
    assert exp.input_ids.shape == exp.attention_mask.shape == (B, P + A) and exp.input_ids.dtype == torch.long
    assert exp.action_mask.shape == exp.behaviour_logprobs.shape == (B, A)
    assert exp.action_mask.dtype == torch.bool and exp.behaviour_logprobs.dtype == torch.float32
    for name in ("has_behaviour", "rewards", "group_ids", "turn_ids", "has_turn_rewards"):
        assert getattr(exp, name).shape == (B,), name
    assert exp.rewards.dtype == exp.turn_rewards.dtype == torch.float64
    assert exp.turn_rewards.shape == (B, 3)  # e1's turn 0 has 3 turns to go
    # prompts left-padded, responses right-padded: [pad | prompt | response | pad]
    assert exp.input_ids[0].tolist() == [0, 1, 2, 3, 4, 5, 0, 0]
    assert exp.input_ids[1].tolist() == [0, 0, 0, 6, 7, 8, 9, 0]
    assert exp.input_ids[3].tolist() == [0, 0, 0, 2, 11, 12, 13, 14]
    assert exp.attention_mask[0].tolist() == [0, 1, 1, 1, 1, 1, 0, 0]
    assert exp.action_mask[1].tolist() == [True, False, True, False]  # the turn's mask, then padding
    assert exp.has_behaviour.tolist() == [True, False, True, False, True, False, False]
    assert exp.behaviour_logprobs[0].tolist() == [-1.5, -2.0, 0.0, 0.0]
    assert exp.rewards.tolist() == [1.0, 1.0, 1.0, 0.0, 0.75, -0.25, 0.3]
    assert exp.group_ids.tolist() == [0, 0, 0, 0, 1, 1, 2]  # by first appearance; e5 is a group of its own
    assert exp.turn_ids.tolist() == [0, 1, 2, 0, 0, 0, 0]
    assert exp.turn_rewards[:3].tolist() == [[0.5, 0.0, 0.25], [0.0, 0.25, 0.0], [0.25, 0.0, 0.0]]
    assert exp.has_turn_rewards.tolist() == [True, True, True, False, False, False, False]
    assert exp.ref_logprobs is None and exp.old_values is None and not exp.credited
    sub = exp.select(torch.tensor([3, 0]))
    assert sub.batch_size == 2 and sub.rewards.tolist() == [0.0, 1.0] and sub.input_ids.shape == (2, P + A)


def test_collate_refuses_what_cannot_be_a_batch():
    with pytest.raises(FailedPreconditionError, match="2 trajectories without a turn"):
        collate([Trajectory("x", "a"), Trajectory("y", "a", turns=[_turn(0, [1], [])])], "a", pad_id=0)
    bad = Trajectory("e9", "a", turns=[_turn(0, [1], [2, 3], mask=[1])])
    with pytest.raises(InvalidArgumentError, match="'e9' turn 0: response_mask has 1 values for 2"):
        collate([bad], "a", pad_id=0)
    exp = collate(_trajectories(), "a", pad_id=0)
    with pytest.raises(InvalidArgumentError, match=r"old_values must be \(B, A\) = \(7, 4\)"):
        exp.attach(old_values=torch.zeros(7, 3))
    assert exp.attach(ref_logprobs=torch.zeros(7, 4)).ref_logprobs.shape == (7, 4)


def test_learner_config_refuses_bad_values():
    with pytest.raises(InvalidArgumentError, match="tis_cap"):
        LearnerConfig(AlgorithmConfig(), micro_batch_size=1, tis_cap=0.0)
    with pytest.raises(InvalidArgumentError, match="micro_batch_size"):
        LearnerConfig(AlgorithmConfig(), micro_batch_size=0)


class _ToyPolicy:
    """Per-token log-probabilities from a tiny embedding and head over 16 tokens; its reference is shifted."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Parameter(torch.randn(16, 4, generator=g) * 0.5)
        self.head = torch.nn.Parameter(torch.randn(4, 16, generator=g) * 0.5)
        self.ref = (self.emb.detach().clone() + 0.1, self.head.detach().clone())

    @staticmethod
    def _lp(emb, head, input_ids, attention_mask, action_mask, return_entropy=False):
        A = action_mask.shape[1]
        logits = (emb[input_ids] * attention_mask[..., None]) @ head
        logp = torch.log_softmax(logits[:, -A - 1 : -1], dim=-1)
        lp = logp.gather(-1, input_ids[:, -A:, None]).squeeze(-1)
        return (lp, -(logp.exp() * logp).sum(-1)) if return_entropy else lp

    def logprobs(self, agent_id, input_ids, attention_mask, action_mask, return_entropy=False):
        return self._lp(self.emb, self.head, input_ids, attention_mask, action_mask, return_entropy)

    def ref_logprobs(self, agent_id, input_ids, attention_mask, action_mask):
        return self._lp(*self.ref, input_ids, attention_mask, action_mask)


class _ToyEngine:
    def __init__(self, params) -> None:
        self.opt = torch.optim.SGD(params, lr=0.5)

    def autocast(self):
        return contextlib.nullcontext()

    def backward(self, loss):
        loss.backward()

    def step(self):
        self.opt.step()
        self.opt.zero_grad()
        return SimpleNamespace(grad_norm=None, lr=0.5, skipped_nonfinite=False)


class _ToyCritic(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Parameter(torch.randn(16, 1, generator=torch.Generator().manual_seed(1)) * 0.3)

    def forward(self, input_ids, attention_mask, num_actions):
        return (self.emb[input_ids].squeeze(-1) * attention_mask)[:, -num_actions:]


# name: ((algorithm, micro_batch_size, grad_accum_steps, ppo_epochs, tis_cap, critic, normalize_reward),
#        (policy_loss as float.hex, sha256 of every statistic, advantage, return, ratio and 8 updated weights to 6
#        significant digits), computed with the Sample/Batch path before it was replaced
CASES = {
    "grpo": (
        (dict(kl_coef=0.0), 2, None, 1, None, False, False),
        ("0x1.30ebcd8000000p-2", "a3f3012b81463341f09e340072c34569"),
    ),
    "windows_kl_reward": (
        (dict(kl_coef=0.05, use_kl_loss=False, turn_rewards="dense"), 2, 1, 2, None, False, False),
        ("0x1.0275d83000000p-2", "e80ce21fc136939d569c813882a45315"),
    ),
    "kl_loss_tis_agent_turn": (
        (dict(kl_coef=0.1, use_kl_loss=True, group_by="agent_turn", normalize_per_agent=True), 3, 1, 1, 2.0,
         False, False),
        ("0x1.1da02c0000000p-2", "c847018b053a95f851a2df6e16e1b3ed"),
    ),
    "gae_critic": (
        (dict(advantage_estimator="gae", kl_coef=0.0), 2, 2, 2, None, True, False),
        ("0x1.4d9cce4000000p-3", "1b3cac7ccf512a4ec29bb0f939dd28f2"),
    ),
    "normalized_dense": (
        (dict(kl_coef=0.0, turn_rewards="dense"), 5, None, 1, None, False, True),
        ("0x1.6a4ae90000000p-2", "353a0987c4862155019530bf601a92cf"),
    ),
}  # fmt: skip


def _rounded(x: torch.Tensor) -> list[str]:
    """Values to 6 significant digits: the old path's numbers, robust to another CPU's last-bit rounding."""
    return [f"{float(v):.6g}" for v in x.flatten().tolist()]


@pytest.mark.parametrize("case", sorted(CASES))
def test_update_gives_bit_identical_numbers_to_the_sample_batch_path(case):
    (algo_kw, micro, accum, epochs, tis_cap, with_critic, normalize), before = CASES[case]
    torch.manual_seed(0)
    policy = _ToyPolicy()
    algo = AlgorithmConfig(**algo_kw)
    exp = collate(_trajectories(), "a", pad_id=0)
    if normalize:
        exp = normalize_credit(algo, exp, RunningMoments())
    critic = None
    if with_critic:
        model = _ToyCritic()
        critic = TrainableCritic(model, _ToyEngine(model.parameters()))
    config = LearnerConfig(algo, micro, accum, epochs, tis_cap)
    result = update_agent(policy, _ToyEngine([policy.emb, policy.head]), exp, config, critic=critic)
    got = {
        "stats": {k: f"{float(v):.6g}" for k, v in sorted(result.stats.items())},
        "advantages": _rounded(result.advantages),
        "returns": _rounded(result.returns),
        "ratio": _rounded(result.ratio),
        "weights": _rounded(policy.head.detach().flatten()[:8]),
    }
    digest = hashlib.sha256(json.dumps(got, sort_keys=True).encode()).hexdigest()[:32]
    loss_before, digest_before = before
    assert float(result.stats["policy_loss"]) == pytest.approx(float.fromhex(loss_before), rel=1e-6, abs=0)
    assert digest == digest_before, got


def test_to_moves_every_tensor_and_keeps_the_rest():
    """The learner's forward returns tensors on its device; ``Experience.to`` puts the whole batch there (on a
    GPU the advantages and losses otherwise meet a CPU mask: seen on the H200, docs/gpu.md)."""
    exp = collate(_trajectories(), "a", pad_id=0)
    exp = exp.attach(old_values=torch.ones(exp.action_mask.shape))
    moved = exp.to("meta")
    for f in dataclasses.fields(exp):
        before, after = getattr(exp, f.name), getattr(moved, f.name)
        if isinstance(before, torch.Tensor):
            assert after.device.type == "meta" and after.dtype == before.dtype and after.shape == before.shape
        else:
            assert after == before, f.name
