"""The learner's one input: an :class:`Experience` batch of one agent's turns, built by :func:`collate`.

Dimension names (used in every docstring of the learner):

- ``B``: batch rows, one per trained turn (a turn of a trajectory with a non-empty prompt and response);
- ``T``: token positions of a row, ``max prompt length + A``;
- ``A``: response (action) positions, the longest response of the batch;
- ``K``: turn-reward positions, the most turns from a row's turn to the end of its episode;
- ``G``: group size, the rows sharing one ``group_ids`` value (one problem's episodes).

Rows are laid out ``[left pad | prompt | response | right pad]``, so the responses fill the last ``A`` positions,
which is what :meth:`services.trainer.models.policy.MultiAgentPolicy.logprobs` expects. Every actor that collates the
same trajectories with the same ``pad_id`` (policy, reference, critic) gets the same rows in the same order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from marti.errors import FailedPreconditionError, InvalidArgumentError
from marti.rewards.base import check_reward
from marti.types.trajectory import Trajectory, Turn


@dataclass(frozen=True)
class Experience:
    """One agent's batch of turns to learn from (OpenRLHF's ``Experience``, one row per turn).

    Attributes:
        agent_id: The agent whose policy learns from these rows (the owner of the table they were taken from).
        input_ids: ``(B, T)`` int64 token ids, prompts left-padded and responses right-padded with ``pad_id``.
        attention_mask: ``(B, T)`` int64, 1 on prompt and response tokens, 0 on padding.
        action_mask: ``(B, A)`` bool, True on the response tokens the loss trains on (the turn's
            ``response_mask``; every response token when it is empty), False on padding.
        behaviour_logprobs: ``(B, A)`` float32 log-probabilities of the response tokens under the weights that
            sampled them (the turn's ``response_logprobs``), 0 where absent or padded.
        has_behaviour: ``(B,)`` bool, True for rows whose turn recorded behaviour log-probabilities.
        rewards: ``(B,)`` float64 reward of each row: the episode's credited return
            (:attr:`marti.types.trajectory.Trajectory.outcome_reward`, the same on every turn of a trajectory), or,
            when ``credited``, the row's credited reward already normalised (:func:`normalize_credit`). Every
            row is scored: a trajectory always has an outcome.
        group_ids: ``(B,)`` int64 group of each row, numbered 0, 1, ... by first appearance of the trajectories'
            ``group_id`` (a trajectory without one is a group of its own); group estimators compare the ``G``
            rows of one group.
        turn_ids: ``(B,)`` int64 index of the row's turn among its trajectory's turns (skipped turns keep their
            number), for ``group_by="agent_turn"``.
        turn_rewards: ``(B, K)`` float64 the env's rewards of the row's turn and of the later turns of its
            episode, in turn order (0 where the env set none, and 0-padded on the right), for
            ``turn_rewards="dense"``.
        has_turn_rewards: ``(B,)`` bool, True for rows whose episode has at least one per-turn reward (the others
            are credited with their outcome under ``dense``).
        credited: True when ``rewards`` already are the credited rewards (then used as they are).
        ref_logprobs: ``(B, A)`` float32 reference log-probabilities computed by a reference actor, or None (the
            policy's own reference is used when the KL needs it).
        old_values: ``(B, A)`` float32 critic values at rollout time computed by a critic actor, or None (the
            colocated critic's forward, for GAE).
    """

    agent_id: str
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    has_behaviour: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    turn_ids: torch.Tensor
    turn_rewards: torch.Tensor
    has_turn_rewards: torch.Tensor
    credited: bool = False
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        """B, the number of rows."""
        return int(self.input_ids.shape[0])

    def select(self, idx: torch.Tensor) -> Experience:
        """Rows ``idx`` (``(b,)`` int64 row indices) of every tensor: a micro-batch."""
        rows = {
            f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[idx]
            for f in dataclasses.fields(self)
            if f.name not in ("agent_id", "credited")
        }
        return dataclasses.replace(self, **rows)

    def to(self, device: str | torch.device) -> Experience:
        """This batch with every tensor on ``device`` (the learner's: its forward returns tensors there, and the
        advantages, losses and masks must meet them on one device)."""
        moved = {
            f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if f.name not in ("agent_id", "credited")
        }
        return dataclasses.replace(self, **moved)

    def attach(
        self, *, ref_logprobs: torch.Tensor | None = None, old_values: torch.Tensor | None = None
    ) -> Experience:
        """This batch with the reference log-probabilities and/or critic values another actor computed.

        Args:
            ref_logprobs: ``(B, A)`` float32, or None to keep the current field.
            old_values: ``(B, A)`` float32, or None to keep the current field.

        Raises:
            InvalidArgumentError: a tensor is not ``(B, A)`` like ``action_mask`` (its name and shape given).
        """
        given = {"ref_logprobs": ref_logprobs, "old_values": old_values}
        for name, x in given.items():
            if x is not None:
                check_rows(name, x, self.action_mask)
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})


def check_rows(name: str, x: torch.Tensor, action_mask: torch.Tensor) -> None:
    """Raise InvalidArgumentError naming ``name`` unless ``x`` is ``(B, A)`` like ``action_mask``."""
    if tuple(x.shape) != tuple(action_mask.shape):
        raise InvalidArgumentError(
            f"{name} must be (B, A) = {tuple(action_mask.shape)} like the batch, got {tuple(x.shape)}"
        )


def trained_turns(traj: Trajectory) -> list[tuple[int, Turn]]:
    """The turns of ``traj`` that become rows, with their index: those with a non-empty prompt and response."""
    return [(i, t) for i, t in enumerate(traj.turns) if t.response_token_ids and t.prompt_token_ids]


def group_key(traj: Trajectory) -> str:
    """The group ``traj`` is compared in: its ``group_id``, else a group of its own (``episode:<episode_id>``)."""
    return traj.group_id or f"episode:{traj.episode_id}"


def row_count(traj: Trajectory) -> int:
    """The rows ``traj`` gives a batch: its turns with a non-empty prompt and response."""
    return len(trained_turns(traj))


def trained_tokens(trajectories: Sequence[Trajectory]) -> int:
    """Response tokens of the rows of ``trajectories`` (the batch's trained turns, masked tokens included)."""
    return sum(len(t.response_token_ids) for traj in trajectories for _, t in trained_turns(traj))


def _check_turn(traj: Trajectory, i: int, turn: Turn) -> None:
    for name in ("response_logprobs", "response_mask"):
        n, a = len(getattr(turn, name)), len(turn.response_token_ids)
        if n not in (0, a):
            raise InvalidArgumentError(
                f"trajectory {traj.episode_id!r} turn {i}: {name} has {n} values for {a} response tokens"
            )


def _check_rewards(traj: Trajectory, agent_id: str) -> None:
    """Refuse a trajectory whose credited return or a turn's reward is not finite or is beyond
    :data:`marti.rewards.base.MAX_ABS_REWARD` (a sum of turn rewards can overflow to +-inf
    even when each is finite), naming the agent, the episode and the value."""
    where = f"agent {agent_id!r}, episode {traj.episode_id!r}"
    for i, turn in enumerate(traj.turns):
        if turn.reward is not None:
            check_reward(float(turn.reward), f"{where}, turn {i}")
    check_reward(traj.outcome_reward, f"{where} (its return)")


def collate(trajectories: Sequence[Trajectory], agent_id: str, pad_id: int) -> Experience:
    """The :class:`Experience` of one agent's trajectories: one row per trained turn, in trajectory then turn
    order (turns with an empty prompt or response are skipped: nothing to train).

    Args:
        trajectories: The agent's trajectories as taken from its table.
        agent_id: The agent whose policy learns from them.
        pad_id: Token id the rows are padded with (masked out everywhere; see
            :func:`services.trainer.learn.learner.pad_id_of`).

    Returns:
        The batch, shapes as documented on :class:`Experience`.

    Raises:
        FailedPreconditionError: the trajectories hold no turn with both a prompt and a response.
        InvalidArgumentError: a turn's ``response_logprobs`` or ``response_mask`` is neither empty nor as long as
            its response (the episode and turn are named), or a reward or return is not finite or is beyond
            +-1e20 (:func:`marti.rewards.base.check_reward`; the agent, episode and value are named).
    """
    rows = [(traj, i, turn) for traj in trajectories for i, turn in trained_turns(traj)]
    if not rows:
        raise FailedPreconditionError(
            f"cannot build a batch from {len(trajectories)} trajectories without a turn that has a prompt and a "
            "response"
        )
    for traj, i, turn in rows:
        _check_turn(traj, i, turn)
    for traj in trajectories:
        _check_rewards(traj, agent_id)
    p_len = max(len(t.prompt_token_ids) for _, _, t in rows)
    a_len = max(len(t.response_token_ids) for _, _, t in rows)
    k_len = max(len(traj.turns) - i for traj, i, _ in rows)
    B, T = len(rows), p_len + a_len
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention = torch.zeros((B, T), dtype=torch.long)
    action = torch.zeros((B, a_len), dtype=torch.bool)
    behaviour = torch.zeros((B, a_len), dtype=torch.float32)
    turn_rewards = torch.zeros((B, k_len), dtype=torch.float64)
    for b, (traj, i, turn) in enumerate(rows):
        p, r = len(turn.prompt_token_ids), len(turn.response_token_ids)
        input_ids[b, p_len - p : p_len] = torch.tensor(turn.prompt_token_ids)
        input_ids[b, p_len : p_len + r] = torch.tensor(turn.response_token_ids)
        attention[b, p_len - p : p_len + r] = 1
        action[b, :r] = torch.tensor(turn.response_mask, dtype=torch.bool) if turn.response_mask else True
        if turn.response_logprobs:
            behaviour[b, :r] = torch.tensor(turn.response_logprobs, dtype=torch.float32)
        rest = [0.0 if t.reward is None else float(t.reward) for t in traj.turns[i:]]
        turn_rewards[b, : len(rest)] = torch.tensor(rest, dtype=torch.float64)
    groups: dict[str, int] = {}
    keys = [group_key(traj) for traj, _, _ in rows]
    return Experience(
        agent_id=agent_id,
        input_ids=input_ids,
        attention_mask=attention,
        action_mask=action,
        behaviour_logprobs=behaviour,
        has_behaviour=torch.tensor([bool(t.response_logprobs) for _, _, t in rows], dtype=torch.bool),
        rewards=torch.tensor([traj.outcome_reward for traj, _, _ in rows], dtype=torch.float64),
        group_ids=torch.tensor([groups.setdefault(k, len(groups)) for k in keys], dtype=torch.long),
        turn_ids=torch.tensor([i for _, i, _ in rows], dtype=torch.long),
        turn_rewards=turn_rewards,
        has_turn_rewards=torch.tensor(
            [any(t.reward is not None for t in traj.turns) for traj, _, _ in rows], dtype=torch.bool
        ),
    )
