"""Data problems a fresh user meets, refused by ``marti train`` before the run folder (so an ``--overwrite`` keeps
the previous run), each reproduced with a real dataset file: a column the reward functions cannot be passed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.refused_runs import train_over_an_old_run


def _rows_file(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _job(data: Path, **extra: Any) -> dict[str, Any]:
    """A one-agent dataset job on the tiny model (``extra``: more top-level sections)."""
    return {
        "training_name": "t",
        "num_agents": 1,
        "agents": [{"name": "solver", "pretrain_model": "tiny-llama", "role": "solver"}],
        "dataset": {"path": f"jsonl:{data}", "eval_fraction": 0.2},
        **extra,
    }


def test_a_column_named_prompts_is_refused_before_an_overwrite_with_reward_functions(tmp_path):
    """The reward call's own keyword ``prompts`` as a column was found only at the first scoring call."""
    reward = tmp_path / "my_rewards.py"
    reward.write_text(
        "def length(prompts, completions, **kw):\n    return [float(len(c)) for c in completions]\n"
    )
    rows = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i), "prompts": "x"} for i in range(10)]
    data = _rows_file(tmp_path, rows)
    proc = train_over_an_old_run(tmp_path, _job(data, reward={"functions": [f"{reward}:length"]}))
    assert f"dataset JSON file '{data}'" in proc.stderr
    assert (
        "dataset column 'prompts' collides with the keyword prompts= of the reward function call"
        in proc.stderr
    )
    assert "rename the column" in proc.stderr


def test_a_reward_function_called_directly_refuses_a_reserved_column_by_the_same_rule():
    import pytest

    from marti.errors import InvalidArgumentError
    from marti.rewards import RewardFunction

    fn = RewardFunction(lambda prompts, completions, **kw: [1.0] * len(completions))
    with pytest.raises(
        InvalidArgumentError, match=r"column 'completions' collides with the keyword completions="
    ):
        fn.score(["p"], ["c"], {"completions": ["x"]})
