"""Shared helpers of the store unit tests."""

from __future__ import annotations

import math

from marti.types.trajectory import Trajectory, Turn, summarize
from services.experience_store.core.table_records import NewItem


def make_traj(agent="a1", episode="ep1", steps=(0,), version=0, role="r", created_at=0.0) -> Trajectory:
    """A small valid trajectory."""
    turns = [Turn(step=s, prompt_token_ids=[1], response_token_ids=[2, 3], response_logprobs=[-1.0, -2.0],
                  reward=1.0) for s in steps]  # fmt: skip
    return Trajectory(episode, agent, role=role, policy_version=version, turns=turns, created_at=created_at)


def item(priority=1.0, nbytes=10, **kw) -> NewItem:
    """A NewItem with an opaque payload of ``nbytes`` bytes."""
    return NewItem(b"x" * nbytes, summarize(make_traj(**kw)), priority)


def chi2_critical(dof: int, z: float = 3.29) -> float:
    """Upper chi-square quantile by Wilson-Hilferty (z=3.29 -> p=0.9995)."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2(observed: list[int], expected: list[float]) -> float:
    """Pearson's chi-square statistic."""
    return sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
