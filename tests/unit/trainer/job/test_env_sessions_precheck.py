"""A job that holds more env sessions open at once than its env server takes is refused by ``marti train``
before the run folder: a new user's ``--set rollout.episodes_per_step=1000000`` on examples/tiny.yaml started the
services and Ray, cleared the run with ``--overwrite`` and failed at the first rollout with ``session cap
reached: max_sessions=1024; close sessions or raise the cap``, naming no config key. The check counts what is
really open at once (:func:`~services.trainer.job.run.env_sessions.sessions_at_once`): a step's episodes, an
evaluation's, both together when ``rollout.max_staleness`` >= 1 overlaps them, and it reads a given env
server's own cap."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from marti.config import load_config
from marti.errors import InvalidArgumentError
from services.trainer.job.run.env_sessions import check_env_sessions, sessions_at_once
from tests.refused_runs import train_over_an_old_run

ROOT = Path(__file__).resolve().parents[4]


def _tiny(*sets: str):
    """examples/tiny.yaml (4 episodes a step, 2 held-out episodes every 2 steps, 2 steps) with ``sets``."""
    return load_config(ROOT / "examples" / "tiny.yaml", list(sets))


def test_more_episodes_per_step_than_env_sessions_is_refused_before_an_overwrite(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "MARTI_ENV_MAX_SESSIONS", "8"
    )  # the embedded env server's cap, as the job would start it
    job = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    job["rollout"]["episodes_per_step"] = 10
    proc = train_over_an_old_run(tmp_path, job)
    assert (
        "marti train: the job holds up to 10 env sessions open at once (rollout.episodes_per_step 10, one step's "
        "episodes; one session per episode), but the job's own env server (max_sessions, MARTI_ENV_MAX_SESSIONS) "
        "holds at most 8; lower those keys, or give an env server with a larger max_sessions (--env)"
    ) in proc.stderr, proc.stderr
    assert "starting embedded broker" not in proc.stderr + proc.stdout  # nothing started


def test_an_evaluations_episodes_are_counted(monkeypatch):
    """10 held-out episodes (or 5 sampled twice, or 5 for each of 2 tasks) open 10 sessions, more than a step's 4."""
    monkeypatch.setenv("MARTI_ENV_MAX_SESSIONS", "8")
    check_env_sessions(_tiny("rollout.eval_episodes=8"))
    with pytest.raises(
        InvalidArgumentError, match=r"up to 10 env sessions open at once \(rollout.eval_episodes 10, one"
    ):
        check_env_sessions(_tiny("rollout.eval_episodes=10"))
    assert sessions_at_once(_tiny("rollout.eval_episodes=5", "rollout.eval_samples=2")) == (
        10, "rollout.eval_episodes 5 x rollout.eval_samples 2, one evaluation's episodes"
    )  # fmt: skip
    check_env_sessions(
        _tiny("rollout.eval_episodes=10", "rollout.eval_every=0")
    )  # no evaluation, none counted


def test_an_evaluation_overlapping_the_next_steps_rollout_counts_both(monkeypatch):
    """With max_staleness 1 the producer thread plays step t + 1's 6 episodes while the evaluation after step t
    plays its 4 (loop.py: ``producer.updated`` comes before ``_evaluate``): 10 at once. Synchronously they take
    turns (6), and an evaluation only after the last step overlaps nothing."""
    monkeypatch.setenv("MARTI_ENV_MAX_SESSIONS", "8")
    sets = ["rollout.episodes_per_step=6", "rollout.eval_episodes=4", "max_steps=4"]
    with pytest.raises(InvalidArgumentError) as refused:
        check_env_sessions(_tiny(*sets, "rollout.max_staleness=1"))
    assert str(refused.value).startswith(
        "the job holds up to 10 env sessions open at once (rollout.episodes_per_step 6 + rollout.eval_episodes 4: "
        "an evaluation runs while the next step's rollout plays (rollout.max_staleness 1); one session per "
        "episode), but the job's own env server (max_sessions, MARTI_ENV_MAX_SESSIONS) holds at most 8"
    )
    check_env_sessions(_tiny(*sets, "rollout.max_staleness=0"))
    check_env_sessions(_tiny(*sets, "rollout.max_staleness=1", "max_steps=2"))  # eval_every 2: after the last


def test_an_external_job_counts_its_evaluations_alone(monkeypatch):
    """rollout.source external plays no training episode itself; its evaluations still play the env."""
    monkeypatch.setenv("MARTI_ENV_MAX_SESSIONS", "8")
    sets = ["rollout.episodes_per_step=10", "rollout.group_size=2"]
    check_env_sessions(_tiny(*sets, "rollout.source=external"))
    with pytest.raises(InvalidArgumentError, match="rollout.episodes_per_step 10, one step's episodes"):
        check_env_sessions(_tiny(*sets, "rollout.source=mixed"))
    with pytest.raises(InvalidArgumentError, match=r"rollout.eval_episodes 9, one evaluation's episodes"):
        check_env_sessions(_tiny(*sets, "rollout.source=external", "rollout.eval_episodes=9"))


def test_a_given_env_servers_own_cap_is_read_and_refused_before_an_overwrite(tmp_path):
    """An env server given in the config (services.env; --env alike) with max_sessions 3: a step of 4 episodes
    is refused before the run folder, naming the address; the server's answer, not MARTI_ENV_MAX_SESSIONS."""
    from marti.rpc.settings import ServerSettings
    from marti.rpc.testing import serve_in_thread
    from services.env_server.servicer import env_service
    from services.env_server.settings import EnvServerSettings

    specs = lambda: [env_service(EnvServerSettings(port=0, max_sessions=3))]  # noqa: E731
    with serve_in_thread(specs, ServerSettings(port=0)) as server:
        job = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
        job["services"] = {"env": server.address}
        proc = train_over_an_old_run(tmp_path, job)
    assert (
        "marti train: the job holds up to 4 env sessions open at once (rollout.episodes_per_step 4, one step's "
        f"episodes; one session per episode), but the env server at {server.address} (--env or services.env; its "
        "max_sessions) holds at most 3"
    ) in proc.stderr, proc.stderr


def test_a_bad_env_server_setting_in_the_environment_is_one_line_before_an_overwrite(tmp_path, monkeypatch):
    """The cap is read as the job's own env server reads it: a bad MARTI_ENV_MAX_SESSIONS is refused in one line
    naming the variable and its value (it was pydantic's traceback; before the check, the env server's exit
    after the services had started and --overwrite had cleared the run)."""
    monkeypatch.setenv("MARTI_ENV_MAX_SESSIONS", "abc")
    proc = train_over_an_old_run(tmp_path, yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text()))
    assert proc.stderr.strip().splitlines() == [
        "marti train: the job's own env server: setting max_sessions (MARTI_ENV_MAX_SESSIONS) = 'abc': Input "
        "should be a valid integer, unable to parse string as an integer"
    ], proc.stderr
