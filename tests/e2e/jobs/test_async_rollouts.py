"""`marti train` with asynchronous rollouts: rollouts overlap updates, and no turn is staler than its agent's bound."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def _train(run: Path, sets: list[str]) -> list[dict]:
    """Run `marti train examples/tiny.yaml` into ``run`` with the ``--set`` overrides; returns each step's
    metrics."""
    cmd = [sys.executable, "-m", "marti.command.main", "train", "examples/tiny.yaml", "--no-progress"]
    cmd += [arg for s in (*sets, f"output.dir={run}") for arg in ("--set", s)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line)["metrics"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_one_step_off_policy_job_keeps_each_agents_staleness_bound(tmp_path):
    run = tmp_path / "run_async"
    sets = [
        "max_steps=4",
        "rollout.eval_every=0",
        "rollout.max_staleness=1",
        "agents.1.max_staleness=0",  # agent_2 trains only on turns of its current weights
        "environment.max_turns=2",
    ]
    records = _train(run, sets)
    assert len(records) == 4
    for m in records:
        assert m["agent_1/version_lag_max"] <= 1 and m["agent_1/stale_dropped"] == 0
        assert m["agent_2/version_lag_max"] == 0
        assert math.isfinite(m["agent_1/policy_loss"])
    # Step 1 was played before any update. Every later rollout began while the previous update ran, so its
    # first turns were sampled by the weights of one version back: trained by agent_1, dropped for agent_2.
    assert records[0]["agent_1/version_lag_max"] == 0
    assert max(m["agent_1/version_lag_max"] for m in records[1:]) == 1
    assert sum(m["agent_2/stale_dropped"] for m in records[1:]) >= 1
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000004"


def test_rollout_actors_generate_for_an_asynchronous_job(tmp_path):
    run = tmp_path / "run_rollout_actors"
    sets = [
        "max_steps=3",
        "rollout.eval_every=3",
        "rollout.eval_episodes=2",
        "rollout.max_staleness=1",
        "ray.num_rollout_workers=2",
        "ray.num_cpus_per_worker=0.5",
        "environment.max_turns=2",  # both agents act
        # The tiny random model's replies all score alike (zero advantages): an entropy bonus moves the weights
        # at every update, so turns sampled one version back really come from other weights.
        "algorithm.entropy_coef=0.01",
    ]
    records = _train(run, sets)
    assert len(records) == 3
    for m in records:
        for agent in ("agent_1", "agent_2"):
            assert m[f"{agent}/version_lag_max"] <= 1 and math.isfinite(m[f"{agent}/policy_loss"])
        assert m["system/rollout_worker_1/alive"] == 1.0  # the resource monitor watches the rollout actors
    # The correction is real: turns sampled one version back differ from the learner's weights, and the PPO
    # ratio against their carried log-probs is not identically 1 (it would be, were they recomputed).
    lagged = [(m, a) for m in records for a in ("agent_1", "agent_2") if m[f"{a}/version_lag_max"] == 1]
    assert lagged, "no update trained on turns of an older version"
    assert max(m[f"{a}/behaviour_kl"] for m, a in lagged) > 1e-6
    assert max(abs(m[f"{a}/ratio_max"] - 1.0) for m, a in lagged) > 1e-4
    assert all(m[f"{a}/behaviour_rows"] == 1.0 for m, a in lagged)
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 3]
