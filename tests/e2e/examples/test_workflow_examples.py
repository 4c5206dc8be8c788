"""End to end: `marti train` runs the user-defined negotiation example (custom env by import path, workflow
factory, messages over the embedded broker) and a two-task job with a curriculum and priority allocation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from services.trainer.rollout.episodes.scheduler import TaskScheduler, TaskSpec

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def _train(config: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "marti.command.main",
        "train",
        str(config),
        "--no-progress",
        "--set",
        f"output.dir={run_dir}",
    ]
    return subprocess.run(
        [*cmd, *extra], cwd=ROOT, capture_output=True, text=True, timeout=900, env=dict(os.environ)
    )


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _values(rec: dict) -> dict:
    return rec.get("metrics") or rec.get("table") or {}


def test_negotiation_example_trains_with_marti_train(tmp_path):
    run = tmp_path / "neg"
    out = _train(ROOT / "examples/workflows/negotiation/negotiation.yaml", run)
    assert out.returncode == 0, out.stderr[-3000:]
    recs = [_values(r) for r in _records(run / "metrics.jsonl")]
    assert len(recs) == 2
    for r in recs:
        assert {"seller/reward", "buyer/reward", "team/reward"} <= set(r)
        assert "buyer/policy_version" in r and "seller/policy_version" in r
        assert r["team/messages"] > 0  # replies travelled through comm_broker
    assert (run / "report.md").exists()


def test_two_task_job_reports_per_task_metrics_curriculum_and_allocation(tmp_path):
    cfg = yaml.safe_load((ROOT / "examples/tiny.yaml").read_text())
    cfg["environment"]["max_turns"] = 2
    cfg["max_steps"] = 2
    cfg["tasks"] = [
        {"name": "alloc", "scenario": "resource_allocation", "weight": 1.0},
        {
            "name": "quiz",
            "scenario": "debate",
            "options": {"roles": ["solver", "aggregator"], "debate_rounds": 1},
        },
    ]
    # Every episode counts as a success, so each task's level rises once its 2-episode window is full.
    cfg["curriculum"] = {"enabled": True, "window": 2, "threshold": 0.5, "success_value": -1000.0}
    cfg["allocation"] = {"enabled": True, "min_share": 0.2}
    path = tmp_path / "multi.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = tmp_path / "multi"
    out = _train(path, run)
    assert out.returncode == 0, out.stderr[-3000:]
    recs = [_values(r) for r in _records(run / "metrics.jsonl")]
    assert len(recs) == 2
    sched = TaskScheduler([TaskSpec("alloc"), TaskSpec("quiz")], seed=cfg["seed"])
    groups = {"alloc": 0, "quiz": 0}
    for step, r in enumerate(recs):
        drawn = sched.assign(step, 4, 2)  # tiny.yaml: 4 episodes per step in groups of 2
        for task in ("alloc", "quiz"):
            n = drawn.count(task)
            assert r.get(f"task/{task}/episodes", 0.0) == n
            if n:
                assert f"task/{task}/team/reward" in r
            groups[task] += 1 if n else 0
            # window 2, all successes: each step that plays a task moves it up one level (at most one level
            # per step; top: hard = 2)
            assert r[f"task/{task}/difficulty_level"] == min(2, groups[task])
        for agent in ("agent_1", "agent_2"):
            assert r[f"alloc/{agent}"] >= 0.2 - 1e-9
            assert r[f"alloc/{agent}/samples"] >= 1
        assert abs(r["alloc/agent_1"] + r["alloc/agent_2"] - 1.0) < 1e-9
    evals = [_values(e) for e in _records(run / "eval.jsonl")]
    assert evals and all(e["task/alloc/episodes"] == 2 and e["task/quiz/episodes"] == 2 for e in evals)
    report = (run / "report.md").read_text()
    assert "task/alloc/" in report and "alloc/agent_1" in report


@pytest.mark.parametrize(
    ("name", "untrained"),
    [("chain", "agent_3"), ("debate", "agent_3")],  # chain: frozen evaluator; debate: scripted solver
)
def test_chain_and_debate_examples_train_with_marti_train(tmp_path, name, untrained):
    run = tmp_path / name
    out = _train(ROOT / f"examples/workflows/{name}/{name}.yaml", run)
    assert out.returncode == 0, out.stderr[-3000:]
    recs = [_values(r) for r in _records(run / "metrics.jsonl")]
    assert len(recs) == 2
    cfg = yaml.safe_load((ROOT / f"examples/workflows/{name}/{name}.yaml").read_text())
    for step, r in enumerate(recs, start=1):
        assert f"{untrained}/reward" in r and f"{untrained}/policy_version" not in r
        for a in cfg["agents"]:
            if a.get("is_tuning", True):
                assert r[f"{a['name']}/policy_version"] == step
