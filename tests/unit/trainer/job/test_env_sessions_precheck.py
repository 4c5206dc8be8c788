"""A step of more episodes than the job's own env server takes sessions is refused by ``marti train`` before the
run folder: a new user's ``--set rollout.episodes_per_step=1000000`` on examples/tiny.yaml started the services
and Ray, cleared the run with ``--overwrite`` and failed at the first rollout with ``session cap reached:
max_sessions=1024; close sessions or raise the cap``, naming no config key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from marti.errors import InvalidArgumentError
from tests.refused_runs import train_over_an_old_run

ROOT = Path(__file__).resolve().parents[4]


def test_more_episodes_per_step_than_env_sessions_is_refused_before_an_overwrite(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "MARTI_ENV_MAX_SESSIONS", "8"
    )  # the embedded env server's cap, as the job would start it
    job = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    job["rollout"]["episodes_per_step"] = 10
    proc = train_over_an_old_run(tmp_path, job)
    assert (
        "marti train: rollout.episodes_per_step is 10, but a step plays its episodes at once, one env session "
        "each, and the job's own env server holds at most 8 sessions (max_sessions, MARTI_ENV_MAX_SESSIONS); lower "
        "rollout.episodes_per_step, or give an env server with a larger max_sessions (--env)"
    ) in proc.stderr, proc.stderr
    assert "starting embedded broker" not in proc.stderr + proc.stdout  # nothing started


def test_an_external_job_plays_no_training_episode_so_its_episodes_per_step_is_not_capped(monkeypatch):
    from marti.config import load_config
    from services.trainer.job.run.prechecks import check_env_sessions

    monkeypatch.setenv("MARTI_ENV_MAX_SESSIONS", "8")
    sets = ["rollout.episodes_per_step=10", "rollout.group_size=2"]
    check_env_sessions(load_config(ROOT / "examples" / "tiny.yaml", [*sets, "rollout.source=external"]))
    with pytest.raises(InvalidArgumentError, match="rollout.episodes_per_step is 10"):
        check_env_sessions(load_config(ROOT / "examples" / "tiny.yaml", [*sets, "rollout.source=mixed"]))
