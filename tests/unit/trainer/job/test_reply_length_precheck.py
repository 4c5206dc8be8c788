"""A reply length (``max_new_tokens``) that leaves no room for a prompt in the model's context is refused by
``marti train`` before the run folder, in any job: a new user's ``--set rollout.max_new_tokens=1000000`` on
examples/tiny.yaml (an env job) started the services and Ray, cleared the run with ``--overwrite`` and failed at
the first episode (``its prompt is too long: prompt 0: 286 tokens + max_new_tokens 1000000 exceeds max_model_len
2048``)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.refused_runs import train_over_an_old_run

ROOT = Path(__file__).resolve().parents[4]


def test_a_reply_longer_than_the_models_context_is_refused_before_an_overwrite(tmp_path):
    job = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    job["rollout"]["max_new_tokens"] = 2048
    job["agents"][1]["sampling"] = {"max_new_tokens": 8}  # its own, which fits
    proc = train_over_an_old_run(tmp_path, job)
    assert (
        "marti train: agent 'agent_1' (agents[0]): rollout.max_new_tokens 2048 leaves no room for a prompt in the "
        "2048 tokens the rollout engine takes (max_position_embeddings of agents[0].pretrain_model 'tiny-llama'); "
        "lower rollout.max_new_tokens"
    ) in proc.stderr, proc.stderr
    assert "agent_2" not in proc.stderr
    assert "starting embedded broker" not in proc.stderr + proc.stdout  # nothing started
