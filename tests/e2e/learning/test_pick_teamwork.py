"""End to end, a learning test of teamwork: `examples/private_allocation_pick.yaml` (the `make demo` job) trains a
leader and an executor (SmolLM2-135M-Instruct, a LoRA adapter each) on private_allocation's `pick` level, where
only the leader knows the order of the values and only the executor submits.

The test runs the demo's first 3 of 12 steps (``budget.stop_after_steps``, the LR schedule spanning all 12).
Held-out task completion must rise from the untrained team's to at least :data:`AFTER` within 3 steps, and the
completed answers must come from the leader's message: at least :data:`AFTER` of the held-out episodes completed
by an executor that named exactly the leader's first task, with at least 3 different tasks picked. No fixed answer
passes: on these 12 seeds the best one (``task_2``) completes 7, and it is one pick.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "examples" / "private_allocation_pick.yaml"
pytestmark = pytest.mark.slow
#: Held-out completion the untrained team stays at or below, and the trained team must reach.
BEFORE, AFTER = 0.5, 0.75
STEPS, EPISODES = 3, 12


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(960)  # the run has its own 900 s limit (the suite's default is 600 s)
def test_the_team_learns_to_act_on_the_leaders_message(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "marti.command.main", "train", str(CONFIG), "--no-progress",
        "--set", f"output.dir={run_dir}", "--set", f"budget.stop_after_steps={STEPS}",
        "--set", f"rollout.eval_every={STEPS}", "--set", f"rollout.eval_episodes={EPISODES}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the demo's first steps: stopped by the budget, the cosine schedule spanning its 12 steps (at 3 steps of 3
    # the LR would be down to 0.16x), and the command that goes on with it
    assert f"stopped by its budget after step {STEPS} of 12" in proc.stdout, proc.stdout
    assert "resume with: marti train" in proc.stdout and "--resume" in proc.stdout, proc.stdout
    lrs = [r["metrics"]["agent_1/lr"] for r in _records(run_dir / "metrics.jsonl")]
    assert len(lrs) == STEPS and 0.9e-3 < lrs[-1] < lrs[0] <= 1e-3, lrs
    evals = {r["step"]: r["table"]["team/task_completion"] for r in _records(run_dir / "eval.jsonl")}
    assert sorted(evals) == [0, STEPS], evals
    assert evals[0] <= BEFORE and evals[STEPS] >= AFTER, evals

    last = [e for e in _records(run_dir / "eval_episodes.jsonl") if e["step"] == STEPS]
    assert len(last) == EPISODES
    followed, picks = 0, set()
    for episode in last:
        leader, executor = (t["text"] for t in episode["turns"][:2])
        named = re.findall(r"task_\d+", executor)
        first = re.search(r"task_\d+", leader.split(":", 1)[1])
        picks.update(named[:1])
        followed += bool(first and named == [first.group(0)] and episode["metrics"]["task_completion"])
    assert followed / EPISODES >= AFTER, last
    assert len(picks) >= 3, picks  # not one constant answer

    report = (run_dir / "report.md").read_text()
    said = rf"task completion on held-out seeds \(step 0 to step {STEPS}\) went from [0-9.]+ to [0-9.]+ \(rose by"
    assert re.search(said, report), report
