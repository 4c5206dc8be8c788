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

from marti.errors import FailedPreconditionError, InvalidArgumentError
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


def pad_id_of(tokenizer: Any) -> int:
    """The token id a batch is padded with: the tokenizer's pad token, else its EOS token.

    Every actor that collates the same samples (policy, reference, critic) must pad alike so their batches are
    identical.
    """
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def update_windows(
    batch_size: int, micro_batch_size: int, grad_accum_steps: int | None, ppo_epochs: int = 1
) -> list[tuple[list[torch.Tensor], int]]:
    """The optimizer windows of an update: per epoch, the micro-batches stepped together.

    The batch is walked in micro-batches of ``micro_batch_size`` rows; ``grad_accum_steps`` consecutive
    micro-batches (and the remainder at the end) form one optimizer step. The policy update
    (:func:`update_agent`) and the critic fit (:func:`fit_values`) use the same windows.

    Args:
        batch_size: B, rows in the batch (>= 1).
        micro_batch_size: Rows per forward/backward pass (>= 1).
        grad_accum_steps: Micro-batches per optimizer step; ``None`` = the whole batch in one step.
        ppo_epochs: Passes over the batch; the windows repeat once per epoch.

    Returns:
        ``ppo_epochs * ceil(n_micro / accum)`` entries ``(chunks, window_size)``: the row indices (int64
        tensors) of each micro-batch of the window and the window's total number of rows (each micro-batch's
        loss is weighted by ``len(chunk) / window_size``).
    """
    n_micro = math.ceil(batch_size / micro_batch_size)
    accum = n_micro if grad_accum_steps is None else max(1, min(grad_accum_steps, n_micro))
    order = torch.arange(batch_size)
    windows = []
    for w in range(0, n_micro, accum):
        chunks = [
            order[m * micro_batch_size : (m + 1) * micro_batch_size]
            for m in range(w, min(w + accum, n_micro))
        ]
        windows.append((chunks, sum(len(c) for c in chunks)))
    return windows * ppo_epochs


def _check_rows(name: str, x: torch.Tensor, batch: Batch) -> None:
    """Raise InvalidArgumentError unless ``x`` is (B, A) like the batch's action mask."""
    if tuple(x.shape) != tuple(batch.action_mask.shape):
        raise InvalidArgumentError(
            f"{name} must be (B, A) = {tuple(batch.action_mask.shape)} like the batch, got {tuple(x.shape)}"
        )


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
    ref_logprobs: torch.Tensor | None = None,
    old_values: torch.Tensor | None = None,
    outputs: dict[str, torch.Tensor] | None = None,
) -> dict[str, float]:
    """One RL update of one agent on one batch: advantages, then PPO-style epochs over micro-batches.

    Each epoch walks the batch in micro-batches of ``micro_batch_size`` and steps the optimizer after every
    ``grad_accum_steps`` micro-batches (and after the last), each step averaging the loss over its samples
    (:func:`update_windows`). The old log-probabilities come from the weights before the update, not from the
    sampler (as OpenRLHF's experience maker does), so sampling temperature never skews the importance ratio:
    they are recomputed before the update when the weights change within the batch (several optimizer steps or
    epochs) or the KL is a reward penalty; otherwise they are taken, detached, from the training forward, which
    is then exact. With ``kl_coef > 0`` the reference log-probabilities give the KL, as a reward penalty or a
    loss term (``cfg.use_kl_loss``).

    The reference and the critic may live elsewhere (``ray.colocate_models: false``): pass their outputs as
    ``ref_logprobs`` and ``old_values`` instead of a reference in ``policy`` and a ``critic``, read the GAE
    returns from ``outputs`` and fit the critic with :func:`fit_values` on the same windows. Both layouts give
    the same numbers: the critic's fit does not feed back into the policy's update.

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
        critic: A :class:`services.trainer.critic.ValueModel`: its values at rollout time feed GAE (unless
            ``old_values`` is given), and after the policy's epochs it is fitted to the returns with the clipped
            value loss on the same windows (:func:`fit_values`).
        critic_engine: The critic's train engine (required with ``critic``).
        ref_logprobs: (B, A) float32 reference log-probabilities computed elsewhere (a reference actor); used
            instead of ``policy.ref_logprobs`` when ``kl_coef > 0``.
        old_values: (B, A) float32 critic values at rollout time computed elsewhere (a critic actor); used
            instead of the ``critic``'s forward for GAE.
        outputs: A dict that receives ``returns`` and ``advantages``, each (B, A) float32, detached, on the
            device the advantages were computed on (the returns are the critic's regression targets).

    Returns:
        Mean statistics: ``policy_loss``, ``clip_frac``, ``approx_kl``, ``kl``, ``entropy``, ``grad_norm``,
        ``advantage_abs``, ``sample_reward``, ``response_len``, ``num_samples``, ``optimizer_steps``; with a
        critic also ``value_loss``, ``vf_clip_frac`` and ``value_mean``.

    Raises:
        FloatingPointError: the loss became NaN or infinite (the caller stops the job, keeping its checkpoint).
        InvalidArgumentError: ``ref_logprobs`` or ``old_values`` is not (B, A); ``gae`` with neither a critic
            nor ``old_values``.
    """
    B = batch.input_ids.shape[0]
    windows = update_windows(B, micro_batch_size, grad_accum_steps, ppo_epochs)
    kl_in_reward = cfg.kl_coef > 0 and not cfg.use_kl_loss
    recompute_old = len(windows) > 1 or kl_in_reward  # several optimizer steps, or KL in the reward
    old_lp = ref_lp = kl = None
    for name, given in (("ref_logprobs", ref_logprobs), ("old_values", old_values)):
        if given is not None:
            _check_rows(name, given, batch)
    with torch.no_grad():
        if recompute_old:
            old_lp = policy.logprobs(agent_id, batch.input_ids, batch.attention_mask, batch.action_mask)
        if cfg.kl_coef > 0:
            ref_lp = ref_logprobs
            if ref_lp is None:
                ref_lp = policy.ref_logprobs(
                    agent_id, batch.input_ids, batch.attention_mask, batch.action_mask
                )
        if kl_in_reward:
            kl = kl_penalty(old_lp, ref_lp, cfg.kl_estimator, batch.action_mask)
        if old_values is None and critic is not None:
            old_values = critic(batch.input_ids, batch.attention_mask, batch.action_mask.shape[1])
    adv, returns = compute_advantages(
        cfg, batch.rewards, batch.action_mask, batch.groups, values=old_values, kl=kl
    )
    if outputs is not None:
        outputs["returns"], outputs["advantages"] = returns, adv
    stats: dict[str, list[float]] = {}
    for chunks, window_size in windows:
        for idx in chunks:
            _micro_step(policy, strategy, agent_id, batch, cfg, idx, adv, old_lp, ref_lp, window_size, stats)
        result = strategy.step()
        if result.grad_norm is not None:
            stats.setdefault("grad_norm", []).append(float(result.grad_norm))
        stats.setdefault("lr", []).append(float(result.lr))
        stats.setdefault("skipped_nonfinite", []).append(float(result.skipped_nonfinite))
    out = {k: sum(v) / len(v) for k, v in stats.items() if v}
    if critic is not None:
        out.update(
            fit_values(
                critic,
                critic_engine,
                batch,
                cfg,
                old_values,
                returns,
                micro_batch_size=micro_batch_size,
                grad_accum_steps=grad_accum_steps,
                ppo_epochs=ppo_epochs,
            )
        )
    rewards = [r for r in batch.rewards if r is not None]
    out["sample_reward"] = sum(rewards) / len(rewards) if rewards else 0.0
    if kl is not None:
        out["kl"] = _stat(masked_mean(kl, batch.action_mask))
    else:
        out["kl"] = out.get("kl_loss", 0.0)
    out["advantage_abs"] = _stat(masked_mean(adv.abs(), batch.action_mask))
    out["response_len"] = _stat(batch.action_mask.sum(-1).float().mean())
    out["num_samples"] = float(B)
    out["optimizer_steps"] = float(len(windows))
    return out


def fit_values(
    critic: Any,
    engine: Any,
    batch: Batch,
    cfg: AlgoConfig,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    *,
    micro_batch_size: int,
    grad_accum_steps: int | None = None,
    ppo_epochs: int = 1,
) -> dict[str, float]:
    """Fit a critic to the GAE returns: the clipped value loss on the policy update's windows.

    Walks :func:`update_windows` (same micro-batches, accumulation and epochs as :func:`update_agent`), weights
    each micro-batch's loss by its share of the window and steps ``engine`` once per window.

    Args:
        critic: A :class:`services.trainer.critic.ValueModel`.
        engine: Its train engine (``autocast()``, ``backward(loss)``, ``step()``).
        batch: The samples the policy was updated on.
        cfg: Algorithm config (``value_clip``, ``loss_agg_mode``).
        old_values: (B, A) float32 critic values at rollout time (the clipping anchor).
        returns: (B, A) float32 targets from :func:`services.trainer.algo.compute_advantages`.
        micro_batch_size: Samples per forward/backward pass.
        grad_accum_steps: Micro-batches per optimizer step; ``None`` = the whole batch in one step.
        ppo_epochs: Passes over the batch.

    Returns:
        Means over the micro-batches: ``value_loss``, ``vf_clip_frac``, ``value_mean`` (value units = reward
        units).

    Raises:
        FloatingPointError: the value loss became NaN or infinite.
        InvalidArgumentError: ``old_values`` or ``returns`` is not (B, A).
    """
    _check_rows("old_values", old_values, batch)
    _check_rows("returns", returns, batch)
    stats: dict[str, list[float]] = {}
    for chunks, window_size in update_windows(
        batch.input_ids.shape[0], micro_batch_size, grad_accum_steps, ppo_epochs
    ):
        for idx in chunks:
            mb = batch.select(idx)
            with engine.autocast():
                values = critic(mb.input_ids, mb.attention_mask, mb.action_mask.shape[1])
            loss, s = value_loss(cfg, values, old_values[idx], returns[idx], mb.action_mask)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite value loss {loss.item()}")
            engine.backward(loss * (len(idx) / window_size))
            for k, v in s.items():
                stats.setdefault("value_loss" if k == "vf_loss" else k, []).append(_stat(v))
        engine.step()
    return {k: sum(v) / len(v) for k, v in stats.items() if v}


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
