"""Collated batches of the shapes group RL trains on, for the training forward's tests (prefix sharing, the lean
training forward): a GRPO group batch and a chain's later agent."""

from __future__ import annotations

from services.trainer.learn.experience import Experience, collate
from tests.trainer_data import one_turn


def group_batch(pad_id: int) -> Experience:
    """Two prompts of different lengths (left padding differs), G=3 responses each of different lengths."""
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13, 14]]
    responses = [[20, 21, 22, 23], [24], [25, 26], [27, 28, 29], [30, 31, 32, 33, 34], [35]]
    samples = [one_turn(prompts[i // 3], r, 0.0, i // 3) for i, r in enumerate(responses)]
    return collate(samples, "agent_1", pad_id)


def chain_batch(pad_id: int) -> Experience:
    """A chain's later agent: two groups of 3 rows, each group one 12-token observation followed by a teammate's
    message that differs per row (3 tokens; one row's is 2, so its prompt sits one column further right), then
    responses of different lengths. No two rows repeat a whole prompt."""
    observations = [list(range(40, 52)), list(range(60, 72))]
    messages = [[80, 81, 82], [83, 84, 85], [86, 87], [88, 89, 90], [91, 92, 93], [94, 95, 96]]
    responses = [[20, 21, 22, 23], [24], [25, 26], [27, 28, 29], [30, 31, 32, 33, 34], [35]]
    samples = [
        one_turn(observations[i // 3] + m, r, 0.0, i // 3)
        for i, (m, r) in enumerate(zip(messages, responses, strict=True))
    ]
    return collate(samples, "agent_1", pad_id)
