"""A training turn's ``info`` (the env's scalar info entries and the policy version) is something the store
takes: a NaN or infinite float an env reports is written as None (JSON null), since the store refuses
non-finite numbers (JSON has none)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from marti.codec.experience import trajectory_from_proto, trajectory_to_proto
from marti.errors import InvalidArgumentError
from marti.types.trajectory import Trajectory, Turn
from services.trainer.rollout.episodes.runner import _turn_info


def test_non_finite_env_numbers_are_written_as_null_and_the_store_codec_takes_the_turn() -> None:
    env_info = {"score": math.nan, "ratio": -math.inf, "n": 2, "x": 0.5, "name": "t", "ok": True, "list": [1]}
    info = _turn_info(env_info, SimpleNamespace(policy_version=3))
    assert info == {
        "score": None,
        "ratio": None,
        "n": 2,
        "x": 0.5,
        "name": "t",
        "ok": True,
        "policy_version": 3,
    }
    traj = Trajectory(episode_id="e", agent_id="a", turns=[Turn(step=0, info=info)])
    assert trajectory_from_proto(trajectory_to_proto(traj)).turns[0].info == info
    raw = Trajectory(episode_id="e", agent_id="a", turns=[Turn(step=0, info={"score": math.nan})])
    with pytest.raises(InvalidArgumentError, match=r"info\['score'\] value nan"):
        trajectory_to_proto(raw)  # what the env's info would have met unchanged
