"""Turn one agent's trajectories into a training batch and update its policy (one RL step).

Each turn an agent took is one sample: its prompt tokens, its response tokens, and the agent's episode return
as the outcome reward; samples of episodes that share a problem seed form one group (GRPO, RLOO). Sequences are
laid out ``[left pad | prompt | response | right pad]`` so the responses fill the last A positions, which is
what :meth:`services.trainer.policy.MultiAgentPolicy.logprobs` expects.

Shapes: B samples, T = max prompt length + A, A = max response length.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from marti.errors import FailedPreconditionError
from services.trainer.algo import (
    AlgoConfig,
    actor_loss,
    compute_advantages,
    kl_penalty,
    masked_mean,
    value_loss,
)


@dataclass
class Sample:
    """One agent turn to learn from.

    Attributes:
        prompt_ids: (T_prompt,) token ids the agent saw.
        response_ids: (A_i,) token ids it generated.
        reward: Outcome reward credited to the turn (the agent's episode return), or None if unscored.
        group: Group key (problem seed): samples of one group are compared by group estimators.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    reward: float | None
    group: Any


@dataclass
class Batch:
    """A padded batch.

    Attributes:
        input_ids: (B, T) int64.
        attention_mask: (B, T) int64 0/1.
        action_mask: (B, A) bool, True on generated tokens.
        rewards: list of B rewards (None = unscored).
        groups: list of B group keys.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    rewards: list[float | None]
    groups: list[Any]

    def select(self, idx: torch.Tensor) -> Batch:
        """Rows ``idx`` of the batch (a micro-batch)."""
        ids = idx.tolist()
        return Batch(
            self.input_ids[idx],
            self.attention_mask[idx],
            self.action_mask[idx],
            [self.rewards[i] for i in ids],
            [self.groups[i] for i in ids],
        )


def collate(samples: Sequence[Sample], pad_id: int) -> Batch:
    """Pad samples into a :class:`Batch` (prompts left-padded, responses right-padded).

    Args:
        samples: At least one sample with a non-empty response.
        pad_id: Token id used for padding (masked out everywhere).

    Returns:
        The batch; T = max prompt length + A, A = max response length.

    Raises:
        FailedPreconditionError: no samples, or a sample with an empty response or prompt.
    """
    if not samples:
        raise FailedPreconditionError("cannot build a batch from zero samples")
    bad = [i for i, s in enumerate(samples) if not s.response_ids or not s.prompt_ids]
    if bad:
        raise FailedPreconditionError(f"samples {bad[:5]} have an empty prompt or response")
    p_len = max(len(s.prompt_ids) for s in samples)
    a_len = max(len(s.response_ids) for s in samples)
    B, T = len(samples), p_len + a_len
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention = torch.zeros((B, T), dtype=torch.long)
    action = torch.zeros((B, a_len), dtype=torch.bool)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, p_len - p : p_len] = torch.tensor(s.prompt_ids)
        input_ids[i, p_len : p_len + r] = torch.tensor(s.response_ids)
        attention[i, p_len - p : p_len + r] = 1
        action[i, :r] = True
    return Batch(input_ids, attention, action, [s.reward for s in samples], [s.group for s in samples])


def _stat(x: torch.Tensor | float) -> float:
    return float(x.detach().item()) if isinstance(x, torch.Tensor) else float(x)


def update_agent(
    policy: Any,
    strategy: Any,
    agent_id: str,
    batch: Batch,
    cfg: AlgoConfig,
    *,
    micro_batch_size: int,
    grad_accum_steps: int | None = None,
    ppo_epochs: int = 1,
    critic: Any = None,
    critic_engine: Any = None,
) -> dict[str, float]:
    """One RL update of one agent on one batch: advantages, then PPO-style epochs over micro-batches.

    Each epoch walks the batch in micro-batches of ``micro_batch_size`` and steps the optimizer after every
    ``grad_accum_steps`` micro-batches (and after the last), each step averaging the loss over its samples.
    The old log-probabilities come from the weights before the update, not from the sampler (as OpenRLHF's
    experience maker does), so sampling temperature never skews the importance ratio: they are recomputed
    before the update when the weights change within the batch (several optimizer steps or epochs) or the KL
    is a reward penalty; otherwise they are taken, detached, from the training forward, which is then exact.
    With ``kl_coef > 0`` the reference log-probabilities give the KL, as a reward penalty or a loss term
    (``cfg.use_kl_loss``).

    Args:
        policy: A :class:`services.trainer.policy.MultiAgentPolicy`.
        strategy: The agent's train engine (``backward(loss)``, ``step() -> StepResult``), see
            :mod:`services.trainer.strategy`.
        agent_id: The agent to update.
        batch: Its samples.
        cfg: Algorithm config.
        micro_batch_size: Samples per forward/backward pass.
        grad_accum_steps: Micro-batches per optimizer step; ``None`` = the whole batch in one step.
        ppo_epochs: Passes over the batch.
        critic: A :class:`services.trainer.critic.ValueModel` (required by ``gae``): its values at rollout
            time feed GAE, and it is trained on the returns with the clipped value loss.
        critic_engine: The critic's train engine (stepped with the policy's windows).

    Returns:
        Mean statistics: ``policy_loss``, ``clip_frac``, ``approx_kl``, ``kl``, ``entropy``, ``grad_norm``,
        ``advantage_abs``, ``sample_reward``, ``response_len``, ``num_samples``, ``optimizer_steps``; with a
        critic also ``value_loss``, ``vf_clip_frac`` and ``value_mean``.

    Raises:
        FloatingPointError: the loss became NaN or infinite (the caller stops the job, keeping its checkpoint).
    """
    B = batch.input_ids.shape[0]
    n_micro = math.ceil(B / micro_batch_size)
    accum = n_micro if grad_accum_steps is None else max(1, min(grad_accum_steps, n_micro))
    windows = [list(range(w, min(w + accum, n_micro))) for w in range(0, n_micro, accum)]
    kl_in_reward = cfg.kl_coef > 0 and not cfg.use_kl_loss
    recompute_old = ppo_epochs > 1 or len(windows) > 1 or kl_in_reward
    old_lp = ref_lp = kl = None
    with torch.no_grad():
        if recompute_old:
            old_lp = policy.logprobs(agent_id, batch.input_ids, batch.attention_mask, batch.action_mask)
        if cfg.kl_coef > 0:
            ref_lp = policy.ref_logprobs(agent_id, batch.input_ids, batch.attention_mask, batch.action_mask)
        if kl_in_reward:
            kl = kl_penalty(old_lp, ref_lp, cfg.kl_estimator, batch.action_mask)
        old_values = None
        if critic is not None:
            old_values = critic(batch.input_ids, batch.attention_mask, batch.action_mask.shape[1])
    adv, returns = compute_advantages(
        cfg, batch.rewards, batch.action_mask, batch.groups, values=old_values, kl=kl
    )
    value_fit = None if critic is None else (critic, critic_engine, old_values, returns)
    stats: dict[str, list[float]] = {}
    order = torch.arange(B)
    steps = 0
    for _ in range(ppo_epochs):
        for window in windows:
            chunks = [order[m * micro_batch_size : (m + 1) * micro_batch_size] for m in window]
            window_size = sum(len(c) for c in chunks)
            for idx in chunks:
                _micro_step(
                    policy, strategy, agent_id, batch, cfg, idx, adv, old_lp, ref_lp, window_size, stats
                )
                if value_fit is not None:
                    _value_step(cfg, batch, idx, window_size, value_fit, stats)
            if value_fit is not None:
                value_fit[1].step()
            result = strategy.step()
            steps += 1
            if result.grad_norm is not None:
                stats.setdefault("grad_norm", []).append(float(result.grad_norm))
            stats.setdefault("lr", []).append(float(result.lr))
            stats.setdefault("skipped_nonfinite", []).append(float(result.skipped_nonfinite))
    out = {k: sum(v) / len(v) for k, v in stats.items() if v}
    rewards = [r for r in batch.rewards if r is not None]
    out["sample_reward"] = sum(rewards) / len(rewards) if rewards else 0.0
    if kl is not None:
        out["kl"] = _stat(masked_mean(kl, batch.action_mask))
    else:
        out["kl"] = out.get("kl_loss", 0.0)
    out["advantage_abs"] = _stat(masked_mean(adv.abs(), batch.action_mask))
    out["response_len"] = _stat(batch.action_mask.sum(-1).float().mean())
    out["num_samples"] = float(B)
    out["optimizer_steps"] = float(steps)
    return out


def _value_step(
    cfg: AlgoConfig,
    batch: Batch,
    idx: torch.Tensor,
    window_size: int,
    value_fit: tuple[Any, Any, torch.Tensor, torch.Tensor],
    stats: dict[str, list[float]],
) -> None:
    """Clipped value loss of one micro-batch on the GAE returns, back-propagated into the critic."""
    critic, engine, old_values, returns = value_fit
    mb = batch.select(idx)
    with engine.autocast():
        values = critic(mb.input_ids, mb.attention_mask, mb.action_mask.shape[1])
    loss, s = value_loss(cfg, values, old_values[idx], returns[idx], mb.action_mask)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"non-finite value loss {loss.item()}")
    engine.backward(loss * (len(idx) / window_size))
    for k, v in s.items():
        stats.setdefault("value_loss" if k == "vf_loss" else k, []).append(_stat(v))


def _micro_step(
    policy: Any,
    strategy: Any,
    agent_id: str,
    batch: Batch,
    cfg: AlgoConfig,
    idx: torch.Tensor,
    adv: torch.Tensor,
    old_lp: torch.Tensor | None,
    ref_lp: torch.Tensor | None,
    window_size: int,
    stats: dict[str, list[float]],
) -> None:
    """Forward, loss and backward of one micro-batch ``idx``; the loss is weighted by its share of the window."""
    mb = batch.select(idx)
    with strategy.autocast():
        lp, ent = policy.logprobs(
            agent_id, mb.input_ids, mb.attention_mask, mb.action_mask, return_entropy=True
        )
    loss, s = actor_loss(
        cfg,
        lp,
        lp.detach() if old_lp is None else old_lp[idx],
        adv[idx],
        mb.action_mask,
        ref_logprobs=None if ref_lp is None else ref_lp[idx],
        entropy=ent if cfg.entropy_coef > 0 else None,
    )
    if not torch.isfinite(loss):
        raise FloatingPointError(f"agent {agent_id!r}: non-finite loss {loss.item()}")
    strategy.backward(loss * (len(idx) / window_size))
    for k, v in s.items():
        if k != "entropy":  # measured below on every micro-batch, bonus or not
            stats.setdefault("policy_loss" if k == "pg_loss" else k, []).append(_stat(v))
    stats.setdefault("entropy", []).append(_stat(masked_mean(ent.detach(), mb.action_mask)))
